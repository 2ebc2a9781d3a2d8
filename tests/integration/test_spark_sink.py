"""Spark's Kafka sink (`df.write.format("kafka")` and `writeStream.format("kafka")`):
the Java producer Spark uses (idempotent by default) writes into bucketlog, and
kafka-python reads back exactly the rows Spark was given."""

from __future__ import annotations

import time

import pytest

from tests.integration.support import (
    Rec,
    assert_dense,
    consume_all,
    create_topic,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.slow

SCHEMA = "key string, value binary, headers array<struct<key:string,value:binary>>, partition int"


def content(recs: list[Rec]) -> list[tuple]:
    """What a writer decides: partition, key, value and headers, not offsets or times."""
    return sorted((r.partition, r.key or b"", r.value or b"", r.headers) for r in recs)


def test_batch_write(spark, shared_broker):
    bootstrap = shared_broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("spark-sink"), 3)
    rows = [
        (
            None if i % 10 == 0 else f"key-{i}",
            f"value-{i}".encode() * (1 + i % 7),
            [("n", str(i).encode()), ("n", b"again")] if i % 3 else [],
            i % 3,
        )
        for i in range(300)
    ]
    # 4 Spark partitions: 4 tasks, each with its own producer, write concurrently.
    df = spark.createDataFrame(rows, SCHEMA).repartition(4)
    before = int(time.time() * 1000)
    df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    after = int(time.time() * 1000)

    read = consume_all(bootstrap, topic)
    assert_dense(read)
    assert content(read) == sorted(
        (p, (k or "").encode(), v, tuple((hk, hv) for hk, hv in h)) for k, v, h, p in rows
    )
    assert [r.key for r in read].count(None) == 30
    # Spark sets no timestamp: the producer stamps the time of sending.
    assert all(before - 1000 <= r.timestamp <= after + 1000 for r in read)


def test_batch_write_topic_column(spark, shared_broker):
    bootstrap = shared_broker.bootstrap
    a = create_topic(bootstrap, unique_topic("spark-sink-a"), 1)
    b = create_topic(bootstrap, unique_topic("spark-sink-b"), 2)
    rows = [(a if i % 2 else b, f"k{i}", f"v{i}") for i in range(50)]
    spark.createDataFrame(rows, "topic string, key string, value string").write.format(
        "kafka"
    ).option("kafka.bootstrap.servers", bootstrap).save()

    for topic in (a, b):
        read = consume_all(bootstrap, topic)
        assert_dense(read)
        assert sorted((r.key, r.value) for r in read) == sorted(
            (k.encode(), v.encode()) for t, k, v in rows if t == topic
        )


def test_streaming_write(spark, shared_broker, tmp_path):
    """A streaming query copying one topic into another, run twice from one checkpoint:
    every source partition is read by one task and written, in order, to the same
    partition, so the copy has the source's offsets too."""
    bootstrap = shared_broker.bootstrap
    source = create_topic(bootstrap, unique_topic("stream-src"), 2)
    sink = create_topic(bootstrap, unique_topic("stream-dst"), 2)

    def produce_source(start: int, count: int) -> None:
        produce(
            bootstrap,
            source,
            [
                (
                    i % 2,
                    1_720_000_000_000 + i,
                    f"k{i}".encode(),
                    f"v{i}".encode(),
                    (("i", str(i).encode()),),
                )
                for i in range(start, start + count)
            ],
        )

    def run() -> None:
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", "25")
            .load()
            .selectExpr("key", "value", "headers", "partition")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    def same_records() -> None:
        src, dst = consume_all(bootstrap, source), consume_all(bootstrap, sink)
        assert [(r.partition, r.offset, r.key, r.value, r.headers) for r in dst] == [
            (r.partition, r.offset, r.key, r.value, r.headers) for r in src
        ]

    produce_source(0, 60)
    run()
    same_records()
    produce_source(60, 40)
    run()
    same_records()
    assert len(consume_all(bootstrap, sink)) == 100
