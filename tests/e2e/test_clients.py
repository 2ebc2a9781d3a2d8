"""End to end with real Kafka clients: kafka-python, confluent-kafka, aiokafka and kcat.

Each test produces to a fresh topic on a real `bucketlog serve` and reads everything
back, checking partition, offset (dense from 0 per partition), key, value, headers,
CreateTime timestamp and timestamp type exactly. Brokers are shared by the module: one
per auto-create partition count (see clients_support.BrokerPool).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from dataclasses import replace

import pytest

from tests.e2e.clients_support import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    BrokerPool,
    Rec,
    Topic,
    aio_consume,
    aio_produce,
    aiokafka_codec_missing,
    assert_same_in_partition_order,
    assert_same_records,
    ck_consume,
    ck_produce,
    ck_produce_expect_error,
    kafka_python_codec_missing,
    kcat,
    kcat_consume,
    kcat_consume_json,
    kp_consume,
    kp_produce,
    large_record,
    librdkafka_partition,
    record_with_batch_size,
    sample_records,
)

pytestmark = pytest.mark.slow

# A batch is stored byte for byte whatever its codec, so on S3 (the second pass of make
# test) the matrix runs with no compression and with zstd only.
CODECS = [
    codec if codec in ("none", "zstd") else pytest.param(codec, marks=pytest.mark.store_independent)
    for codec in ("none", "gzip", "snappy", "lz4", "zstd")
]
PARTITION_COUNTS = [1, 32]
RECORDS = 300
LARGE = 3 * 1024 * 1024
BELOW_DEFAULT_LIMIT = 900 * 1024
RAISED_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    brokers = BrokerPool(tmp_path_factory.mktemp("clients"))
    yield brokers
    brokers.stop()


def large_topic(pool: BrokerPool, prefix: str) -> Topic:
    """A topic that should take a 3 MiB record: max.message.bytes raised by CreateTopics.
    Without CreateTopics it keeps Kafka's default limit (`configs_applied` is False)."""
    return pool.topic(prefix, 1, {"max.message.bytes": str(RAISED_LIMIT)})


def ensure_partitions(records: list[Rec], partitions: int) -> list[Rec]:
    """Records with a null or empty key go to an explicit partition, so every record's
    partition is predictable under librdkafka's consistent_random partitioner."""
    if partitions == 1:
        return records
    return [r if r.key else replace(r, partition=i % partitions) for i, r in enumerate(records)]


# -- kafka-python -----------------------------------------------------------------------


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_roundtrip(pool, codec, partitions):
    missing = kafka_python_codec_missing(codec)
    if missing:
        pytest.skip(missing)
    topic = pool.topic(f"kp-{codec}", partitions)
    # kafka-python sends header values as bytes only, and refuses a record whose key and
    # value are both null.
    records = sample_records(
        f"kp-{codec}-{partitions}", RECORDS, null_header_values=False, null_key_and_value=False
    )
    acked = kp_produce(
        topic.bootstrap,
        topic.name,
        records,
        compression_type=None if codec == "none" else codec,
        linger_ms=20,
        batch_size=16 * 1024,
        acks="all",
    )
    consumed = kp_consume(topic.bootstrap, topic.name, partitions)
    assert_same_records(acked, consumed)
    if partitions > 1:
        assert len({r.partition for r in acked}) > 1, "every record landed on one partition"


def test_kafka_python_large_record(pool):
    from kafka.errors import MessageSizeTooLargeError

    topic = large_topic(pool, "kp-large")
    producer_config = {
        "max_request_size": 8 * 1024 * 1024,
        "batch_size": 1024 * 1024,
        "acks": "all",
    }
    big = large_record(LARGE, "kp-large")
    if topic.configs_applied:
        acked = kp_produce(topic.bootstrap, topic.name, [big], **producer_config)
    else:
        # No CreateTopics: the topic keeps max.message.bytes=1048588, as in Kafka.
        with pytest.raises(MessageSizeTooLargeError):
            kp_produce(topic.bootstrap, topic.name, [big], **producer_config)
        fits = large_record(BELOW_DEFAULT_LIMIT, "kp-fits")
        acked = kp_produce(topic.bootstrap, topic.name, [fits], **producer_config)
    # Fetch limits far below the record: the broker must still return the whole batch.
    tiny_fetch = {"max_partition_fetch_bytes": 1024, "fetch_max_bytes": 1024}
    assert_same_records(acked, kp_consume(topic.bootstrap, topic.name, 1, **tiny_fetch))


def test_kafka_python_max_message_bytes_boundary(pool):
    """max.message.bytes (default 1048588) counts the whole batch, baseOffset and
    batchLength included: a batch of exactly that size is taken, one byte more is not."""
    from kafka.errors import MessageSizeTooLargeError

    topic = pool.topic("kp-limit", 1)
    producer_config = {"max_request_size": 8 * 1024 * 1024, "acks": "all"}
    over = record_with_batch_size(KAFKA_DEFAULT_MAX_MESSAGE_BYTES + 1, "kp-over")
    at = record_with_batch_size(KAFKA_DEFAULT_MAX_MESSAGE_BYTES, "kp-at")
    with pytest.raises(MessageSizeTooLargeError):
        kp_produce(topic.bootstrap, topic.name, [over], **producer_config)
    acked = kp_produce(topic.bootstrap, topic.name, [at], **producer_config)
    assert_same_records(acked, kp_consume(topic.bootstrap, topic.name, 1))


# -- confluent-kafka ----------------------------------------------------------------------

CONFLUENT_MODES = {
    "idempotent": {"enable.idempotence": True, "acks": "all"},
    "acks-all": {"enable.idempotence": False, "acks": "all"},
    "acks-1": {"enable.idempotence": False, "acks": "1"},
}


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
@pytest.mark.parametrize("mode", list(CONFLUENT_MODES))
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_roundtrip(pool, codec, mode, partitions):
    topic = pool.topic(f"ck-{codec}-{mode}", partitions)
    records = ensure_partitions(sample_records(f"ck-{codec}-{mode}", RECORDS), partitions)
    acked = ck_produce(
        topic.bootstrap,
        topic.name,
        records,
        {"compression.type": codec, "batch.size": 16 * 1024, **CONFLUENT_MODES[mode]},
    )
    for sent, ack in zip(records, acked, strict=True):
        want = sent.partition
        if want is None:
            want = librdkafka_partition(sent.key, partitions)
        assert ack.partition == want, f"{ack.short()} should be on partition {want}"
    assert_same_records(acked, ck_consume(topic.bootstrap, topic.name, partitions))


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
def test_confluent_assign_mid_batch(pool, partitions):
    """assign() at an offset inside a compressed multi-record batch."""
    topic = pool.topic("ck-mid", partitions)
    records = ensure_partitions(sample_records("ck-mid", RECORDS), partitions)
    acked = ck_produce(
        topic.bootstrap,
        topic.name,
        records,
        {"compression.type": "zstd", "linger.ms": 50, "batch.size": 1024 * 1024},
    )
    counts = Counter(r.partition for r in acked)
    start = {p: n // 2 + 1 for p, n in counts.items()}
    consumed = ck_consume(topic.bootstrap, topic.name, partitions, start=start)
    assert_same_records(acked, consumed, start)


def test_confluent_large_record(pool):
    from confluent_kafka import KafkaError

    topic = large_topic(pool, "ck-large")
    producer_config = {"message.max.bytes": 8 * 1024 * 1024, "enable.idempotence": True}
    big = large_record(LARGE, "ck-large")
    if topic.configs_applied:
        acked = ck_produce(topic.bootstrap, topic.name, [big], producer_config)
    else:
        err = ck_produce_expect_error(topic.bootstrap, topic.name, big, producer_config)
        assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"unexpected error {err}"
        fits = large_record(BELOW_DEFAULT_LIMIT, "ck-fits")
        acked = ck_produce(topic.bootstrap, topic.name, [fits], producer_config)
    assert_same_records(acked, ck_consume(topic.bootstrap, topic.name, 1))


# -- aiokafka -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("partitions", "idempotent"), [(1, False), (32, True)], ids=["p1", "p32-idempotent"]
)
@pytest.mark.parametrize("codec", CODECS)
async def test_aiokafka_roundtrip(pool, codec, partitions, idempotent):
    missing = aiokafka_codec_missing(codec)
    if missing:
        pytest.skip(missing)
    topic = pool.topic(f"aio-{codec}", partitions)
    # aiokafka refuses a record whose key and value are both null.
    records = sample_records(f"aio-{codec}-{partitions}", RECORDS, null_key_and_value=False)
    acked = await aio_produce(
        topic.bootstrap,
        topic.name,
        records,
        compression_type=None if codec == "none" else codec,
        linger_ms=20,
        max_batch_size=16 * 1024,
        enable_idempotence=idempotent,
        acks="all",
    )
    assert_same_records(acked, await aio_consume(topic.bootstrap, topic.name, partitions))


# -- kcat ----------------------------------------------------------------------------------

KCAT_HEADERS = (
    ("app", b"kcat"),
    ("dup", b"1"),
    ("dup", b"2"),
    ("empty", b""),
    ("null-value", None),
)


def kcat_header_args(headers) -> list[str]:
    args = []
    for name, value in headers:
        args += ["-H", name if value is None else f"{name}={value.decode()}"]
    return args


def kcat_lines(tag: str, count: int) -> tuple[bytes, list[Rec]]:
    """stdin for `kcat -P -K: -Z` and the records it stands for (no timestamps yet).
    With -Z an empty key or value is sent as NULL; a line without ':' has a null key."""
    lines, records = [], []
    for i in range(count):
        if i % 7 == 3:
            line, key, value = f"{tag} no key {i}", None, f"{tag} no key {i}".encode()
        elif i % 11 == 5:
            line, key, value = f"{tag}-k{i}:", f"{tag}-k{i}".encode(), None
        else:
            key = f"{tag}-k{i % 19}".encode()
            value = (f"{tag} value {i} " * (1 + i % 5)).encode()
            line = f"{key.decode()}:{value.decode()}"
        lines.append(line)
        records.append(Rec(key, value, KCAT_HEADERS))
    return ("\n".join(lines) + "\n").encode(), records


def check_kcat_timestamps(consumed: list[Rec], start_ms: int, end_ms: int) -> list[Rec]:
    """kcat cannot set CreateTime itself: librdkafka stamps each record when it is
    produced. Check the range, then drop the timestamps for the exact comparison."""
    for rec in consumed:
        assert start_ms <= rec.timestamp <= end_ms, (
            f"{rec.short()}: timestamp outside the produce window [{start_ms}, {end_ms}]"
        )
    return [replace(r, timestamp=None) for r in consumed]


needs_kcat = pytest.mark.skipif(
    shutil.which("kcat") is None, reason="kcat is not installed (make test installs it from apt)"
)


@needs_kcat
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_roundtrip(pool, codec):
    topic = pool.topic(f"kcat-{codec}", 1)
    stdin, records = kcat_lines(f"kcat-{codec}", 200)
    start_ms = int(time.time() * 1000)
    kcat(
        ["-P", "-b", topic.bootstrap, "-t", topic.name, "-p", "0", "-K:", "-Z", "-z", codec]
        + ["-X", "linger.ms=20"]
        + kcat_header_args(KCAT_HEADERS),
        stdin=stdin,
    )
    end_ms = int(time.time() * 1000)
    consumed = check_kcat_timestamps(kcat_consume(topic.bootstrap, topic.name), start_ms, end_ms)
    assert_same_in_partition_order([replace(r, partition=0) for r in records], consumed)
    envelopes = kcat_consume_json(topic.bootstrap, topic.name)
    assert [e["tstype"] for e in envelopes] == ["create"] * len(records)
    assert envelopes[0]["headers"] == [
        "app",
        "kcat",
        "dup",
        "1",
        "dup",
        "2",
        "empty",
        "",
        "null-value",
        None,
    ]


@needs_kcat
def test_kcat_keyed_partitions(pool):
    topic = pool.topic("kcat-keyed", 32)
    stdin, records = kcat_lines("kcat-keyed", 400)
    keyed = [r for r in records if r.key is not None]
    lines = [
        line for line, rec in zip(stdin.decode().splitlines(), records, strict=True) if rec.key
    ]
    start_ms = int(time.time() * 1000)
    kcat(
        ["-P", "-b", topic.bootstrap, "-t", topic.name, "-K:", "-Z", "-z", "zstd"]
        + kcat_header_args(KCAT_HEADERS),
        stdin=("\n".join(lines) + "\n").encode(),
    )
    end_ms = int(time.time() * 1000)
    consumed = check_kcat_timestamps(kcat_consume(topic.bootstrap, topic.name), start_ms, end_ms)
    expected = [replace(r, partition=librdkafka_partition(r.key, 32)) for r in keyed]
    assert_same_in_partition_order(expected, consumed)
    assert len({r.partition for r in consumed}) > 10


@needs_kcat
def test_kcat_metadata_listing(pool):
    topic = pool.topic("kcat-meta", 32)
    port = topic.bootstrap.rsplit(":", 1)[1]
    listing = json.loads(kcat(["-L", "-J", "-b", topic.bootstrap, "-t", topic.name]))
    brokers = {b["id"]: b["name"] for b in listing["brokers"]}
    assert f"127.0.0.1:{port}" in brokers.values(), listing["brokers"]
    [entry] = [t for t in listing["topics"] if t["topic"] == topic.name]
    assert "error" not in entry, entry
    assert sorted(p["partition"] for p in entry["partitions"]) == list(range(32))
    for p in entry["partitions"]:
        assert p["leader"] in brokers, p
        assert "error" not in p, p
    text = kcat(["-L", "-b", topic.bootstrap]).decode()
    assert f'topic "{topic.name}" with 32 partitions:' in text, text
    assert f"at 127.0.0.1:{port}" in text, text


# -- cross-client ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["zstd", "gzip"])
def confluent_produced(request, pool):
    """Records produced once per codec by confluent-kafka (idempotent, 32 partitions)."""
    codec = request.param
    topic = pool.topic(f"cross-{codec}", 32)
    records = ensure_partitions(sample_records(f"cross-{codec}", RECORDS, kcat_safe=True), 32)
    acked = ck_produce(
        topic.bootstrap,
        topic.name,
        records,
        {"compression.type": codec, "enable.idempotence": True, "linger.ms": 20},
    )
    return codec, topic, acked


def test_cross_confluent_to_kafka_python(confluent_produced):
    codec, topic, acked = confluent_produced
    missing = kafka_python_codec_missing(codec)
    if missing:
        pytest.skip(missing)
    assert_same_records(acked, kp_consume(topic.bootstrap, topic.name, topic.partitions))


async def test_cross_confluent_to_aiokafka(confluent_produced):
    codec, topic, acked = confluent_produced
    missing = aiokafka_codec_missing(codec)
    if missing:
        pytest.skip(missing)
    consumed = await aio_consume(topic.bootstrap, topic.name, topic.partitions)
    assert_same_records(acked, consumed)


@needs_kcat
def test_cross_confluent_to_kcat(confluent_produced):
    _codec, topic, acked = confluent_produced
    consumed = kcat_consume(topic.bootstrap, topic.name)
    # kcat's -f output has no timestamp type; -J has it.
    assert_same_records(acked, consumed)
    tstypes = {e["tstype"] for e in kcat_consume_json(topic.bootstrap, topic.name)}
    assert tstypes == {"create"}


@pytest.mark.parametrize("codec", ["snappy", "lz4"])
async def test_cross_aiokafka_to_confluent(pool, codec):
    """Python-side snappy (xerial framing) and lz4 frames, read back by librdkafka."""
    missing = aiokafka_codec_missing(codec)
    if missing:
        pytest.skip(missing)
    topic = pool.topic(f"aio2ck-{codec}", 32)
    records = sample_records(f"aio2ck-{codec}", RECORDS, null_key_and_value=False)
    acked = await aio_produce(
        topic.bootstrap, topic.name, records, compression_type=codec, linger_ms=20
    )
    assert_same_records(acked, ck_consume(topic.bootstrap, topic.name, 32))
