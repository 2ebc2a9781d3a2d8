"""Half-load produce latency after run.py's produce matrix: two bucketlog variants,
interleaved.

    .venv/bin/python integration/bench/half_load_after.py --a "LABEL=ARGS" --b "LABEL=ARGS"
        [--rounds 2] [--rate 35000] [--out FILE.jsonl]

run.py's half-load row follows its produce matrix: by then the agent's compaction has
gigabytes to merge, and the row's produce p99 depends on how the flushes share the disk
with it. This puts one agent (the bench's Bucketlog, local store, each started after a
sync and the settle time) through that history: a warm-up of 300,000 records into one
partition, three produce-1p runs of 150,000, three runs each of the 64-partition rows
(one producer, three producers, three producers again), and then three half-load runs
(one ProducerPerformance at RATE records/s for 12 s, the steady-state percentiles after
2 s of warm-up). A variant is a label and extra `bucketlog serve` arguments;
`BENCH_BUCKETLOG_A` / `BENCH_BUCKETLOG_B` may name another command for each. Each round
runs both variants, the order alternating round by round. Printed, and written as JSON
lines with --out: every half-load run's p50 / p99 / max (steady state), the whole-run
p99, PUTs per GB and the agent's CPU per GB. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402
from paired import parse_variant  # noqa: E402

SHOWN = (
    "p50_ms",
    "p99_ms",
    "max_ms",
    "all_p99_ms",
    "puts_per_gb",
    "broker_cpu_s_per_gb",
    "broker_workers_cpu_s",
)


def one_run(extra: list[str], command: str | None, rate: int) -> list[dict[str, Any]]:
    bench.settle_disk(lambda line: None)
    system = bench.Bucketlog(1, extra, command=command)
    system.start()
    made = 0

    def topic(partitions: int) -> str:
        nonlocal made
        made += 1
        name = f"history-{made}"
        bench.create_topic(system.bootstrap, name, partitions)
        return name

    try:
        bench.producers_perf(system.bootstrap, topic(1), 1, 300_000, "none")
        for _ in range(3):
            bench.producers_perf(system.bootstrap, topic(1), 1, 150_000, "none")
        for producers in (1, 3, 3):
            for _ in range(3):
                bench.producers_perf(system.bootstrap, topic(64), producers, 150_000, "none")
        runs = []
        for _ in range(3):
            t = topic(1)
            result = bench.measure(
                system,
                rate * 12 * bench.RECORD_SIZE / 1e6,
                lambda t=t: bench.producers_perf(
                    system.bootstrap, t, 1, rate * 12, "none", rate, rate * 2
                ),
            )
            runs.append({k: result.get(k) for k in SHOWN})
        return runs
    finally:
        system.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="LABEL=ARGS of the first variant")
    parser.add_argument("--b", required=True, help="LABEL=ARGS of the second variant")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=35_000, help="records/s of the half load")
    parser.add_argument("--out", help="append the results to this file (JSON lines)")
    args = parser.parse_args()
    variants = [parse_variant(args.a), parse_variant(args.b)]
    commands = [os.environ.get("BENCH_BUCKETLOG_A"), os.environ.get("BENCH_BUCKETLOG_B")]
    for round_ in range(args.rounds):
        for index in [0, 1] if round_ % 2 == 0 else [1, 0]:
            label, extra = variants[index]
            runs = one_run(extra, commands[index], args.rate)
            line = {"round": round_ + 1, "variant": label, "args": extra, "rate": args.rate}
            line["runs"] = runs
            bench.print_line(line, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
