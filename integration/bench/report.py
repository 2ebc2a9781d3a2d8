"""Render a benchmark report (the JSON of run.py) as a markdown page.

Usage: integration/bench/report.py results/<date>.json > results/<date>.md
"""

from __future__ import annotations

import json
import sys
from typing import Any

# (workload, figure, label, higher is better)
ROWS: list[tuple[str, str, str, bool]] = []
PRODUCE_WORKLOADS = (
    "produce-1p-1x-none",
    "produce-1p-1x-zstd",
    "produce-64p-1x-none",
    "produce-64p-3x-none",
    "produce-64p-3x-zstd",
    "produce-1000p-1x-none",
)
for _w in PRODUCE_WORKLOADS:
    ROWS += [
        (_w, "mb_s", "MB/s", True),
        (_w, "records_s", "records/s", True),
        (_w, "p50_ms", "produce p50 ms", False),
        (_w, "p99_ms", "produce p99 ms", False),
        (_w, "max_ms", "produce max ms", False),
        (_w, "broker_cpu_s_per_gb", "broker CPU s/GB", False),
    ]
ROWS += [
    ("produce-1p-1x-none-half-load", "records_s", "records/s (capped at half the max)", True),
    ("produce-1p-1x-none-half-load", "p50_ms", "produce p50 ms (steady state)", False),
    ("produce-1p-1x-none-half-load", "p99_ms", "produce p99 ms (steady state)", False),
    ("produce-1p-1x-none-half-load", "max_ms", "produce max ms (steady state)", False),
    ("produce-1p-1x-none-half-load", "all_p99_ms", "produce p99 ms (with the warm-up)", False),
    ("consume-1p", "mb_s", "MB/s", True),
    ("consume-1p", "records_s", "records/s", True),
    ("consume-1p", "broker_cpu_s_per_gb", "broker CPU s/GB", False),
    ("python-confluent-kafka", "produce_mb_s", "produce MB/s", True),
    ("python-confluent-kafka", "consume_mb_s", "consume MB/s", True),
    (
        "python-confluent-kafka",
        "broker_cpu_s_per_gb",
        "broker CPU s/GB (produced + consumed)",
        False,
    ),
    ("end-to-end-1000-per-s", "produce_p50_ms", "produce p50 ms", False),
    ("end-to-end-1000-per-s", "produce_p99_ms", "produce p99 ms", False),
    ("end-to-end-1000-per-s", "e2e_p50_ms", "end-to-end p50 ms", False),
    ("end-to-end-1000-per-s", "e2e_p99_ms", "end-to-end p99 ms", False),
]

# Throughput figures whose every run is listed, in run order.
SPREAD_ROWS = [
    *((_w, "mb_s", "MB/s") for _w in PRODUCE_WORKLOADS),
    ("consume-1p", "mb_s", "MB/s"),
    ("python-confluent-kafka", "produce_mb_s", "produce MB/s"),
    ("python-confluent-kafka", "consume_mb_s", "consume MB/s"),
]

COST_WORKLOADS = [
    "produce-1p-1x-none",
    "produce-64p-1x-none",
    "produce-64p-3x-none",
    "produce-1000p-1x-none",
    "produce-1p-1x-none-half-load",
    "consume-1p",
    "end-to-end-1000-per-s",
]
COST_FIGURES = [
    "puts",
    "puts_per_s",
    "puts_per_gb",
    "gets",
    "gets_per_gb",
    "metadata_commits_per_s",
    "metadata_commits_per_gb",
    "metadata_reads_per_s",
]


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown(report: dict[str, Any]) -> str:
    systems = list(report["systems"])
    kafka = report["systems"].get("kafka", {})
    others = [s for s in systems if s != "kafka"]
    m = report["machine"]
    s = report["settings"]
    lines = [
        f"# Benchmark {report['date']}",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gb']} GB RAM, Linux "
        f"{m['kernel']}, Python {m['python']}, {m['java']}, Apache Kafka {m['kafka']}. "
        f"Load average at start {tuple(round(x, 2) for x in m['loadavg_at_start'])}"
        + (
            f", at end {tuple(round(x, 2) for x in m['loadavg_at_end'])}"
            if "loadavg_at_end" in m
            else ""
        )
        + (f"; {m['shared']}" if "shared" in m else "")
        + (f"; {m['note']}" if "note" in m else "")
        + ".",
        "",
        f"Settings: {s['record_size']} B records, acks=all, batch.size={s['batch_size']}, "
        f"linger.ms={s['linger_ms']}, {s['records_per_produce_run']} records per produce run, "
        f"median of {s['runs']} runs"
        + (
            f", after a warm-up of {s['warmup_records']} records produced and consumed"
            if s.get("warmup_records")
            else ""
        )
        + ". Clients, brokers and the machine's other load share the "
        f"same {m['nproc']} cores. Run took {report.get('duration_s', '?')} s.",
        "",
    ]
    for name in systems:
        if "error" in report["systems"][name]:
            lines += [f"**{name} failed:** `{report['systems'][name]['error']}`", ""]
    header = "| workload | figure | " + " | ".join(systems)
    header += "".join(f" | {o} / kafka" for o in others if kafka) + " |"
    lines += [header, "|" + "---|" * (2 + len(systems) + (len(others) if kafka else 0))]
    for workload, figure, label, _higher in ROWS:
        values = [report["systems"][n].get(workload, {}).get(figure) for n in systems]
        if all(v is None for v in values):
            continue
        row = f"| {workload} | {label} | " + " | ".join(fmt(v) for v in values)
        if kafka:
            k = kafka.get(workload, {}).get(figure)
            for o in others:
                v = report["systems"][o].get(workload, {}).get(figure)
                row += " | " + (f"{v / k:.2f}" if isinstance(v, int | float) and k else "–")
        lines.append(row + " |")
    lines.append(
        "| all | peak RSS MB (sum over the broker's processes) | "
        + " | ".join(fmt(report["systems"][n].get("peak_rss_mb")) for n in systems)
        + (" | –" * len(others) if kafka else "")
        + " |"
    )
    lines += ["", "## Runs behind the medians", ""]
    lines += ["| workload | figure | " + " | ".join(systems) + " |"]
    lines.append("|" + "---|" * (2 + len(systems)))
    for workload, figure, label in SPREAD_ROWS:
        cells = []
        for n in systems:
            runs = report["systems"][n].get(workload, {}).get("runs") or []
            cells.append(", ".join(fmt(r.get(figure)) for r in runs) or "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {workload} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "## bucketlog requests", ""]
    for o in others:
        lines += [f"### {o}", "", "| workload | " + " | ".join(COST_FIGURES) + " |"]
        lines.append("|" + "---|" * (1 + len(COST_FIGURES)))
        for w in COST_WORKLOADS:
            r = report["systems"][o].get(w)
            if r:
                lines.append(f"| {w} | " + " | ".join(fmt(r.get(f)) for f in COST_FIGURES) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(markdown(json.load(f)))
