"""The example job integration/pipeline.py: JSON events -> per-window counts, run twice
from one checkpoint (as a user would stop and restart it), with a late event dropped by
the watermark."""

from __future__ import annotations

import json

import pytest

from tests.integration.support import consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.slow


def event(partition: int, time: str, kind: str | None, amount: float | None = None):
    body = {"time": f"2024-05-01T{time}Z", "kind": kind}
    if amount is not None:
        body["amount"] = amount
    return (partition, 1_714_564_800_000, None, json.dumps(body).encode(), ())


def results(bootstrap: str, topic: str) -> dict[str, dict]:
    out = {}
    for r in consume_all(bootstrap, topic):
        value = json.loads(r.value)
        assert r.key.decode() == f"{value['window_start']}/{value['kind']}"
        assert r.key.decode() not in out, "append mode writes each window once"
        out[r.key.decode()] = value
    return out


def window(start: str, end: str, kind: str, events: int, amount: float) -> dict:
    return {
        "window_start": f"2024-05-01T{start}Z",
        "window_end": f"2024-05-01T{end}Z",
        "kind": kind,
        "events": events,
        "amount": amount,
    }


def test_pipeline_windows_watermark_and_restart(spark, shared_broker, tmp_path):
    import pipeline

    bootstrap = shared_broker.bootstrap
    source = create_topic(bootstrap, unique_topic("events"), 2)
    sink = create_topic(bootstrap, unique_topic("event-counts"), 1)

    def run() -> None:
        query = pipeline.start(
            spark,
            bootstrap=bootstrap,
            input_topic=source,
            output_topic=sink,
            checkpoint=str(tmp_path / "checkpoint"),
            window="1 minute",
            watermark="30 seconds",
            available_now=True,
        )
        query.awaitTermination(120)
        assert query.exception() is None

    produce(
        bootstrap,
        source,
        [
            event(0, "12:00:03", "click", 1.0),
            event(1, "12:00:40", "click", 2.5),
            event(0, "12:00:10", "view"),
            event(1, "12:01:05", "click", 4.0),
            event(0, "12:01:59", "view"),
            (0, 1_714_564_800_000, None, b"not json", ()),
            event(1, "12:01:30", None),  # no kind: dropped
            # Moves the watermark to 12:02:30: the first two windows are final.
            event(0, "12:03:00", "view"),
        ],
    )
    run()
    first = {
        "2024-05-01T12:00:00Z/click": window("12:00:00", "12:01:00", "click", 2, 3.5),
        "2024-05-01T12:00:00Z/view": window("12:00:00", "12:01:00", "view", 1, 0.0),
        "2024-05-01T12:01:00Z/click": window("12:01:00", "12:02:00", "click", 1, 4.0),
        "2024-05-01T12:01:00Z/view": window("12:01:00", "12:02:00", "view", 1, 0.0),
    }
    assert results(bootstrap, sink) == first

    produce(
        bootstrap,
        source,
        [
            event(1, "12:00:30", "click", 100.0),  # later than the watermark: dropped
            event(1, "12:03:20", "click", 0.5),
            event(0, "12:05:00", "view"),  # watermark 12:04:30: 12:03 is final
        ],
    )
    run()
    assert results(bootstrap, sink) == {
        **first,
        "2024-05-01T12:03:00Z/click": window("12:03:00", "12:04:00", "click", 1, 0.5),
        "2024-05-01T12:03:00Z/view": window("12:03:00", "12:04:00", "view", 1, 0.0),
    }


def test_pipeline_arguments():
    import pipeline

    args = pipeline.parse_args(
        ["--bootstrap", "127.0.0.1:9999", "--input", "a", "--output", "b", "--available-now"]
    )
    assert (args.bootstrap, args.input, args.output, args.available_now) == (
        "127.0.0.1:9999",
        "a",
        "b",
        True,
    )
    assert (args.window, args.watermark, args.output_mode) == ("1 minute", "30 seconds", "append")
