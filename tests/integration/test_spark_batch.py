"""Spark's Kafka source in batch mode (`spark.read.format("kafka")`) against bucketlog.

One topic of three partitions is produced once with confluent-kafka: explicit
timestamps (not monotonic inside a partition, so a lookup by timestamp must find the
*first* offset at or after the time, as Kafka does), null keys and values, headers with
repeated keys and null values. Every read compares each row's topic, partition, offset,
timestamp, key, value and headers with what the producer was acknowledged.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.spark_rows import to_recs, without_headers
from tests.integration.support import (
    Rec,
    create_topic,
    missing_groups_or_transactions,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.slow

BASE_TS = 1_700_000_000_000
PARTITIONS = 3
PER_PARTITION = 8


def timestamp_of(partition: int, i: int) -> int:
    # Record 4 of each partition goes back in time, between records 1 and 2.
    step = 150 if i == 4 else i * 100
    return BASE_TS + partition * 10_000 + step


def headers_of(partition: int, i: int) -> tuple[tuple[str, bytes | None], ...]:
    return (
        (),
        (("trace", f"{partition}-{i}".encode()),),
        (("dup", b"first"), ("dup", b"second"), ("empty", b"")),
        (("null-value", None),),
    )[i % 4]


@pytest.fixture(scope="module")
def produced(shared_broker) -> list[Rec]:
    topic = create_topic(shared_broker.bootstrap, unique_topic("spark-batch"), PARTITIONS)
    records = []
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            key = None if i == 5 else f"key-{p}-{i}".encode()
            value = None if i == 6 else json.dumps({"p": p, "i": i}).encode()
            records.append((p, timestamp_of(p, i), key, value, headers_of(p, i)))
    acked = produce(shared_broker.bootstrap, topic, records)
    assert sorted((r.partition, r.offset) for r in acked) == [
        (p, i) for p in range(PARTITIONS) for i in range(PER_PARTITION)
    ]
    return sorted(acked)


def kafka_read(spark, broker, **options):
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def topic_of(produced: list[Rec]) -> str:
    return produced[0].topic


def test_earliest_to_latest(spark, shared_broker, produced):
    topic = topic_of(produced)
    implicit = kafka_read(spark, shared_broker, subscribe=topic)
    assert to_recs(implicit) == without_headers(produced)
    explicit = kafka_read(
        spark, shared_broker, subscribe=topic, startingOffsets="earliest", endingOffsets="latest"
    )
    assert to_recs(explicit) == without_headers(produced)


def test_include_headers(spark, shared_broker, produced):
    df = kafka_read(spark, shared_broker, subscribe=topic_of(produced), includeHeaders="true")
    assert "headers" in df.columns
    assert to_recs(df, headers=True) == produced


def test_schema(spark, shared_broker, produced):
    df = kafka_read(spark, shared_broker, subscribe=topic_of(produced), includeHeaders="true")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {
        "key": "binary",
        "value": "binary",
        "topic": "string",
        "partition": "int",
        "offset": "bigint",
        "timestamp": "timestamp",
        "timestampType": "int",
        "headers": "array<struct<key:string,value:binary>>",
    }
    # 0: CreateTime, the producer's own timestamps.
    assert {row[0] for row in df.select("timestampType").collect()} == {0}


def test_per_partition_json_offsets(spark, shared_broker, produced):
    topic = topic_of(produced)
    # -2 is earliest and -1 latest, as in Kafka's ListOffsets.
    starting = {topic: {"0": 2, "1": -2, "2": 5}}
    ending = {topic: {"0": 6, "1": 3, "2": -1}}
    df = kafka_read(
        spark,
        shared_broker,
        subscribe=topic,
        includeHeaders="true",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    bounds = {0: (2, 6), 1: (0, 3), 2: (5, PER_PARTITION)}
    expected = [r for r in produced if bounds[r.partition][0] <= r.offset < bounds[r.partition][1]]
    assert to_recs(df, headers=True) == expected


def first_offset_at_or_after(produced: list[Rec], partition: int, ts: int) -> int:
    offsets = [r.offset for r in produced if r.partition == partition and r.timestamp >= ts]
    return min(offsets) if offsets else PER_PARTITION


def test_offsets_by_timestamp(spark, shared_broker, produced):
    topic = topic_of(produced)
    # Partition 0: exactly record 3's timestamp. Partition 1: between records 1 and 2,
    # where record 4 (later offset, earlier time) also qualifies: the answer is offset 2.
    # Partition 2: before everything.
    start_ts = {0: timestamp_of(0, 3), 1: timestamp_of(1, 1) + 20, 2: BASE_TS}
    # Ending: partition 0 at record 6's time, 1 exactly at record 4's (offset 2 has a
    # later time, so the end is offset 2), 2 between records 6 and 7.
    end_ts = {0: timestamp_of(0, 6), 1: timestamp_of(1, 4), 2: timestamp_of(2, 6) + 1}
    df = kafka_read(
        spark,
        shared_broker,
        subscribe=topic,
        includeHeaders="true",
        startingOffsetsByTimestamp=json.dumps({topic: {str(p): t for p, t in start_ts.items()}}),
        endingOffsetsByTimestamp=json.dumps({topic: {str(p): t for p, t in end_ts.items()}}),
    )
    starts = {p: first_offset_at_or_after(produced, p, t) for p, t in start_ts.items()}
    ends = {p: first_offset_at_or_after(produced, p, t) for p, t in end_ts.items()}
    assert starts == {0: 3, 1: 2, 2: 0}
    assert ends == {0: 6, 1: 2, 2: 7}
    expected = [r for r in produced if starts[r.partition] <= r.offset < ends[r.partition]]
    assert to_recs(df, headers=True) == expected


def test_starting_timestamp_for_every_partition(spark, shared_broker, produced):
    topic = topic_of(produced)
    # Past the last record of partition 0: it has no offset for that time. The "latest"
    # strategy then starts it at its end (the default strategy fails the query).
    ts = timestamp_of(1, 3)
    df = kafka_read(
        spark,
        shared_broker,
        subscribe=topic,
        startingTimestamp=str(ts),
        startingOffsetsByTimestampStrategy="latest",
    )
    starts = {p: first_offset_at_or_after(produced, p, ts) for p in range(PARTITIONS)}
    assert starts == {0: PER_PARTITION, 1: 3, 2: 0}
    expected = [r for r in produced if r.offset >= starts[r.partition]]
    assert to_recs(df) == without_headers(expected)


def test_subscribe_pattern_and_several_topics(spark, shared_broker, produced):
    tag = unique_topic("pattern")
    bootstrap = shared_broker.bootstrap
    a = create_topic(bootstrap, f"{tag}-a", 2)
    b = create_topic(bootstrap, f"{tag}-b", 1)
    other = create_topic(bootstrap, f"other-{tag}", 1)
    recs = []
    for topic, partitions in ((a, 2), (b, 1), (other, 1)):
        recs += produce(
            bootstrap,
            topic,
            [
                (p, BASE_TS + i, f"{topic}-{i}".encode(), b"v", ())
                for p in range(partitions)
                for i in range(3)
            ],
        )
    wanted = sorted(r for r in recs if r.topic != other)

    by_pattern = kafka_read(spark, shared_broker, subscribePattern=f"{tag}-.*")
    assert to_recs(by_pattern) == wanted
    by_list = kafka_read(spark, shared_broker, subscribe=f"{a},{b}")
    assert to_recs(by_list) == wanted


def test_assign(spark, shared_broker, produced):
    topic = topic_of(produced)
    df = kafka_read(spark, shared_broker, assign=json.dumps({topic: [0, 2]}), includeHeaders="true")
    assert to_recs(df, headers=True) == [r for r in produced if r.partition in (0, 2)]


def test_min_partitions(spark, shared_broker, produced):
    df = kafka_read(spark, shared_broker, subscribe=topic_of(produced), minPartitions="6")
    # Spark splits each partition's offset range in proportion to its size: 3 partitions
    # of 8 records, 6 wanted -> each range in 2, read by 6 tasks.
    assert df.rdd.getNumPartitions() == 6
    assert to_recs(df) == without_headers(produced)


def test_read_committed(spark, shared_broker):
    reason = missing_groups_or_transactions(shared_broker.port, transactions=True)
    if reason:
        pytest.skip(reason)
    from confluent_kafka import Producer

    bootstrap = shared_broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("spark-txn"), 2)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": unique_topic("spark-txn-id")}
    )
    producer.init_transactions(30)
    committed: list[bytes] = []

    def transaction(tag: str, count: int, commit: bool | None) -> None:
        producer.begin_transaction()
        for i in range(count):
            value = f"{tag}-{i}".encode()
            producer.produce(topic, value=value, partition=i % 2, timestamp=BASE_TS + i)
            if commit:
                committed.append(value)
        producer.flush(30)
        if commit is True:
            producer.commit_transaction(30)
        elif commit is False:
            producer.abort_transaction(30)

    transaction("c1", 4, True)
    transaction("a1", 3, False)
    transaction("c2", 3, True)
    transaction("open", 2, None)  # still open while Spark reads: beyond the LSO
    try:
        df = kafka_read(
            spark, shared_broker, subscribe=topic, **{"kafka.isolation.level": "read_committed"}
        )
        values = sorted(bytes(row.value) for row in df.select("value").collect())
        assert values == sorted(committed)

        # read_uncommitted sees every data record, aborted and open ones too; never the
        # transaction markers.
        df = kafka_read(spark, shared_broker, subscribe=topic)
        values = sorted(bytes(row.value) for row in df.select("value").collect())
        expected = [
            f"{t}-{i}".encode()
            for t, n in (("c1", 4), ("a1", 3), ("c2", 3), ("open", 2))
            for i in range(n)
        ]
        assert values == sorted(expected)
    finally:
        producer.abort_transaction(30)
