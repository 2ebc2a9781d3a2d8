"""End-to-end latency at 1,000 records/s right after a backlog, with compaction in its
own process or in the agent (arguments: true/false for --compaction-process, one agent
each, in that order). Thirtieth pass of integration/bench/README.md."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import run as bench  # noqa: E402


def one(flag: str) -> list[tuple[float, float]]:
    system = bench.Bucketlog(1, [f"--compaction-process={flag}"])
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


for flag in sys.argv[1:]:
    print(flag, one(flag), flush=True)
