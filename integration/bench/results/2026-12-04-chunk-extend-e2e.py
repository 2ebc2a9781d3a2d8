"""End to end on two builds, interleaved: the agent's CPU and the counters of its chunk
cache and metadata store (its stats file, broker/stats.py) over the same workload.

    CMD_A="<before: a bucketlog command>" CMD_B="<after>" \
        .venv/bin/python integration/bench/results/2026-12-04-chunk-extend-e2e.py RUNS

Each run starts a fresh one-agent broker of each build in turn (the order alternating
run by run), warms it up with 3 s of end to end, then runs run.py's end_to_end (1,000
records/s of 1 KiB for 10 s, a tailing confluent-kafka consumer) and prints one JSON
line: the agent's CPU seconds over the run and 1.5 s after it, the end-to-end p99, and
the differences of the counters. (2026-12-04-chunk-extend-e2e.md: RUNS=4, CMD_B running
the change's tree through PYTHONPATH.)
"""

import glob
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run as bench  # noqa: E402


def counters(system: bench.Bucketlog) -> dict[str, Any]:
    (path,) = glob.glob(str(system.dir / "data" / "stats-*.json"))
    with open(path) as f:
        return dict(json.load(f))


def one(label: str, command: str, run: int) -> dict[str, Any]:
    system = bench.Bucketlog(1, command=command)
    system.start()
    try:
        bench.create_topic(system.bootstrap, "warm", 1)
        bench.create_topic(system.bootstrap, "t1", 1)
        bench.end_to_end(system.bootstrap, "warm", 1000, 3)
        time.sleep(2)
        before, cpu = counters(system), bench.tree_cpu_seconds(system.root_pid)
        result = bench.end_to_end(system.bootstrap, "t1", 1000, 10)
        time.sleep(1.5)
        after, cpu = counters(system), bench.tree_cpu_seconds(system.root_pid) - cpu

        def grew(section: str, name: str) -> int:
            return int(after[section].get(name, 0) - before[section].get(name, 0))

        return {
            "label": label,
            "run": run,
            "cpu_s": round(cpu, 2),
            "e2e_p99": round(result["e2e_p99_ms"], 2),
            "chunk_misses": grew("chunk_cache", "misses"),
            "chunk_hits": grew("chunk_cache", "hits"),
            "chunk_extended": grew("chunk_cache", "extended"),
            "md_reads": grew("metadata", "reads"),
            "md_commits": grew("metadata", "commits"),
        }
    finally:
        system.stop()


def main() -> None:
    builds = {"before": os.environ["CMD_A"], "after": os.environ["CMD_B"]}
    for run in range(int(sys.argv[1])):
        order = list(builds) if run % 2 == 0 else list(builds)[::-1]
        for label in order:
            print(json.dumps(one(label, builds[label], run)), flush=True)


if __name__ == "__main__":
    main()
