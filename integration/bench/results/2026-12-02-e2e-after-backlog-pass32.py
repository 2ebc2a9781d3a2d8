"""End-to-end latency at 1,000 records/s right after a backlog, as the thirtieth pass's
2026-12-02-e2e-after-backlog-pass30.py, for any `bucketlog serve` arguments: each
argument is one variant, its serve arguments comma-separated ('' for the defaults).
Per variant: 600,000 records produced to one partition, then three end-to-end runs of
12 s on new topics; printed (produce p99 ms, end-to-end p99 ms) of each run and the
seconds the variant took. Thirty-second pass of integration/bench/README.md."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import run as bench  # noqa: E402


def one(args: list[str]) -> list[tuple[float, float]]:
    system = bench.Bucketlog(1, args)
    system.start()
    try:
        bench.create_topic(system.bootstrap, "w", 1)
        bench.producer_perf(system.bootstrap, "w", 600_000, "none")
        out = []
        for i in range(3):
            bench.create_topic(system.bootstrap, f"e{i}", 1)
            r = bench.end_to_end(system.bootstrap, f"e{i}", 1000, 12)
            out.append((round(r["produce_p99_ms"], 1), round(r["e2e_p99_ms"], 1)))
        return out
    finally:
        system.stop()


for spec in sys.argv[1:]:
    began = time.time()
    result = one([a for a in spec.split(",") if a])
    print(spec or "default", result, round(time.time() - began), flush=True)
