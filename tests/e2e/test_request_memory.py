"""Memory held by requests being received is bounded across all connections.

Clients that send most of a huge frame and then stall must not grow an agent without
bound: past `--queued-max-request-bytes` the agent stops reading from sockets until
memory frees (Kafka's `queued.max.request.bytes`), and a frame that could never fit is
refused at its size prefix.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.e2e.wire import WireClient, metadata
from tests.support.brokerproc import BrokerProcess

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

MIB = 1024 * 1024
FRAME = 100 * MIB  # Kafka's and the agent's default largest request
SENT = 60 * MIB  # of it, before the client stalls
CLIENTS = 6


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _send_until_stalled(sock: socket.socket, data: memoryview, timeout: float) -> int:
    """Send as much of data as the agent takes within timeout seconds; bytes sent."""
    sock.settimeout(timeout)
    sent = 0
    try:
        while sent < len(data):
            sent += sock.send(data[sent : sent + MIB])
    except TimeoutError:
        pass
    return sent


def _stats(broker: BrokerProcess) -> dict:
    path = Path(broker.data_dir) / f"stats-{broker.port}.json"
    return json.loads(path.read_text())


def test_stalled_huge_frames_are_held_within_the_request_memory(start_broker) -> None:
    broker = start_broker()
    assert broker.proc is not None
    with WireClient(broker.bootstrap) as client:
        assert metadata(client, None).brokers
    before = _rss(broker.proc.pid)
    body = memoryview(struct.pack(">i", FRAME) + b"\0" * SENT)
    socks = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(CLIENTS)]
    try:
        taken = [_send_until_stalled(sock, body, timeout=1.0) for sock in socks]
        time.sleep(0.5)
        grown = _rss(broker.proc.pid) - before
        # Two frames fit the default 256 MiB; the others were left in their sockets.
        assert sum(t >= SENT for t in taken) == 2, taken
        assert grown < 2 * SENT + 40 * MIB, f"RSS grew by {grown / MIB:.0f} MiB"
        time.sleep(1.2)  # the stats file is written each second
        memory = _stats(broker)["request_memory"]
        assert memory["in_use"] == 2 * FRAME
        assert memory["reads_paused"] >= CLIENTS - 2
    finally:
        for sock in socks:
            sock.close()
    # Everything is released when the clients go, and the agent serves on.
    deadline = time.monotonic() + 10
    while _stats(broker)["request_memory"]["in_use"] != 0:
        assert time.monotonic() < deadline, _stats(broker)["request_memory"]
        time.sleep(0.2)
    with WireClient(broker.bootstrap) as client:
        assert metadata(client, None).brokers


def test_a_frame_larger_than_the_request_memory_is_refused_at_its_prefix(
    start_broker,
) -> None:
    broker = start_broker(extra_args=["--queued-max-request-bytes", str(4 * MIB)])
    with WireClient(broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 4 * MIB + 1))
        assert client.wait_closed()
    with WireClient(broker.bootstrap) as client:
        assert metadata(client, None).brokers


def test_a_frame_that_stops_arriving_gives_its_memory_up_to_those_waiting(start_broker) -> None:
    from kio.index import load_request_schema

    from broker.entities import build
    from tests.e2e.rawclient import roundtrip

    api_versions = build(
        load_request_schema(18, 3),
        {"client_software_name": "tests", "client_software_version": "0"},
    )
    pool = 2 * MIB
    broker = start_broker(extra_args=["--queued-max-request-bytes", str(pool)])
    with socket.create_connection(("127.0.0.1", broker.port)) as stalled:
        # A size prefix taking the whole request memory, a few bytes, then nothing.
        stalled.sendall(struct.pack(">i", pool) + b"\0" * 10)
        time.sleep(0.5)
        # Another client's small request waits for memory: the stalled frame gives it up
        # (its connection closed) a few seconds later, and the request is answered.
        started = time.monotonic()
        assert roundtrip(broker.port, api_versions, timeout=20).error_code == 0
        assert time.monotonic() - started < 15
        stalled.settimeout(5)
        assert stalled.recv(1) == b"", "the stalled connection is closed"
