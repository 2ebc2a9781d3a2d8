"""End-to-end latency at 1,000 records/s for 50 s right after a backlog of 600,000
records in one partition, across compaction's burst (its level-1 and level-2 jobs start
30 s after the backlog was written). Arguments: one variant each, 'NAME=VALUE;...;'
environment variables for the agent (none: '') then comma-separated `bucketlog serve`
arguments ('' for the defaults). Thirty-third pass of integration/bench/README.md."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import run as bench  # noqa: E402


def one(spec: str, seconds: float) -> dict[str, float]:
    *env_parts, serve = spec.split(";")
    env = dict(part.split("=", 1) for part in env_parts if part)
    system = bench.Bucketlog(1, [a for a in serve.split(",") if a], env=env)
    system.start()
    try:
        bench.create_topic(system.bootstrap, "w", 1)
        bench.producer_perf(system.bootstrap, "w", 600_000, "none")
        bench.create_topic(system.bootstrap, "e", 1)
        r = bench.end_to_end(system.bootstrap, "e", 1000, seconds)
        return {k: round(v, 1) for k, v in r.items() if k.endswith(("p50_ms", "p99_ms"))}
    finally:
        system.stop()


for spec in sys.argv[1:]:
    print(spec or "default", one(spec, 50), flush=True)
