"""Produce and fetch with single raw requests, to aim at one agent exactly."""

from __future__ import annotations

import socket
import time
from typing import Any

from kio.index import load_request_schema

from broker.entities import build
from protocol.framing import ClientConnection
from protocol.records import build_batch, iter_batches, iter_records


def roundtrip(port: int, request: Any, timeout: float = 30.0) -> Any:
    conn = ClientConnection(client_id="rawclient")
    _cid, data = conn.send_request(request)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            conn.receive_data(chunk)
            response = conn.next_response()
            if response is not None:
                return response.body


def ensure_topic(port: int, topic: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        md = roundtrip(
            port,
            build(
                load_request_schema(3, 9),
                {
                    "topics": [{"name": topic}],
                    "allow_auto_topic_creation": True,
                    "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False,
                },
            ),
        )
        if md.topics[0].error_code == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(topic)


def produce_raw(
    port: int, topic: str, partition: int, records: list[tuple[bytes | None, bytes | None]]
) -> int:
    """One Produce v9 request, acks=all; returns the base offset (asserts no error)."""
    ensure_topic(port, topic)
    now = int(time.time() * 1000)
    answer = produce_batch(
        port, topic, partition, build_batch([(k, v, [], now) for k, v in records])
    )
    assert answer.error_code == 0, answer
    return int(answer.base_offset)


def produce_batch(port: int, topic: str, partition: int, batch: bytes) -> Any:
    """One Produce v9 request of one batch, acks=all; the partition's answer."""
    request = build(
        load_request_schema(0, 9),
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        },
    )
    return roundtrip(port, request).responses[0].partition_responses[0]


def fetch_raw(
    port: int,
    topic: str,
    partition: int,
    *,
    offset: int,
    max_wait_ms: int = 500,
    partition_max_bytes: int = 10 << 20,
) -> list[tuple[int, bytes | None]]:
    """One Fetch v12 request; returns (offset, value) of the records from `offset` on."""
    request = build(
        load_request_schema(1, 12),
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 50 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": partition_max_bytes,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    response = roundtrip(port, request, timeout=max_wait_ms / 1000 + 30)
    part = response.responses[0].partitions[0]
    assert part.error_code == 0, part
    out = []
    for view in iter_batches(part.records or b""):
        for record in iter_records(view):
            o = view.base_offset + record.offset_delta
            if o >= offset:
                out.append((o, record.value))
    return out
