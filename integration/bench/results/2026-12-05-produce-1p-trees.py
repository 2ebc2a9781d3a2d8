"""The main table's produce-1p row on several trees, interleaved.

    .venv/bin/python integration/bench/results/2026-12-05-produce-1p-trees.py \
        LABEL=TREE [LABEL=TREE ...] [--rounds 3] [--out FILE.jsonl]

Each round starts one agent of each tree in turn (run as `python -m broker` with the tree
on PYTHONPATH; the order rotates round by round) and does what run.py's main table does
before and in its first row: a warm-up of 300,000 records produced and consumed, a wait
until the agent is idle, then three ProducerPerformance runs of 300,000 records into a
new one-partition topic each. One JSON line per agent: each run's MB/s, the agent's CPU
s per GB and PUTs per GB (run.py's `measure`), and their medians.

2026-12-05-produce-1p-trees.jsonl (before: 3db0738; own-commit: ad51488; unqueued: ad51488
with 2026-12-05-unqueued-own-commit-trial.diff): medians of the agents 68.6, 87.0 and
77.3 MB/s before, 84.6, 77.2 and 84.2 own-commit, 83.6, 79.7 and 78.0 unqueued.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 300_000


def one_agent(label: str, tree: str) -> dict[str, Any]:
    command = f"env PYTHONPATH={tree} {B.VENV_BIN / 'python'} -m broker"
    system = B.Bucketlog(1, command=command)
    system.start()
    try:
        B.create_topic(system.bootstrap, "warmup", 1)
        B.producers_perf(system.bootstrap, "warmup", 1, RECORDS, "none")
        B.consumer_perf(system.bootstrap, "warmup", RECORDS)
        B.until_idle(system, B.tree_cpu_split(system.root_pid), 0)
        runs = []
        for i in range(3):
            topic = f"p1-{i}"
            B.create_topic(system.bootstrap, topic, 1)
            result = B.measure(
                system,
                RECORDS * B.RECORD_SIZE / 1e6,
                lambda t=topic: B.producers_perf(system.bootstrap, t, 1, RECORDS, "none"),
            )
            runs.append({k: result.get(k) for k in ("mb_s", "broker_cpu_s_per_gb", "puts_per_gb")})
    finally:
        system.stop()
    return {
        "tree": label,
        "runs": runs,
        **{
            f"median_{k}": statistics.median(r[k] for r in runs)
            for k in ("mb_s", "broker_cpu_s_per_gb", "puts_per_gb")
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="LABEL=PATH of a tree to run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="append the JSON lines to this file too")
    args = parser.parse_args()
    trees = [tuple(t.split("=", 1)) for t in args.trees]
    for round_ in range(args.rounds):
        shift = round_ % len(trees)
        for label, tree in trees[shift:] + trees[:shift]:
            B.print_line({"round": round_ + 1, **one_agent(label, tree)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
