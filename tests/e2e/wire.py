"""A tiny blocking Kafka client for end-to-end tests that need exact wire control.

`WireClient` opens one TCP connection, sends kio request entities (or raw bytes) and
returns decoded kio response entities, matched by correlation id. Every wait has a
timeout; a connection the broker closed raises `ConnectionClosed`, and
`wait_closed()` tells whether the broker closed it.

`build(cls, data)` turns nested dicts/lists into kio entities of any API version, so a
test writes requests once as plain data: ints for timedelta fields, bytes or
`uuid.UUID` for uuids.
"""

from __future__ import annotations

import select
import socket
import struct
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from broker import entities
from protocol.framing import ClientConnection

DEFAULT_TIMEOUT = 10.0


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset) before answering."""


class ResponseTimeout(Exception):
    """No answer arrived within the timeout."""


# -- building kio entities from plain data ------------------------------------------


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Build the kio entity `cls` from a dict; unknown keys are an error."""
    return entities.build(cls, data, strict=True)


def request(api_key: int, version: int, **data: Any) -> Any:
    """A kio request entity: `request(3, 12, topics=[...], ...)`."""
    return build(load_request_schema(api_key, version), data)


def raw_frame(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: bytes = b"",
    *,
    client_id: str | None = "wire",
    flexible_header: bool = False,
) -> bytes:
    """A size-prefixed request frame built by hand (header v1, or v2 if flexible)."""
    header = struct.pack(">hhi", api_key, api_version, correlation_id)
    if client_id is None:
        header += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        header += struct.pack(">h", len(raw)) + raw
    if flexible_header:
        header += b"\x00"  # no tagged fields
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


# -- the connection -------------------------------------------------------------------


class WireClient:
    """One blocking connection to a broker; use as a context manager."""

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        client_id: str | None = "wire-tests",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host, int(port))
        self.address = address
        self.timeout = timeout
        self._conn = ClientConnection(client_id=client_id)
        self._sock: socket.socket | None = socket.create_connection(address, timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._answers: dict[int, Any] = {}
        self._closed = False

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def sock(self) -> socket.socket:
        if self._sock is None:
            raise RuntimeError("the client is closed")
        return self._sock

    # sending

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (no framing added)."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as error:
            self._closed = True
            raise ConnectionClosed(str(error)) from error

    def encode(self, entity: Any) -> tuple[int, bytes]:
        """A request's correlation id and frame, for send_raw (several frames in one
        write); its answer is then awaited with `receive` as for `send`."""
        return self._conn.send_request(entity)

    def send(self, entity: Any) -> int:
        """Send a request entity without waiting; returns its correlation id."""
        correlation_id, data = self.encode(entity)
        self.send_raw(data)
        return correlation_id

    # receiving

    def _read_some(self, deadline: float) -> bool:
        """Read what arrives before the deadline; False on timeout. Raises on EOF."""
        if self._closed:
            raise ConnectionClosed("the broker closed the connection")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([self.sock], [], [], remaining)
        if not ready:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except (ConnectionResetError, ConnectionAbortedError) as error:
            self._closed = True
            raise ConnectionClosed(str(error)) from error
        if not chunk:
            self._closed = True
            raise ConnectionClosed("the broker closed the connection")
        self._conn.receive_data(chunk)
        while (response := self._conn.next_response()) is not None:
            self._answers[response.correlation_id] = response.body
        return True

    def receive(self, correlation_id: int, timeout: float | None = None) -> Any:
        """The decoded response body for `correlation_id`."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while correlation_id not in self._answers:
            if not self._read_some(deadline):
                raise ResponseTimeout(f"no answer to correlation id {correlation_id}")
        return self._answers.pop(correlation_id)

    def call(self, entity: Any, timeout: float | None = None) -> Any:
        """Send one request and wait for its response body."""
        return self.receive(self.send(entity), timeout)

    def read_frame(self, timeout: float | None = None) -> bytes:
        """The next raw response frame (no size prefix), for hand-built requests."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        buffer = b""
        while True:
            if len(buffer) >= 4:
                (size,) = struct.unpack_from(">i", buffer)
                if len(buffer) >= 4 + size:
                    return buffer[4 : 4 + size]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResponseTimeout("no complete frame arrived")
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, ConnectionAbortedError) as error:
                raise ConnectionClosed(str(error)) from error
            if not chunk:
                raise ConnectionClosed("the broker closed the connection")
            buffer += chunk

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once the broker has closed the connection; False if it is still open
        after `timeout` seconds. Anything the broker sends meanwhile is dropped."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                return False
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, ConnectionAbortedError):
                return True
            if not chunk:
                return True


# -- a few requests most tests need -----------------------------------------------------


def api_versions(client: WireClient) -> dict[int, tuple[int, int]]:
    """{api key: (min, max)} as the broker advertises them (ApiVersions v3)."""
    answer = client.call(request(18, 3, client_software_name="wire", client_software_version="1"))
    assert answer.error_code == ErrorCode.none, answer
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}


def metadata(
    client: WireClient, topics: list[str] | None, *, allow_auto: bool = True, version: int = 12
) -> Any:
    """A Metadata request for `topics` (None: all topics)."""
    wanted = None if topics is None else [{"name": t, "topic_id": None} for t in topics]
    if version < 10 and wanted is not None:
        wanted = [{"name": t} for t in topics or []]
    fields: dict[str, Any] = {"topics": wanted, "allow_auto_topic_creation": allow_auto}
    if version >= 8:
        fields["include_topic_authorized_operations"] = False
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = False
    return client.call(request(3, version, **fields))


def produce(
    client: WireClient,
    data: Mapping[str, Mapping[int, bytes | None]],
    *,
    acks: int = -1,
    version: int = 9,
    transactional_id: str | None = None,
    timeout_ms: int = 30_000,
) -> dict[tuple[str, int], Any]:
    """One Produce request; returns {(topic, partition): partition response}."""
    fields: dict[str, Any] = {
        "acks": acks,
        "timeout": timeout_ms,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [{"index": p, "records": r} for p, r in parts.items()],
            }
            for topic, parts in data.items()
        ],
    }
    if version >= 3:
        fields["transactional_id"] = transactional_id
    answer = client.call(request(0, version, **fields))
    out = {}
    for topic in answer.responses:
        for part in topic.partition_responses:
            out[topic.name, int(part.index)] = part
    return out


def fetch(
    client: WireClient,
    topic: str | uuid.UUID,
    partition: int,
    offset: int,
    *,
    version: int = 12,
    max_bytes: int = 16 * 1024 * 1024,
    max_wait_ms: int = 0,
) -> Any:
    """One sessionless Fetch for one partition; returns that partition's data.

    Versions 13+ name the topic by id: pass its `uuid.UUID`.
    """
    part = {
        "partition": partition,
        "fetch_offset": offset,
        "partition_max_bytes": max_bytes,
        "log_start_offset": -1,
    }
    if version >= 9:
        part["current_leader_epoch"] = -1
    topic_key = "topic_id" if version >= 13 else "topic"
    fields: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": 0,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "topics": [{topic_key: topic, "partitions": [part]}],
    }
    if version >= 7:
        fields.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
    if version >= 11:
        fields["rack_id"] = ""
    if version >= 15:
        del fields["replica_id"]
    answer = client.call(request(1, version, **fields))
    assert answer.error_code == ErrorCode.none, answer
    (topic_answer,) = answer.responses
    (partition_answer,) = topic_answer.partitions
    return partition_answer


def list_offsets(
    client: WireClient,
    topic: str,
    timestamps: Mapping[int, int],
    *,
    version: int,
    isolation_level: int = 0,
) -> dict[int, Any]:
    """One ListOffsets request: {partition: timestamp} -> {partition: partition answer}."""
    parts = [{"partition_index": p, "timestamp": ts} for p, ts in timestamps.items()]
    if version >= 4:
        for part in parts:
            part["current_leader_epoch"] = -1
    fields: dict[str, Any] = {"replica_id": -1, "topics": [{"name": topic, "partitions": parts}]}
    if version >= 2:
        fields["isolation_level"] = isolation_level
    if version >= 10:
        fields["timeout"] = 0
    answer = client.call(request(2, version, **fields))
    (topic_answer,) = answer.topics
    return {int(p.partition_index): p for p in topic_answer.partitions}


def init_producer_id(client: WireClient, transactional_id: str | None = None) -> Any:
    """InitProducerId v4 for a new producer (idempotent, or with `transactional_id`)."""
    return client.call(
        request(
            22,
            4,
            transactional_id=transactional_id,
            transaction_timeout=60_000,
            producer_id=-1,
            producer_epoch=-1,
        )
    )
