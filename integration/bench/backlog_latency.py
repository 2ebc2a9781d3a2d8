"""Produce latency while compaction works off a backlog: the latency rows of run.py in
isolation.

One agent (the bench's Bucketlog, local store) is filled as run.py's produce matrix
fills it: nine 64-partition topics (one or three ProducerPerformance producers each) and
three 1000-partition topics, 300,000 records of 1 KiB each, about 3.7 GB, as fast as it
takes them. Right after, an end-to-end run (run.py's: a tailing consumer, records
produced at 1,000/s) lasts `--seconds`, while compaction merges what the fill wrote.
Printed: the end-to-end and produce percentiles, and from the agent's /metrics the p50
and p99 buckets of its Produce requests, flush uploads and metadata commits in that
window; then the compaction counters. Variants are `bucketlog serve` arguments:

    .venv/bin/python integration/bench/backlog_latency.py                 # defaults
    .venv/bin/python integration/bench/backlog_latency.py --compaction false
    .venv/bin/python integration/bench/backlog_latency.py --compaction-workers thread
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402

HISTOGRAMS = {
    "bucketlog_request_seconds": (("api", "Produce"),),
    "bucketlog_flush_upload_seconds": (),
    "bucketlog_metadata_commit_seconds": (),
    "bucketlog_flush_end_to_end_seconds": (),
}


def buckets(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name.endswith("_bucket")
    }


def quantiles(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per histogram: requests in the window and the bucket bounds of p50 and p99 (ms)."""
    out = {}
    for name, labels in HISTOGRAMS.items():
        points = sorted(
            (float(dict(key)["le"]), value - before.get((n, key), 0.0))
            for (n, key), value in after.items()
            if n == f"{name}_bucket" and tuple(k for k in key if k[0] != "le") == labels
        )
        total = points[-1][1] if points else 0
        if not total:
            continue

        def bound(q: float, points: list[tuple[float, float]] = points, total: float = total):
            return next(le for le, count in points if count >= q * total) * 1000

        out[name] = {"count": total, "p50_le_ms": bound(0.5), "p99_le_ms": bound(0.99)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=50)
    parser.add_argument("--metrics-port", type=int, default=0)
    args, serve_args = parser.parse_known_args()
    metrics_port = args.metrics_port or bench.free_port()
    system = bench.Bucketlog(1, extra_args=[*serve_args, "--metrics-port", str(metrics_port)])
    system.start()
    try:
        for i in range(9):
            topic = f"fill-{i}"
            bench.create_topic(system.bootstrap, topic, 64)
            bench.producers_perf(system.bootstrap, topic, 3 if i % 2 else 1, 300_000, "none")
        for i in range(3):
            topic = f"wide-{i}"
            bench.create_topic(system.bootstrap, topic, 1000)
            bench.producers_perf(system.bootstrap, topic, 1, 300_000, "none")
        bench.create_topic(system.bootstrap, "e2e", 1)
        before = buckets(metrics_port)
        result = bench.end_to_end(system.bootstrap, "e2e", 1000, args.seconds)
        agent = quantiles(before, buckets(metrics_port))
        stats = json.loads(next((system.dir / "data").glob("stats-*.json")).read_text())
    finally:
        system.stop()
    shown = ("e2e_p50_ms", "e2e_p99_ms", "produce_p50_ms", "produce_p99_ms", "broker_cores")
    print(json.dumps({"args": serve_args, **{k: result[k] for k in shown if k in result}}))
    print(json.dumps({"agent": agent}))
    compaction = {k: v for k, v in stats.get("compaction", {}).items() if k != "dirty_ratios"}
    print(json.dumps({"compaction": compaction}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
