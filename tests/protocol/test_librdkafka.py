"""librdkafka (confluent-kafka) against a minimal in-test broker built on protocol/.

The broker answers only ApiVersions, Metadata v12 and Produce v9 on a loopback
socket. This checks framing, headers and the codec against a real client, and
collects real record batches written by librdkafka with every codec it has
(its snappy is a raw block, not xerial framing).
"""

from __future__ import annotations

import datetime
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.produce.v9 import response as produce_v9

from protocol.codec import UnsupportedVersion, decode_request, encode_response, response_schema
from protocol.compression import Compression
from protocol.framing import ProtocolError, ServerConnection
from protocol.records import RecordBatchError, iter_records, validate_produce_records

confluent_kafka = pytest.importorskip("confluent_kafka")

ZERO = datetime.timedelta(0)
TOPIC = "librdkafka-batches"
TOPIC_ID = uuid.uuid4()
# librdkafka infers features from advertised APIs: magic 2 batches need Fetch
# v4+, lz4 needs FindCoordinator, zstd needs Fetch v10+. Those two are
# advertised though a producer never sends them.
SUPPORTED = {18: (0, 3), 3: (12, 12), 0: (9, 9), 1: (4, 12), 10: (0, 4)}


@dataclass
class MiniBroker:
    """Just enough of a broker for a producer: one thread per connection."""

    listener: socket.socket
    supported: dict[int, tuple[int, int]]
    batches: list[bytes] = field(default_factory=list)
    refused: list[ErrorCode] = field(default_factory=list)
    api_versions_seen: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self.connection, args=(sock,), daemon=True).start()

    def connection(self, sock: socket.socket) -> None:
        connection = ServerConnection()
        sock.settimeout(0.2)
        with sock:
            while not self.stopping.is_set():
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                connection.receive_data(chunk)
                try:
                    while (frame := connection.next_frame()) is not None:
                        sock.sendall(self.answer(frame))
                except (ProtocolError, AssertionError) as error:
                    self.errors.append(error)
                    return

    def answer(self, frame: bytes) -> bytes:
        try:
            request = decode_request(frame)
        except UnsupportedVersion as error:
            assert error.api_key == 18, error
            self.api_versions_seen.append(error.api_version)
            return self.unsupported_api_versions(error.correlation_id)
        header, body = request.header, request.body
        low, high = self.supported[header.api_key]
        if header.api_key == 18:
            self.api_versions_seen.append(header.api_version)
            if header.api_version > high:
                return self.unsupported_api_versions(header.correlation_id)
            return encode_response(
                header.correlation_id, api_versions(header.api_version, self.supported)
            )
        assert low <= header.api_version <= high, header
        if header.api_key == 3:
            return encode_response(header.correlation_id, metadata(self.port))
        return encode_response(header.correlation_id, self.produce(body))

    def unsupported_api_versions(self, correlation_id: int) -> bytes:
        # As Kafka does: a v0 answer naming our ApiVersions range.
        low, high = self.supported[18]
        return encode_response(
            correlation_id,
            ApiVersionsResponseV0(
                error_code=ErrorCode.unsupported_version,
                api_keys=(ApiVersionV0(api_key=18, min_version=low, max_version=high),),
            ),
        )

    def produce(self, body: Any) -> produce_v9.ProduceResponse:
        topics = []
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                try:
                    validate_produce_records(data.records, 9, max_batch_bytes=1 << 20)
                except RecordBatchError as error:
                    self.refused.append(error.error_code)
                    code, base_offset = error.error_code, -1
                else:
                    self.batches.append(bytes(data.records))
                    code, base_offset = ErrorCode.none, len(self.batches) * 1000
                partitions.append(
                    produce_v9.PartitionProduceResponse(
                        index=data.index,
                        error_code=code,
                        base_offset=base_offset,
                        record_errors=(),
                    )
                )
            topics.append(
                produce_v9.TopicProduceResponse(
                    name=topic.name, partition_responses=tuple(partitions)
                )
            )
        return produce_v9.ProduceResponse(responses=tuple(topics), throttle_time=ZERO)


def api_versions(version: int, supported: dict[int, tuple[int, int]]) -> Any:
    module_response = response_schema(18, version)
    assert module_response is not None
    module = __import__(module_response.__module__, fromlist=["ApiVersion"])
    keys = tuple(
        module.ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(supported.items())
    )
    extra: dict[str, Any] = {} if version == 0 else {"throttle_time": ZERO}
    return module_response(error_code=ErrorCode.none, api_keys=keys, **extra)  # type: ignore[call-arg]


def metadata(port: int) -> metadata_v12.MetadataResponse:
    return metadata_v12.MetadataResponse(
        throttle_time=ZERO,
        brokers=(metadata_v12.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=port),),
        cluster_id="protocol-tests",
        controller_id=1,
        topics=(
            metadata_v12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=TOPIC,
                topic_id=TOPIC_ID,
                partitions=(
                    metadata_v12.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=0,
                        leader_id=1,
                        leader_epoch=0,
                        replica_nodes=(1,),
                        isr_nodes=(1,),
                        offline_replicas=(),
                    ),
                ),
            ),
        ),
    )


@contextmanager
def running(supported: dict[int, tuple[int, int]]) -> Iterator[MiniBroker]:
    listener = socket.create_server(("127.0.0.1", 0))
    mini = MiniBroker(listener, supported)
    thread = threading.Thread(target=mini.serve, daemon=True)
    thread.start()
    try:
        yield mini
    finally:
        mini.stopping.set()
        listener.close()
        thread.join(timeout=5)


@pytest.fixture
def broker() -> Iterator[MiniBroker]:
    with running(SUPPORTED) as mini:
        yield mini


def producer_for(broker: MiniBroker, codec: str) -> Any:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{broker.port}",
            "compression.type": codec,
            "linger.ms": 50,
            "acks": "all",
            "enable.idempotence": False,
            "message.timeout.ms": 5000,
            "socket.timeout.ms": 2000,
        }
    )


T0 = 1_700_000_000_000
# Compressible values: librdkafka sends a batch uncompressed when that is smaller.
MESSAGES = [
    (b"key-0", b"value-0 " * 200, [("trace", b"abc")], T0 + 20),
    (None, b"value-1 " * 300, [], T0),
    (b"key-2", None, [("h1", b"x"), ("h2", b"")], T0 + 40),
]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_produces_batches_we_validate(broker: MiniBroker, codec: str) -> None:
    producer = producer_for(broker, codec)
    delivered: list[tuple[Any, Any]] = []
    for key, value, headers, timestamp in MESSAGES:
        producer.produce(
            TOPIC,
            key=key,
            value=value,
            headers=headers,
            timestamp=timestamp,
            partition=0,
            on_delivery=lambda error, message: delivered.append((error, message)),
        )
    assert producer.flush(10) == 0
    assert not broker.errors, broker.errors
    assert [error for error, _ in delivered] == [None, None, None]

    records = []
    for batch in broker.batches:
        view = validate_produce_records(batch, 9)
        assert view.compression == Compression[codec.upper()]
        records += list(iter_records(view))
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in records] == [
        (key, value, headers, timestamp) for key, value, headers, timestamp in MESSAGES
    ]
    assert broker.api_versions_seen


def test_legacy_batches_from_librdkafka_are_invalid_records() -> None:
    # Without Fetch v4 advertised, librdkafka falls back to magic 0/1 message
    # sets even in Produce v9, which Kafka answers with INVALID_RECORD.
    without_fetch = {key: versions for key, versions in SUPPORTED.items() if key != 1}
    with running(without_fetch) as broker:
        producer = producer_for(broker, "none")
        errors: list[Any] = []
        producer.produce(TOPIC, value=b"v", partition=0, on_delivery=lambda e, m: errors.append(e))
        assert producer.flush(10) == 0
    assert broker.refused == [ErrorCode.invalid_record]
    assert broker.batches == []
    assert len(errors) == 1 and errors[0] is not None


def test_librdkafka_falls_back_after_unsupported_api_versions() -> None:
    older = {**SUPPORTED, 18: (0, 2)}
    with running(older) as broker:
        producer = producer_for(broker, "zstd")
        key, value, headers, timestamp = MESSAGES[0]
        producer.produce(TOPIC, key=key, value=value, headers=headers, timestamp=timestamp)
        assert producer.flush(10) == 0
    assert not broker.errors, broker.errors
    # librdkafka starts at v3, is refused, and retries with a version we have.
    assert broker.api_versions_seen[0] == 3
    assert broker.api_versions_seen[1] <= 2
    [batch] = broker.batches
    [record] = iter_records(validate_produce_records(batch, 9))
    assert (record.key, record.value, record.timestamp) == (key, value, timestamp)
