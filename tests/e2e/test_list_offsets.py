"""ListOffsets by timestamp, earliest, latest and max timestamp, as Apache Kafka answers.

The records carry timestamps out of order inside their batches, so a lookup that
trusts batch headers alone, or sorts timestamps, gets a wrong answer. Kafka's rule
(`UnifiedLog.fetchOffsetByTimestamp` -> `LogSegment.findOffsetByTimestamp` ->
`FileRecords.searchForTimestamp`): the first batch in log order whose maxTimestamp is
>= T, and in it the first record whose timestamp is >= T; that record's offset and
timestamp, or offset -1 / timestamp -1 when there is none.

MAX_TIMESTAMP (-3, ListOffsets v7+, fixed by KAFKA-16310): the first batch in log order
whose maxTimestamp is the partition's largest (a segment only records a new maximum
when it is strictly larger), then `RecordBatch.offsetOfMaxTimestamp`: the first record
in that batch carrying it. So with ties the earliest record wins.

Each layout is checked with raw requests (v1 and the newest version the broker
advertises), confluent-kafka `offsets_for_times` and kafka-python `offsets_for_times`,
for uncompressed batches and every codec (lookups must decompress).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import build_batch
from tests.e2e.wire import WireClient, api_versions, list_offsets, metadata, produce, request
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = pytest.mark.slow

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3

# Three batches, timestamps out of order inside each; offsets in brackets.
#   batch 1: [0] 100, [1] 300, [2] 200
#   batch 2: [3] 150, [4] 500, [5] 400
#   batch 3: [6] 600
BATCHES = [[100, 300, 200], [150, 500, 400], [600]]

# T -> (offset, timestamp) of the first record in log order with timestamp >= T.
BY_TIMESTAMP = [
    (0, (0, 100)),  # everything is >= 0: the very first record
    (100, (0, 100)),  # offset 0 is exactly 100
    (101, (1, 300)),  # offset 0 (100) is too old; offset 1 (300) is the first >= 101
    (150, (1, 300)),  # offset 3 is exactly 150, but offset 1 (300) comes first in the log
    (199, (1, 300)),  # again offset 1: 300 >= 199 before offset 2 (200) is reached
    (200, (1, 300)),  # offset 2 is exactly 200, offset 1 still comes first
    (250, (1, 300)),
    (300, (1, 300)),  # offset 1 exactly
    (301, (4, 500)),  # batch 1 tops out at 300; in batch 2, offset 3 (150) < 301, offset 4 (500)
    (450, (4, 500)),  # offset 5 (400) < 450; offset 4 (500) is first anyway
    (500, (4, 500)),  # offset 4 exactly
    (501, (6, 600)),  # only batch 3 reaches 501
    (600, (6, 600)),  # offset 6 exactly
    (601, (-1, -1)),  # nothing is that new
]

CODECS = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def make_batch(timestamps: list[int], compression: int) -> bytes:
    records = [(None, f"ts-{ts}".encode(), [], ts) for ts in timestamps]
    return build_batch(records, compression=compression)


def produce_batches(
    client: WireClient, topic: str, batches: list[list[int]], compression: int, pipelined: bool
) -> None:
    """One Produce request per batch, either one after the other or all in flight at
    once (so that they can land in the same flush)."""
    expected = []
    offset = 0
    for timestamps in batches:
        expected.append(offset)
        offset += len(timestamps)
    if not pipelined:
        got = []
        for timestamps in batches:
            answer = produce(client, {topic: {0: make_batch(timestamps, compression)}})[topic, 0]
            assert answer.error_code == ErrorCode.none
            got.append(int(answer.base_offset))
        assert got == expected
        return
    ids = []
    for timestamps in batches:
        ids.append(
            client.send(
                request(
                    0,
                    9,
                    transactional_id=None,
                    acks=-1,
                    timeout=30_000,
                    topic_data=[
                        {
                            "name": topic,
                            "partition_data": [
                                {"index": 0, "records": make_batch(timestamps, compression)}
                            ],
                        }
                    ],
                )
            )
        )
    got = []
    for correlation_id in ids:
        (part,) = client.receive(correlation_id).responses[0].partition_responses
        assert part.error_code == ErrorCode.none
        got.append(int(part.base_offset))
    assert got == expected


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("list-offsets") / "data"
    process = BrokerProcess(data_dir=data, port=free_ports(1)[0])
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def newest(broker) -> int:
    with WireClient(broker.bootstrap) as client:
        low, high = api_versions(client)[2]
    assert low <= 1 and high >= 7, "ListOffsets v1 and v7 (MAX_TIMESTAMP) must be offered"
    return high


def new_topic(client: WireClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    (topic,) = metadata(client, [name]).topics
    assert topic.error_code == ErrorCode.none
    return name


@pytest.fixture(scope="module")
def topics(broker) -> dict[str, str]:
    """{layout: topic}: the three batches of BATCHES with each codec, one Produce request
    after the other; gzip and "pipelined" (uncompressed) send all three at once."""
    out = {}
    with WireClient(broker.bootstrap) as client:
        for name, codec in CODECS.items():
            out[name] = new_topic(client, f"lo-{name}")
            produce_batches(client, out[name], BATCHES, codec, pipelined=(name == "gzip"))
        out["pipelined"] = new_topic(client, "lo-pipelined")
        produce_batches(client, out["pipelined"], BATCHES, Compression.NONE, pipelined=True)
    return out


LAYOUTS = [*CODECS, "pipelined"]


def expected_epoch(offset: int) -> int:
    # Found offsets carry the batch's leader epoch (0 on this broker: one leader epoch
    # forever, as Metadata says); nothing found -> -1.
    return 0 if offset >= 0 else -1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_by_timestamp_raw(broker, topics, newest, layout):
    topic = topics[layout]
    with WireClient(broker.bootstrap) as client:
        for version in (1, newest):
            for target, (offset, timestamp) in BY_TIMESTAMP:
                (answer,) = list_offsets(client, topic, {0: target}, version=version).values()
                got = (answer.error_code, int(answer.offset), int(answer.timestamp))
                assert got == (ErrorCode.none, offset, timestamp), f"v{version} T={target}"
                if version >= 4:
                    assert answer.leader_epoch == expected_epoch(offset)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_earliest_latest_and_max_timestamp_raw(broker, topics, newest, layout):
    topic = topics[layout]
    with WireClient(broker.bootstrap) as client:
        for version in (1, newest):
            answers = list_offsets(client, topic, {0: EARLIEST}, version=version)
            assert (answers[0].error_code, answers[0].offset, answers[0].timestamp) == (0, 0, -1)
            answers = list_offsets(client, topic, {0: LATEST}, version=version)
            assert (answers[0].error_code, answers[0].offset, answers[0].timestamp) == (0, 7, -1)
        for version in sorted({7, newest}):
            (answer,) = list_offsets(client, topic, {0: MAX_TIMESTAMP}, version=version).values()
            assert (answer.error_code, answer.offset, answer.timestamp) == (0, 6, 600)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_max_timestamp_ties_pick_the_first_record(broker, newest, codec):
    """Largest timestamp 700 in records 1, 2 (batch 1) and 4 (batch 2): offset 1."""
    with WireClient(broker.bootstrap) as client:
        topic = new_topic(client, "lo-ties")
        produce_batches(client, topic, [[100, 700, 700], [50, 700]], CODECS[codec], False)
        for version in sorted({7, newest}):
            (answer,) = list_offsets(client, topic, {0: MAX_TIMESTAMP}, version=version).values()
            assert (answer.error_code, answer.offset, answer.timestamp) == (0, 1, 700)
        # By timestamp, ties resolve the same way: the first record >= T in log order.
        (answer,) = list_offsets(client, topic, {0: 700}, version=newest).values()
        assert (answer.offset, answer.timestamp) == (1, 700)


def test_max_timestamp_in_a_later_batch(broker, newest):
    """The maximum sits in the middle of the second batch of three."""
    with WireClient(broker.bootstrap) as client:
        topic = new_topic(client, "lo-max-later")
        produce_batches(client, topic, [[10, 30], [20, 90, 40], [80]], Compression.GZIP, False)
        (answer,) = list_offsets(client, topic, {0: MAX_TIMESTAMP}, version=newest).values()
        assert (answer.error_code, answer.offset, answer.timestamp) == (0, 3, 90)


def test_empty_partition(broker, newest):
    """An empty log: earliest and latest are 0; by timestamp and max timestamp find nothing."""
    with WireClient(broker.bootstrap) as client:
        topic = new_topic(client, "lo-empty")
        for version in (1, newest):
            answers = list_offsets(client, topic, {0: EARLIEST}, version=version)
            assert (answers[0].offset, answers[0].timestamp) == (0, -1)
            answers = list_offsets(client, topic, {0: LATEST}, version=version)
            assert (answers[0].offset, answers[0].timestamp) == (0, -1)
            answers = list_offsets(client, topic, {0: 0}, version=version)
            assert (answers[0].error_code, answers[0].offset, answers[0].timestamp) == (0, -1, -1)
        answers = list_offsets(client, topic, {0: MAX_TIMESTAMP}, version=newest)
        assert (answers[0].error_code, answers[0].offset, answers[0].timestamp) == (0, -1, -1)


def test_unknown_topic_and_partition(broker, topics, newest):
    with WireClient(broker.bootstrap) as client:
        for version in (1, newest):
            answers = list_offsets(
                client, f"missing-{uuid.uuid4().hex[:8]}", {0: 0}, version=version
            )
            assert answers[0].error_code == ErrorCode.unknown_topic_or_partition
            answers = list_offsets(client, topics["none"], {1: LATEST}, version=version)
            assert answers[1].error_code == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize("layout", ["none", "gzip", "zstd"])
def test_by_timestamp_confluent_kafka(broker, topics, layout):
    from confluent_kafka import Consumer, TopicPartition

    topic = topics[layout]
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"lo-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        wanted = [TopicPartition(topic, 0, target) for target, _ in BY_TIMESTAMP]
        # One lookup per call: a request carries each partition once.
        for (target, (offset, _ts)), tp in zip(BY_TIMESTAMP, wanted, strict=True):
            (found,) = consumer.offsets_for_times([tp], timeout=10)
            assert found.error is None
            assert found.offset == offset, f"T={target}"
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 7)
    finally:
        consumer.close()


@pytest.mark.parametrize("layout", ["none", "gzip", "zstd"])
def test_by_timestamp_kafka_python(broker, topics, layout):
    from kafka import KafkaConsumer, TopicPartition

    topic = topics[layout]
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id=None, request_timeout_ms=15_000
    )
    try:
        for target, (offset, timestamp) in BY_TIMESTAMP:
            found = consumer.offsets_for_times({tp: target}, timeout_ms=10_000)[tp]
            if offset < 0:
                assert found is None, f"T={target}"
            else:
                assert (found.offset, found.timestamp) == (offset, timestamp), f"T={target}"
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 7}
    finally:
        consumer.close()
