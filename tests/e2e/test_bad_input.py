"""Bad input over the wire: every case gets Apache Kafka's answer, and the broker lives on.

Each test sends something broken (bytes that are no request, requests Kafka refuses,
record batches Kafka refuses) and asserts what Apache Kafka answers: a closed
connection, or the exact error code on the exact partition. Afterwards
`assert_healthy` checks, with independent clients (confluent-kafka produces,
kafka-python consumes), that the same broker process still takes and serves records,
and that every record acknowledged before the bad input is still there, in order.

Kafka references (apache/kafka): connection handling in `network/SocketServer.scala`
(`Processor.processCompletedReceives`) and `clients/.../network/NetworkReceive.java`;
per-partition produce checks in `KafkaApis.handleProduceRequest`,
`ProduceRequest.validateRecords`, `ByteBufferLogInputStream.nextBatchSize`,
`ReplicaManager.appendRecords` and `UnifiedLog.analyzeAndValidateRecords`.
"""

from __future__ import annotations

import contextlib
import random
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c
import pytest
from kio.schema.errors import ErrorCode

from protocol.codec import decode_response, encode_request
from protocol.compression import Compression
from protocol.records import build_batch, iter_batches, iter_records
from tests.e2e.wire import (
    ConnectionClosed,
    WireClient,
    api_versions,
    fetch,
    list_offsets,
    metadata,
    produce,
    raw_frame,
    request,
)
from tests.support.brokerproc import BrokerProcess, free_ports
from tests.support.regression_frames import FORBIDDEN_NULLS, OVER_LONG_ARRAYS

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

PARTITIONS = 3
HEALTH_TOPIC = "health"
BASELINE_RECORDS = 20
MIB = 1024 * 1024
KAFKA_MAX_MESSAGE_BYTES = 1048588  # Kafka's default max.message.bytes
TS = 1_700_000_000_000


# -- the brokers and their health ---------------------------------------------------------


@dataclass
class Target:
    """A running broker and the values of HEALTH_TOPIC partition 0, in offset order."""

    broker: BrokerProcess
    expected: list[bytes] = field(default_factory=list)


def ck_produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Produce values to partition 0 with confluent-kafka (acks=all); their offsets."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "max.in.flight": 1}
    )
    reports: dict[int, int] = {}
    errors: list[str] = []

    def report(index: int):
        def callback(err, msg):
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                reports[index] = msg.offset()

        return callback

    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=0, on_delivery=report(i))
    assert producer.flush(20) == 0, "confluent-kafka: records undelivered after 20 s"
    assert not errors, errors
    return [reports[i] for i in range(len(values))]


def kp_read(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """Read `count` records of partition 0 from the start with kafka-python."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=15_000,
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.offset, r.value) for r in records)
        return got
    finally:
        consumer.close()


def assert_healthy(target: Target) -> None:
    """The broker still runs, still takes a record from a fresh producer, and a fresh
    consumer reads every record acknowledged so far, exactly once and in order."""
    broker = target.broker
    assert broker.proc is not None and broker.proc.poll() is None, (
        "broker process died:\n" + broker.log_text()[-4000:]
    )
    value = f"health-{len(target.expected)}-{uuid.uuid4().hex}".encode()
    (offset,) = ck_produce(broker.bootstrap, HEALTH_TOPIC, [value])
    assert offset == len(target.expected)
    target.expected.append(value)
    got = kp_read(broker.bootstrap, HEALTH_TOPIC, len(target.expected))
    assert got == list(enumerate(target.expected))


def seed(target: Target) -> None:
    values = [f"baseline-{i}".encode() for i in range(BASELINE_RECORDS)]
    assert ck_produce(target.broker.bootstrap, HEALTH_TOPIC, values) == list(range(len(values)))
    target.expected.extend(values)


@pytest.fixture(scope="module")
def main(tmp_path_factory) -> Iterator[Target]:
    """Defaults (auto-create on, 100 MiB frames), 3 partitions per topic."""
    data = tmp_path_factory.mktemp("bad-input-main") / "data"
    broker = BrokerProcess(
        data_dir=data,
        port=free_ports(1)[0],
        extra_args=["--default-partitions", str(PARTITIONS)],
    )
    try:
        target = Target(broker.start())
        seed(target)
        yield target
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def strict(tmp_path_factory) -> Iterator[Target]:
    """Auto-creation off and 1 MiB frames. Its topics (HEALTH_TOPIC, "frame-limit") and
    baseline records are made by a first run with auto-creation on, on the same data."""
    data = tmp_path_factory.mktemp("bad-input-strict") / "data"
    seeding = BrokerProcess(
        data_dir=data, port=free_ports(1)[0], extra_args=["--default-partitions", "1"]
    )
    target = Target(seeding)
    try:
        seeding.start()
        seed(target)
        with WireClient(seeding.bootstrap) as client:
            answer = metadata(client, ["frame-limit"])
            assert answer.topics[0].error_code == ErrorCode.none
    finally:
        seeding.stop()
    broker = BrokerProcess(
        data_dir=data,
        port=free_ports(1)[0],
        extra_args=["--auto-create-topics", "false", "--max-frame-bytes", str(MIB)],
    )
    try:
        target.broker = broker.start()
        yield target
    finally:
        broker.stop()


# -- helpers -----------------------------------------------------------------------------


def new_topic(client: WireClient, prefix: str) -> tuple[str, uuid.UUID]:
    """Auto-create a fresh topic with PARTITIONS partitions; (name, topic id)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    (topic,) = metadata(client, [name]).topics
    assert topic.error_code == ErrorCode.none
    assert len(topic.partitions) == PARTITIONS
    return name, topic.topic_id


def batch(*values: bytes, compression: int = Compression.NONE) -> bytes:
    return build_batch(
        [(None, v, [], TS + i) for i, v in enumerate(values)], compression=compression
    )


def legacy_message_v1(value: bytes, timestamp: int = TS) -> bytes:
    """One magic 1 message (the pre-0.11 format) with a correct CRC32."""
    body = struct.pack(">bbq", 1, 0, timestamp) + struct.pack(">i", -1)
    body += struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def recrc(data: bytes | bytearray) -> bytes:
    """The batch with its CRC32C recomputed (after a header field was edited)."""
    out = bytearray(data)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def with_field(data: bytes, fmt: str, position: int, value: int, fix_crc: bool = True) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, position, value)
    return recrc(out) if fix_crc else bytes(out)


def cut_short_header() -> bytes:
    # 49 bytes of a header, with a batchLength that agrees with them.
    return with_field(batch(b"value")[:49], ">i", 8, 37, fix_crc=False)


def end_offset(client: WireClient, topic: str, partition: int) -> int:
    (answer,) = list_offsets(client, topic, {partition: -1}, version=1).values()
    assert answer.error_code == ErrorCode.none
    return int(answer.offset)


def values_at(client: WireClient, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    """Every (offset, value) of a partition, read with raw Fetch requests."""
    out: list[tuple[int, bytes | None]] = []
    offset = 0
    while True:
        answer = fetch(client, topic, partition, offset)
        assert answer.error_code == ErrorCode.none
        if not answer.records:
            return out
        for view in iter_batches(answer.records):
            for record in iter_records(view):
                out.append((view.base_offset + record.offset_delta, record.value))
        offset = out[-1][0] + 1


def sized_batch(size: int) -> bytes:
    """A one-record batch of exactly `size` bytes."""
    n = size - 70
    for _ in range(10):
        data = batch(b"x" * n)
        if len(data) == size:
            return data
        n += size - len(data)
    raise AssertionError(f"cannot build a batch of {size} bytes")


def assert_closed(client: WireClient) -> None:
    assert client.wait_closed(timeout=5.0), "the broker kept the connection open"


# -- connection level: bytes that are no request ---------------------------------------


def test_garbage_after_a_size_prefix_closes_the_connection(main):
    rng = random.Random(1234)
    junk = bytes(rng.getrandbits(8) for _ in range(300))
    # An API key no Kafka version knows, then random bytes for version, id and body.
    body = struct.pack(">h", 31_000) + junk
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", len(body)) + body)
        assert_closed(client)
    assert_healthy(main)


def test_http_request_closes_the_connection(main):
    # "GET " read as a size is 1195725856 bytes, over socket.request.max.bytes.
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert_closed(client)
    assert_healthy(main)


def test_negative_size_closes_the_connection(main):
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", -1) + b"\x00" * 16)
        assert_closed(client)
    assert_healthy(main)


def test_empty_frame_closes_the_connection(main):
    # A size of 0 is a valid receive, but no request header fits in it.
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 0))
        assert_closed(client)
    assert_healthy(main)


def test_truncated_frame_then_close_breaks_nothing(main):
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 100) + b"\x00\x03\x00\x0c" + b"\x00" * 6)
    with WireClient(main.broker.bootstrap) as client:
        assert 3 in api_versions(client)
    assert_healthy(main)


def test_frame_over_max_frame_bytes_closes_the_connection(strict):
    with WireClient(strict.broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 2 * MIB) + b"\x00" * 4096)
        assert_closed(client)
    assert_healthy(strict)


def test_max_frame_bytes_is_inclusive(strict):
    """Kafka refuses a receive only when its size is over the limit (NetworkReceive)."""
    topic = "frame-limit"
    with WireClient(strict.broker.bootstrap) as client:
        before = end_offset(client, topic, 0)

        def produce_frame_of(size: int):
            # Grow one record until the request (header + body) is exactly `size` bytes.
            value_size = size - 200
            for _ in range(10):
                entity = request(
                    0,
                    9,
                    transactional_id=None,
                    acks=-1,
                    timeout=30_000,
                    topic_data=[
                        {
                            "name": topic,
                            "partition_data": [{"index": 0, "records": batch(b"v" * value_size)}],
                        }
                    ],
                )
                frame = encode_request(entity, correlation_id=0, client_id="wire-tests")
                if len(frame) - 4 == size:
                    return entity
                value_size += size - (len(frame) - 4)
            raise AssertionError(f"cannot build a {size}-byte request")

        at_limit = produce_frame_of(MIB)
        answer = client.call(at_limit)
        (part,) = answer.responses[0].partition_responses
        assert part.error_code == ErrorCode.none
        assert part.base_offset == before

        # The broker may close while the frame is still being written.
        with contextlib.suppress(ConnectionClosed):
            client.send(produce_frame_of(MIB + 1))
        assert_closed(client)
    with WireClient(strict.broker.bootstrap) as client:
        assert end_offset(client, topic, 0) == before + 1
    assert_healthy(strict)


# -- requests Kafka refuses by closing (or, for ApiVersions, by answering v0) -----------


def test_unknown_api_key_closes_the_connection(main):
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(raw_frame(999, 0, 7))
        assert_closed(client)
    assert_healthy(main)


@pytest.mark.parametrize("version", [99, 13])
def test_unsupported_metadata_version_closes_the_connection(main, version):
    # v99 exists nowhere; v13 exists in Kafka 4 but this broker advertises 12 at most.
    with WireClient(main.broker.bootstrap) as client:
        assert api_versions(client)[3][1] < version
        client.send_raw(raw_frame(3, version, 7, b"\x01\x00\x00", flexible_header=True))
        assert_closed(client)
    assert_healthy(main)


# Regression frames sent to a real broker: over-long arrays made kio reserve tens of
# gigabytes and the process abort; nulls reached the handlers, which failed on them. A
# few of them: each refusal is a log line, and an agent logs at most a burst of those in
# ten seconds (broker.eventlog).
SENT = (
    "metadata-v9-2**32-2-topics",
    "produce-v9-2**35-2-partitions",
    "offset-for-leader-epoch-v4-null-topics",
    "incremental-alter-configs-v0-null-resources",
    "incremental-alter-configs-v0-null-configs",
    "produce-v9-null-partition-data",
)
# (case, frame, what the broker logs when it refuses the request)
MALFORMED_BODIES = [
    (bad.case, bad.frame, bad.refusal)
    for bad in OVER_LONG_ARRAYS + FORBIDDEN_NULLS
    if bad.case in SENT
]


@pytest.mark.parametrize(
    ("case", "frame", "refusal"), MALFORMED_BODIES, ids=[c[0] for c in MALFORMED_BODIES]
)
def test_over_long_arrays_and_forbidden_nulls_close_the_connection(main, case, frame, refusal):
    """Apache Kafka's generated readers refuse an array longer than the bytes left and a
    null in a non-nullable field; the request is malformed and the connection closes."""
    with WireClient(main.broker.bootstrap) as client:
        client.send_raw(frame)
        assert_closed(client)
    # Refused while decoding, not by a handler failing on what was decoded.
    assert refusal in main.broker.log_text()
    assert_healthy(main)


def test_api_versions_v99_gets_a_v0_unsupported_version_answer(main):
    """RequestContext.parseRequest/apiVersion: an ApiVersions request of an unknown
    version is read as v0 and answered with a v0 response carrying UNSUPPORTED_VERSION
    and (KIP-511) the ApiVersions range, so the client can retry; the connection stays."""
    with WireClient(main.broker.bootstrap) as client:
        advertised = api_versions(client)
        client.send_raw(raw_frame(18, 99, 4242, b"\x05wire\x021\x00", flexible_header=True))
        frame = client.read_frame()
        # Response header v0: just the correlation id, then the v0 body.
        assert struct.unpack_from(">i", frame)[0] == 4242
        answer = decode_response(frame, 18, 0).body
        assert answer.error_code == ErrorCode.unsupported_version
        listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}
        assert listed[18] == advertised[18]
        # Kafka lists the ApiVersions entry alone (ApiVersionsRequest.getErrorResponse);
        # clients read only that entry, so other entries are tolerated if they are true.
        assert all(advertised.get(key) == span for key, span in listed.items())
        # The client retries on the same connection with a version the broker knows.
        assert api_versions(client) == advertised
    assert_healthy(main)


# -- Produce: record batches Kafka refuses, per partition -------------------------------


def test_bad_crc_fails_only_its_partition(main):
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, "crc")
        corrupt = bytearray(batch(b"corrupt-me"))
        corrupt[-1] ^= 0xFF  # a byte of the value: covered by the CRC
        answers = produce(
            client,
            {topic: {0: batch(b"p0"), 1: bytes(corrupt), 2: batch(b"p2")}},
        )
        assert answers[topic, 1].error_code == ErrorCode.corrupt_message
        assert answers[topic, 1].base_offset == -1
        for p in (0, 2):
            assert answers[topic, p].error_code == ErrorCode.none
            assert answers[topic, p].base_offset == 0
        assert values_at(client, topic, 0) == [(0, b"p0")]
        assert values_at(client, topic, 1) == []
        assert values_at(client, topic, 2) == [(0, b"p2")]
    assert_healthy(main)


# (case, records for partition 0, Kafka's error on partition 0)
REFUSED_BATCHES = [
    # ProduceRequest.validateRecords: v3+ takes magic 2 only -> InvalidRecordException
    # (INVALID_RECORD, 87), not UNSUPPORTED_FOR_MESSAGE_FORMAT.
    ("magic-1", lambda: legacy_message_v1(b"old"), ErrorCode.invalid_record),
    # validateRecords: exactly one batch per partition.
    ("two-batches", lambda: batch(b"a") + batch(b"b"), ErrorCode.invalid_record),
    # validateRecords: no batch at all.
    ("no-records", lambda: b"", ErrorCode.invalid_record),
    # A batch cut short inside its header, with a batchLength consistent with the bytes
    # sent: Kafka reads it as one batch and DefaultRecordBatch.isValid fails (size under
    # RECORD_BATCH_OVERHEAD) in UnifiedLog.analyzeAndValidateRecords -> CORRUPT_MESSAGE.
    ("cut-short-header", cut_short_header, ErrorCode.corrupt_message),
    # analyzeAndValidateRecords: a client's v2 batch must have baseOffset 0.
    (
        "base-offset-5",
        lambda: build_batch([(None, b"v", [], TS)], base_offset=5),
        ErrorCode.invalid_record,
    ),
    # LogValidator.validateBatch (client batches): consistent counts, no control
    # batches, a sequence whenever there is a producer id.
    (
        "count-mismatch",
        lambda: with_field(batch(b"a", b"b"), ">i", 57, 3),
        ErrorCode.invalid_record,
    ),
    (
        "control-batch",
        lambda: build_batch([(None, b"c", [], TS)], control=True),
        ErrorCode.invalid_record,
    ),
    (
        "producer-id-without-sequence",
        lambda: build_batch([(None, b"p", [], TS)], producer_id=7, producer_epoch=0),
        ErrorCode.invalid_record,
    ),
]


@pytest.mark.parametrize(
    ("case", "records", "error"), REFUSED_BATCHES, ids=[c[0] for c in REFUSED_BATCHES]
)
def test_refused_batch_fails_only_its_partition(main, case, records, error):
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, case)
        answers = produce(client, {topic: {0: records(), 1: batch(b"neighbour")}})
        assert answers[topic, 0].error_code == error
        assert answers[topic, 0].base_offset == -1
        assert answers[topic, 1].error_code == ErrorCode.none
        assert end_offset(client, topic, 0) == 0
        assert values_at(client, topic, 1) == [(0, b"neighbour")]
    assert_healthy(main)


# ByteBufferLogInputStream.nextBatchSize: batchLength under 14 or a magic over 2 is a
# CorruptRecordException. (Kafka meets it already in RequestUtils.hasTransactionalRecords
# and then fails every partition of the request; alone, that is this partition.)
FRAMING_ERRORS = [
    ("batch-length-13", lambda: with_field(batch(b"a"), ">i", 8, 13, fix_crc=False)),
    ("magic-3", lambda: with_field(batch(b"a"), ">b", 16, 3, fix_crc=False)),
]


@pytest.mark.parametrize(("case", "records"), FRAMING_ERRORS, ids=[c[0] for c in FRAMING_ERRORS])
def test_unframeable_batch_is_corrupt_message(main, case, records):
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, case)
        answers = produce(client, {topic: {0: records()}})
        assert answers[topic, 0].error_code == ErrorCode.corrupt_message
        assert answers[topic, 0].base_offset == -1
        assert end_offset(client, topic, 0) == 0
    assert_healthy(main)


def test_zstd_needs_produce_v7(main):
    """ProduceRequest.validateRecords: zstd before v7 -> UNSUPPORTED_COMPRESSION_TYPE."""
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, "zstd-v6")
        zstd = batch(b"z", compression=Compression.ZSTD)
        answers = produce(client, {topic: {0: zstd}}, version=6)
        assert answers[topic, 0].error_code == ErrorCode.unsupported_compression_type
        answers = produce(client, {topic: {0: zstd}}, version=7)
        assert answers[topic, 0].error_code == ErrorCode.none
        assert values_at(client, topic, 0) == [(0, b"z")]
    assert_healthy(main)


def test_batch_over_max_message_bytes_is_message_too_large(main):
    """analyzeAndValidateRecords: batch.sizeInBytes > max.message.bytes (1048588 by
    default) -> RecordTooLargeException (MESSAGE_TOO_LARGE); exactly the limit passes."""
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, "too-large")
        over = sized_batch(KAFKA_MAX_MESSAGE_BYTES + 1)
        at_limit = sized_batch(KAFKA_MAX_MESSAGE_BYTES)
        answers = produce(client, {topic: {0: over, 1: at_limit}})
        assert answers[topic, 0].error_code == ErrorCode.message_too_large
        assert answers[topic, 0].base_offset == -1
        assert answers[topic, 1].error_code == ErrorCode.none
        assert end_offset(client, topic, 0) == 0
        assert end_offset(client, topic, 1) == 1
    assert_healthy(main)


def test_partition_beyond_the_topic_is_unknown(main):
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, "beyond")
        answers = produce(client, {topic: {PARTITIONS: batch(b"x"), 0: batch(b"y")}})
        assert answers[topic, PARTITIONS].error_code == ErrorCode.unknown_topic_or_partition
        assert answers[topic, PARTITIONS].base_offset == -1
        assert answers[topic, 0].error_code == ErrorCode.none
    assert_healthy(main)


def test_acks_5_is_invalid_required_acks(main):
    """ReplicaManager.appendRecords: acks not in {-1, 0, 1} -> INVALID_REQUIRED_ACKS on
    every partition that passed the earlier checks; nothing is appended."""
    with WireClient(main.broker.bootstrap) as client:
        topic, _ = new_topic(client, "acks5")
        answers = produce(client, {topic: {0: batch(b"a"), 1: batch(b"b")}}, acks=5)
        for p in (0, 1):
            assert answers[topic, p].error_code == ErrorCode.invalid_required_acks
            assert answers[topic, p].base_offset == -1
            assert end_offset(client, topic, p) == 0
    assert_healthy(main)


def test_produce_to_unknown_topic_without_auto_creation(strict):
    with WireClient(strict.broker.bootstrap) as client:
        answers = produce(client, {"no-such-topic": {0: batch(b"x")}})
        assert answers["no-such-topic", 0].error_code == ErrorCode.unknown_topic_or_partition
        assert answers["no-such-topic", 0].base_offset == -1
        (topic,) = metadata(client, ["no-such-topic"]).topics
        assert topic.error_code == ErrorCode.unknown_topic_or_partition
        names = {t.name for t in metadata(client, None).topics}
        assert "no-such-topic" not in names
    assert_healthy(strict)


# -- Metadata and Fetch ----------------------------------------------------------------


ILLEGAL_NAMES = ["bad name!", "a" * 250, "..", ".", "slash/name"]


def test_metadata_for_illegal_topic_names_with_auto_creation(main):
    """AutoTopicCreationManager: Topic.validate fails -> INVALID_TOPIC_EXCEPTION (17)."""
    with WireClient(main.broker.bootstrap) as client:
        answer = metadata(client, ILLEGAL_NAMES, allow_auto=True)
        assert {t.name: t.error_code for t in answer.topics} == {
            name: ErrorCode.invalid_topic_exception for name in ILLEGAL_NAMES
        }
        assert all(not t.partitions for t in answer.topics)
        names = {t.name for t in metadata(client, None).topics}
        assert not names & set(ILLEGAL_NAMES)
    assert_healthy(main)


def test_fetch_beyond_the_high_watermark_is_offset_out_of_range(main):
    with WireClient(main.broker.bootstrap) as client:
        topic, topic_id = new_topic(client, "fetch-oor")
        assert produce(client, {topic: {0: batch(b"a", b"b")}})[topic, 0].base_offset == 0
        at_end = fetch(client, topic, 0, 2)
        assert at_end.error_code == ErrorCode.none
        assert at_end.high_watermark == 2
        assert not at_end.records
        beyond = fetch(client, topic, 0, 3)
        assert beyond.error_code == ErrorCode.offset_out_of_range
        assert not beyond.records
        newest = api_versions(client)[1][1]
        beyond = fetch(client, topic_id, 0, 3, version=newest)
        assert beyond.error_code == ErrorCode.offset_out_of_range
    assert_healthy(main)


def test_fetch_for_an_unknown_topic_id_is_unknown_topic_id(main):
    unknown = uuid.uuid4()
    with WireClient(main.broker.bootstrap) as client:
        newest = api_versions(client)[1][1]
        for version in sorted({13, newest}):
            answer = fetch(client, unknown, 0, 0, version=version)
            assert answer.error_code == ErrorCode.unknown_topic_id
            assert not answer.records
        # By name (v12 and older) an unknown topic is UNKNOWN_TOPIC_OR_PARTITION.
        answer = fetch(client, f"missing-{unknown.hex[:8]}", 0, 0, version=12)
        assert answer.error_code == ErrorCode.unknown_topic_or_partition
    assert_healthy(main)
