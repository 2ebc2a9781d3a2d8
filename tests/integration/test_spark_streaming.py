"""Spark's Kafka source in Structured Streaming, resumed from a checkpoint.

Each query copies (partition, offset, key, value, timestamp) of the topic into a Parquet
folder: Spark's file sink commits each micro-batch in its own log, so the folder holds
exactly what the committed batches read. Across runs and restarts from the same
checkpoint, the union must be the topic: every record once, no gap, no duplicate.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.support import Rec, create_topic, produce, unique_topic

pytestmark = pytest.mark.slow

PARTITIONS = 3
BASE_TS = 1_710_000_000_000


def records(start: int, count: int) -> list[tuple[int, int, bytes, bytes, tuple]]:
    return [
        (i % PARTITIONS, BASE_TS + i, f"k{i}".encode(), f"value-{i}".encode(), ())
        for i in range(start, start + count)
    ]


def stream(spark, broker, topic: str, max_offsets_per_trigger: int):
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        .load()
        .selectExpr("topic", "partition", "offset", "unix_millis(timestamp) AS ts", "key", "value")
    )


def copied(spark, output) -> list[Rec]:
    rows = spark.read.parquet(str(output)).collect()
    return sorted(
        Rec(r.topic, r.partition, r.offset, r.ts, bytes(r.key), bytes(r.value)) for r in rows
    )


def batches_with_rows(query) -> int:
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def test_available_now_twice_from_one_checkpoint(spark, shared_broker, tmp_path):
    topic = create_topic(shared_broker.bootstrap, unique_topic("stream-now"), PARTITIONS)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    produced = produce(shared_broker.bootstrap, topic, records(0, 90))

    def run() -> int:
        query = (
            stream(spark, shared_broker, topic, max_offsets_per_trigger=40)
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return batches_with_rows(query)

    # 90 records, at most 40 per trigger: the first run takes 3 micro-batches.
    assert run() == 3
    assert copied(spark, output) == sorted(produced)

    produced += produce(shared_broker.bootstrap, topic, records(90, 45))
    assert run() == 2  # only the 45 new records
    assert copied(spark, output) == sorted(produced)

    # Nothing new: a third run reads nothing.
    assert run() == 0
    assert copied(spark, output) == sorted(produced)


def test_processing_time_query_stopped_and_restarted(spark, shared_broker, tmp_path):
    topic = create_topic(shared_broker.bootstrap, unique_topic("stream-restart"), PARTITIONS)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    produced: list[Rec] = []
    total = 300

    def producer() -> None:
        # 300 records in 15 steps over ~3 s, while the queries run and stop.
        for start in range(0, total, 20):
            produced.extend(produce(shared_broker.bootstrap, topic, records(start, 20)))
            time.sleep(0.2)

    def start():
        return (
            stream(spark, shared_broker, topic, max_offsets_per_trigger=30)
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        query = start()
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in query.recentProgress) < 60:
            assert query.exception() is None and time.monotonic() < deadline
            time.sleep(0.1)
        query.stop()
        first_run = copied(spark, output)
        # Stopped mid-stream: at most 30 records per micro-batch, stopped after 60 or so.
        assert 0 < len(first_run) < total

        query = start()
        thread.join(60)
        assert not thread.is_alive()
        query.processAllAvailable()
        query.stop()
        assert query.exception() is None
    finally:
        thread.join(60)
    assert len(produced) == total
    result = copied(spark, output)
    assert result == sorted(produced)
    assert set(first_run) <= set(result)
