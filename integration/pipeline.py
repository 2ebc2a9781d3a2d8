"""Example Structured Streaming job on bucketlog: JSON events in, windowed counts out.

It reads a topic of JSON events such as

    {"time": "2024-05-01T12:00:03Z", "kind": "click", "amount": 2.5}

groups them by event-time window (1 minute by default) and kind, and writes one record
per window and kind to another topic:

    key   2024-05-01T12:00:00Z/click
    value {"window_start":"2024-05-01T12:00:00Z","window_end":"2024-05-01T12:01:00Z",
           "kind":"click","events":3,"amount":7.5}

A watermark (30 seconds by default) bounds how late an event may be: once the newest
event time seen is more than that past a window's end, the window is final. In the
default "append" output mode each window is written once, when it becomes final; in
"update" mode it is rewritten after every micro-batch that changes it. Events later
than the watermark, and records that are not JSON objects with a "time" and a "kind",
are dropped.

Run it against `make run` (see "Use with Spark" in README.md):

    .venv/bin/python integration/pipeline.py --bootstrap 127.0.0.1:9092 \\
        --input events --output event-counts --checkpoint ./pipeline-checkpoint

The checkpoint folder holds the query's offsets and window state: run it again with the
same folder and it resumes where it stopped. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

EVENT_SCHEMA = "time STRING, kind STRING, amount DOUBLE"
ISO_UTC = "yyyy-MM-dd'T'HH:mm:ss'Z'"


def windowed_counts(events: DataFrame, window: str, watermark: str) -> DataFrame:
    """Kafka source rows (a binary `value` of JSON) -> one row per window and kind, with
    the output record's `key` and `value` as strings."""
    from pyspark.sql import functions as F

    parsed = (
        events.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select(
            F.to_timestamp("e.time").alias("event_time"),
            F.col("e.kind").alias("kind"),
            F.coalesce(F.col("e.amount"), F.lit(0.0)).alias("amount"),
        )
        .where(F.col("event_time").isNotNull() & F.col("kind").isNotNull())
    )
    counts = (
        parsed.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("window"), "kind")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
    )
    start = F.date_format("window.start", ISO_UTC)
    return counts.select(
        F.concat_ws("/", start, "kind").alias("key"),
        F.to_json(
            F.struct(
                start.alias("window_start"),
                F.date_format("window.end", ISO_UTC).alias("window_end"),
                "kind",
                "events",
                "amount",
            )
        ).alias("value"),
    )


def start(
    spark: SparkSession,
    *,
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    checkpoint: str,
    window: str = "1 minute",
    watermark: str = "30 seconds",
    output_mode: str = "append",
    starting_offsets: str = "earliest",
    trigger_seconds: float = 5.0,
    available_now: bool = False,
    max_offsets_per_trigger: int | None = None,
) -> StreamingQuery:
    """Start the job; the returned query runs until stopped (or, with available_now,
    until it has processed what the input held when it started)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", input_topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (
        windowed_counts(reader.load(), window, watermark)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("checkpointLocation", checkpoint)
        .outputMode(output_mode)
        .queryName(f"windowed-counts-{input_topic}")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Count JSON events per event-time window and kind, from one bucketlog "
        "topic to another, with Spark Structured Streaming."
    )
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker (default %(default)s)")
    p.add_argument("--input", default="events", help="topic of JSON events (%(default)s)")
    p.add_argument("--output", default="event-counts", help="topic of results (%(default)s)")
    p.add_argument(
        "--checkpoint",
        default="./pipeline-checkpoint",
        help="folder of the query's offsets and state; reuse it to resume (%(default)s)",
    )
    p.add_argument("--window", default="1 minute", help="window length (%(default)s)")
    p.add_argument(
        "--watermark", default="30 seconds", help="how late an event may be (%(default)s)"
    )
    p.add_argument(
        "--output-mode",
        choices=("append", "update"),
        default="append",
        help="append: each window once, when final; update: after every change (%(default)s)",
    )
    p.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a new checkpoint starts reading: earliest, latest or JSON (%(default)s)",
    )
    p.add_argument(
        "--trigger-seconds", type=float, default=5.0, help="micro-batch interval (%(default)s)"
    )
    p.add_argument(
        "--available-now",
        action="store_true",
        help="process what the input holds now, then exit (instead of running until Ctrl-C)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from spark_support import spark_session, stop_session

    spark = spark_session("bucketlog-pipeline")
    query = start(
        spark,
        bootstrap=args.bootstrap,
        input_topic=args.input,
        output_topic=args.output,
        checkpoint=args.checkpoint,
        window=args.window,
        watermark=args.watermark,
        output_mode=args.output_mode,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
    )
    print(
        f"pipeline: {args.input} -> {args.output} on {args.bootstrap} "
        f"({args.window} windows, {args.watermark} watermark, checkpoint {args.checkpoint})",
        file=sys.stderr,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        stop_session(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
