"""A partition read through again from its start, on two builds, interleaved.

    CMD_A="<before: a bucketlog command>" CMD_B="<after>" \
        .venv/bin/python integration/bench/results/2026-12-05-reread.py RUNS

Each run starts a fresh one-agent broker of each build in turn (the order alternating
run by run), writes 300,000 records of 1 KiB into a one-partition topic with
ProducerPerformance, waits 90 s (compaction merges the topic's ingest files) and reads
the topic three times from its start with ConsumerPerformance, each a new consumer. One
JSON line a read: its MB/s, the agent's CPU seconds over it (compaction's workers apart)
and what its read-ahead and its own reads did (broker/stats.py's counters).
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run as bench  # noqa: E402

RECORDS = 300_000


def one(label: str, command: str, run: int) -> None:
    system = bench.Bucketlog(1, command=command)
    system.start()
    try:
        bench.create_topic(system.bootstrap, "a", 1)
        bench.producers_perf(system.bootstrap, "a", 1, RECORDS, "none")
        time.sleep(90)
        for read in range(3):
            before, cpu = system.counters(), bench.tree_cpu_split(system.root_pid)
            result = bench.consumer_perf(system.bootstrap, "a", RECORDS)
            after, cpu_after = system.counters(), bench.tree_cpu_split(system.root_pid)

            def grew(name: str, before: Any = before, after: Any = after) -> int:
                return int(after.get(name, 0) - before.get(name, 0))

            line = {
                "label": label,
                "run": run,
                "read": read,
                "mb_s": round(result["mb_s"], 1),
                "agent_cpu_s": round(cpu_after[0] - cpu[0] - (cpu_after[1] - cpu[1]), 2),
                "workers_cpu_s": round(cpu_after[1] - cpu[1], 2),
                "read_ahead_requests": grew("read_ahead.requests"),
                "read_ahead_bytes": grew("read_ahead.bytes"),
                "fetch_gets": grew("reader.gets"),
                "fetch_get_bytes": grew("reader.bytes_got"),
            }
            print(json.dumps(line), flush=True)
    finally:
        system.stop()


runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
for run in range(runs):
    builds = [("A", os.environ["CMD_A"]), ("B", os.environ["CMD_B"])]
    for label, command in builds if run % 2 == 0 else builds[::-1]:
        one(label, command, run)
