"""Before/after of one change: two bucketlog variants, interleaved, on the workloads of
run.py that the change targets.

Usage: integration/bench/paired.py --a "LABEL=ARGS" --b "LABEL=ARGS" [--runs 3]
           [--workloads produce-1p,consume-1p,python-confluent-kafka,half-load,end-to-end]
           [--half-load-rate 30000] [--out FILE.md]

A variant is a label and the extra `bucketlog serve` arguments (e.g. "asyncio=--event-loop
asyncio"); `BENCH_BUCKETLOG_A` / `BENCH_BUCKETLOG_B` may name another command for each
(e.g. an older checkout's `bucketlog`). A script that runs `broker.cli.main` from another
tree must do so under `if __name__ == "__main__"`: compaction's worker processes are
spawned, and import the main module again; without the guard each runs the agent's
command line instead of a worker, and the agent runs without compaction. Each run starts a fresh one-agent broker of each
variant in turn (the order alternates run by run: AB, BA, AB, ...), warms it up, runs the
workloads once, and stops it, so that both variants see the machine in the same states.
Figures are run.py's: MB/s of the tool, broker CPU s per GB, GETs and metadata reads per
GB; for half-load (one Java producer at a fixed `--half-load-rate` records/s for 12 s)
the steady-state produce p99 after 2 s of warm-up, and for end-to-end (run.py's: 1,000
records/s for 12 s, a tailing consumer) the produce and end-to-end p99. The table gives
every run and the medians.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402

RECORDS = 150_000
PY_RECORDS = 500_000
WARM_UP = 100_000
WORKLOADS = ("produce-1p", "consume-1p", "python-confluent-kafka", "half-load", "end-to-end")
FIGURES = (
    "mb_s",
    "produce_mb_s",
    "consume_mb_s",
    "broker_cpu_s_per_gb",
    "p99_ms",
    "produce_p99_ms",
    "e2e_p99_ms",
    "puts_per_gb",
)


def one_run(
    label: str, extra: list[str], command: str | None, workloads: list[str], half_rate: int
) -> dict:
    system = bench.Bucketlog(1, extra, command=command)
    system.start()
    out: dict[str, Any] = {}
    try:
        warm = f"warm-{label}"
        bench.create_topic(system.bootstrap, warm, 1)
        bench.producers_perf(system.bootstrap, warm, 1, WARM_UP, "none")
        bench.consumer_perf(system.bootstrap, warm, WARM_UP)
        mb = RECORDS * bench.RECORD_SIZE / 1e6
        produced = f"p1-{label}"
        bench.create_topic(system.bootstrap, produced, 1)
        if "produce-1p" in workloads or "consume-1p" in workloads:
            result = bench.measure(
                system,
                mb,
                lambda: bench.producers_perf(system.bootstrap, produced, 1, RECORDS, "none"),
            )
            if "produce-1p" in workloads:
                out["produce-1p"] = result
        if "consume-1p" in workloads:
            out["consume-1p"] = bench.measure(
                system, mb, lambda: bench.consumer_perf(system.bootstrap, produced, RECORDS)
            )
        if "python-confluent-kafka" in workloads:
            py = f"py-{label}"
            bench.create_topic(system.bootstrap, py, 1)
            out["python-confluent-kafka"] = bench.measure(
                system,
                2 * PY_RECORDS * bench.RECORD_SIZE / 1e6,
                lambda: bench.python_workload(system.bootstrap, py, PY_RECORDS),
            )
        if "half-load" in workloads:
            half = f"half-{label}"
            bench.create_topic(system.bootstrap, half, 1)
            out["half-load"] = bench.measure(
                system,
                half_rate * 12 * bench.RECORD_SIZE / 1e6,
                lambda: bench.producers_perf(
                    system.bootstrap, half, 1, half_rate * 12, "none", half_rate, half_rate * 2
                ),
            )
        if "end-to-end" in workloads:
            e2e = f"e2e-{label}"
            bench.create_topic(system.bootstrap, e2e, 1)
            out["end-to-end"] = bench.measure(
                system,
                1000 * 12 * bench.RECORD_SIZE / 1e6,
                lambda: bench.end_to_end(system.bootstrap, e2e, 1000, 12),
            )
    finally:
        system.stop()
    return out


def ran_by(command: str | None) -> str:
    """The agent command of a variant, where it is not this checkout's `bucketlog`."""
    return f" run by `{command}`" if command else ""


def parse_variant(text: str) -> tuple[str, list[str]]:
    label, _, args = text.partition("=")
    return label, args.split()


def table(results: dict[str, list[dict]], workloads: list[str]) -> list[str]:
    lines = ["| workload | figure | " + " | ".join(results) + " | b / a (medians) |"]
    lines.append("|---|---|" + "---|" * len(results) + "---|")
    a, b = list(results)
    for workload in workloads:
        for figure in FIGURES:
            cells, medians = [], []
            for label in (a, b):
                values = [
                    r[workload][figure] for r in results[label] if figure in r.get(workload, {})
                ]
                if not values:
                    break
                med = statistics.median(values)
                medians.append(med)
                runs = ", ".join(f"{v:g}" for v in values)
                cells.append(f"**{med:.4g}** ({runs})")
            if len(medians) == 2:
                ratio = f"{medians[1] / medians[0]:.2f}" if medians[0] else "-"
                lines.append(f"| {workload} | {figure} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="LABEL=ARGS of the first variant")
    parser.add_argument("--b", required=True, help="LABEL=ARGS of the second variant")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS[:3]))
    parser.add_argument(
        "--half-load-rate", type=int, default=30_000, help="records/s of the half-load workload"
    )
    parser.add_argument("--out", help="write the table to this markdown file too")
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    variants = [parse_variant(args.a), parse_variant(args.b)]
    commands = [os.environ.get("BENCH_BUCKETLOG_A"), os.environ.get("BENCH_BUCKETLOG_B")]
    results: dict[str, list[dict]] = {label: [] for label, _ in variants}
    started = datetime.datetime.now(datetime.UTC)
    for run in range(args.runs):
        order = [0, 1] if run % 2 == 0 else [1, 0]
        for index in order:
            label, extra = variants[index]
            result = one_run(label, extra, commands[index], workloads, args.half_load_rate)
            results[label].append(result)
            summary = {w: {f: r[f] for f in FIGURES if f in r} for w, r in result.items()}
            print(f"[{datetime.datetime.now():%H:%M:%S}] run {run + 1} {label}: {summary}")
    lines = [
        f"# Paired: {variants[0][0]} vs {variants[1][0]}",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {args.runs} interleaved runs each, one agent;"
        f" a: `{' '.join(variants[0][1]) or '(defaults)'}`{ran_by(commands[0])},"
        f" b: `{' '.join(variants[1][1]) or '(defaults)'}`{ran_by(commands[1])}."
        f" Machine: {bench.machine()}",
        "",
        *table(results, workloads),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
