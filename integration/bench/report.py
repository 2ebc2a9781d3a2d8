"""Render a benchmark report (the JSON of run.py) as a markdown page.

Usage: integration/bench/report.py results/<date>.json > results/<date>.md
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

# (workload, figure, label, higher is better)
WITHOUT_WORKERS = "broker CPU s/GB without compaction's workers"
UNTIL_IDLE = "broker CPU s/GB from the row's first run until the broker is idle again"
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
        (_w, "broker_cpu_s_per_gb_without_workers", WITHOUT_WORKERS, False),
        (_w, "broker_cpu_s_per_gb_until_idle", UNTIL_IDLE, False),
    ]
ROWS += [
    ("produce-1p-1x-none-half-load", "broker_cpu_s_per_gb", "broker CPU s/GB", False),
    ("produce-1p-1x-none-half-load", "broker_cpu_s_per_gb_without_workers", WITHOUT_WORKERS, False),
    ("produce-1p-1x-none-half-load", "broker_cpu_s_per_gb_until_idle", UNTIL_IDLE, False),
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
    ("consume-1p", "broker_cpu_s_per_gb_without_workers", WITHOUT_WORKERS, False),
    ("consume-1p", "broker_cpu_s_per_gb_until_idle", UNTIL_IDLE, False),
    ("python-confluent-kafka", "produce_mb_s", "produce MB/s", True),
    ("python-confluent-kafka", "consume_mb_s", "consume MB/s", True),
    (
        "python-confluent-kafka",
        "broker_cpu_s_per_gb",
        "broker CPU s/GB (produced + consumed)",
        False,
    ),
    (
        "python-confluent-kafka",
        "broker_cpu_s_per_gb_until_idle",
        UNTIL_IDLE + " (produced + consumed)",
        False,
    ),
    ("end-to-end-1000-per-s", "broker_cpu_s_per_gb", "broker CPU s/GB", False),
    ("end-to-end-1000-per-s", "broker_cpu_s_per_gb_until_idle", UNTIL_IDLE, False),
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
        + (
            f"; each system started after a sync and {s['settle_s']:g} s for the disk to settle"
            if s.get("settle_s")
            else ""
        )
        + ". Clients, brokers and the machine's other load share the "
        f"same {m['nproc']} cores. Run took {report.get('duration_s', '?')} s.",
        "",
    ]
    for name in systems:
        if "error" in report["systems"][name]:
            lines += [f"**{name} failed:** `{report['systems'][name]['error']}`", ""]
    if systems:
        lines += main_tables(report)
    lines += pinned_section(report)
    lines += s3_section(report)
    return "\n".join(lines) + "\n"


def main_tables(report: dict[str, Any]) -> list[str]:
    systems = list(report["systems"])
    kafka = report["systems"].get("kafka", {})
    others = [s for s in systems if s != "kafka"]
    lines = []
    lines += ratio_header(["workload", "figure"], systems, others if kafka else [])
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
    lines += whole_run_lines(report)
    lines += ["", "## Runs behind the medians", ""]
    lines += ["| workload | figure | " + " | ".join(systems) + " |"]
    lines.append("|" + "---|" * (2 + len(systems)))
    for workload, figure, label in SPREAD_ROWS:
        lines += runs_row(report, workload, figure, label)
    lines += machine_lines(report)
    lines += ["", "## bucketlog requests", ""]
    for o in others:
        lines += [f"### {o}", "", "| workload | " + " | ".join(COST_FIGURES) + " |"]
        lines.append("|" + "---|" * (1 + len(COST_FIGURES)))
        for w in COST_WORKLOADS:
            r = report["systems"][o].get(w)
            if r:
                lines.append(f"| {w} | " + " | ".join(fmt(r.get(f)) for f in COST_FIGURES) + " |")
        lines.append("")
    return lines


MACHINE_FIGURES = (
    ("machine_other_cpu_s", "CPU s of every other process"),
    ("machine_steal_s", "CPU s stolen by the hypervisor"),
)


def runs_row(report: dict[str, Any], workload: str, figure: str, label: str) -> list[str]:
    """A table line with each system's runs of the figure, in run order; none when no
    run of any system has it (reports from before a figure was measured)."""
    cells = []
    for results in report["systems"].values():
        runs = [r for r in results.get(workload, {}).get("runs") or [] if figure in r]
        cells.append(", ".join(fmt(r[figure]) for r in runs) or "–")
    if all(c == "–" for c in cells):
        return []
    return [f"| {workload} | {label} | " + " | ".join(cells) + " |"]


def machine_lines(report: dict[str, Any]) -> list[str]:
    """What else the machine did in each run of each workload (reports from before
    these figures were measured have none, and no such section)."""
    systems = list(report["systems"])
    lines = []
    for workload in dict.fromkeys(w for w, _f, _l, _h in ROWS):
        for figure, label in MACHINE_FIGURES:
            lines += runs_row(report, workload, figure, label)
    if not lines:
        return []
    return [
        "",
        "## The machine in each run",
        "",
        "What ran beside the broker and the clients in each run's window (runs in order):"
        " other processes' CPU, and time the hypervisor gave other guests while this"
        " machine had work. Other processes include the kernel's own threads, which"
        " write back and journal every process's writes, the broker's too. A run whose"
        " figures stand out with either high was shared.",
        "",
        "| workload | figure | " + " | ".join(systems) + " |",
        "|" + "---|" * (2 + len(systems)),
        *lines,
        *with_machine_lines(report),
    ]


def ratio_header(first: list[str], systems: list[str], others: list[str]) -> list[str]:
    """A table's header and rule: the first columns, one per system, and one per system
    in `others` for its ratio to Kafka."""
    names = [*first, *systems, *(f"{o} / kafka" for o in others)]
    return ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def with_machine_cpu_per_gb(run: dict[str, Any]) -> float | None:
    """The broker's CPU and the machine's other CPU in a run, per GB: what the machine
    spent but the clients' share. A run without the figures: None. Runs measured before
    run.py recorded it get their GB as the broker's CPU over its CPU per GB (both as
    rounded in the report, to about 1%)."""
    if isinstance(exact := run.get("with_machine_cpu_s_per_gb"), int | float):
        return exact
    cpu, per_gb, other = (
        run.get("broker_cpu_s"),
        run.get("broker_cpu_s_per_gb"),
        run.get("machine_other_cpu_s"),
    )
    if not all(isinstance(v, int | float) for v in (cpu, per_gb, other)) or not cpu or not per_gb:
        return None
    return (cpu + other) / (cpu / per_gb)


def with_machine_lines(report: dict[str, Any]) -> list[str]:
    """Each system's median over the runs of the broker's CPU with the machine's other
    CPU, per GB, and bucketlog's ratio to Kafka's."""
    systems = list(report["systems"])
    others = [s for s in systems if s != "kafka"]
    kafka = "kafka" in systems
    lines = []
    for workload in dict.fromkeys(w for w, _f, _l, _h in ROWS):
        medians: dict[str, float | None] = {}
        for name in systems:
            runs = report["systems"][name].get(workload, {}).get("runs") or []
            values = [v for r in runs if (v := with_machine_cpu_per_gb(r)) is not None]
            medians[name] = statistics.median(values) if values else None
        if all(v is None for v in medians.values()):
            continue
        row = f"| {workload} | " + " | ".join(fmt(medians[n]) for n in systems)
        if kafka:
            k = medians["kafka"]
            for o in others:
                v = medians[o]
                row += " | " + (f"{v / k:.2f}" if v is not None and k else "–")
        lines.append(row + " |")
    if not lines:
        return []
    return [
        "",
        "The broker's CPU with the other processes' (the kernel's writeback and journal"
        " among them) in the same windows, per GB: the machine's CPU but the clients'."
        " Medians of the runs (of an odd number, the middle run's).",
        "",
        *ratio_header(["workload"], systems, others if kafka else []),
        *lines,
    ]


def whole_run_lines(report: dict[str, Any]) -> list[str]:
    """Each system's CPU over its whole run (warm-up and every workload), and for
    bucketlog the compaction workers' part of it per GB its agents took in."""
    lines = []
    for name, results in report["systems"].items():
        whole = results.get("whole_run")
        if not whole:
            continue
        line = f"- {name}: broker CPU over the whole run {whole['broker_cpu_s']:,.1f} s"
        produced = whole.get("produced_gb")
        if produced:
            line += (
                f"; {produced:,.2f} GB produced, {whole['broker_cpu_s'] / produced:.1f} s per"
                f" GB; of it the compaction workers' {whole['workers_cpu_s']:,.1f} s"
                f" ({whole['workers_cpu_s'] / produced:.1f} s per GB produced, writing"
                f" {whole.get('compaction_written_gb', 0):,.2f} GB)"
            )
        lines.append(line + ".")
    if lines:
        lines = [
            "",
            "Whole run (the figures per workload count whatever the broker did in the"
            " workload's window; compaction's workers rewrite data of earlier workloads):",
            "",
            *lines,
        ]
    return lines


PINNED_WORKLOADS = ("produce-1p-1x-none", "produce-64p-1x-none", "consume-1p")


def per_core(r: dict[str, Any]) -> float | None:
    """MB/s one agent would move with a core of its own fully busy, at this CPU per byte."""
    cost = r.get("broker_cpu_s_per_gb")
    return round(1000 / cost, 1) if isinstance(cost, int | float) and cost > 0 else None


def pinned_section(report: dict[str, Any]) -> list[str]:
    pinned = report.get("pinned")
    if not pinned:
        return []
    lines = ["## Clients and agents on cores of their own", ""]
    if "error" in pinned:
        return [*lines, f"**Not run:** `{pinned['error']}`", ""]
    lines += [
        "The same workloads with the clients (the perf tools and the harness) held to one "
        "core and the agents to the others: `sched_setaffinity` on every thread of each agent "
        "process after it started, read back from /proc (below). With two cores both agents "
        "of bucketlog-2 share the one core left. *Cores busy*: CPU seconds over the "
        "workload's wall time (1.00 = one core all the time; the clients' include the perf "
        "tool's JVM start). *MB/s per agent core* = 1000 / broker CPU s/GB: what an agent "
        "would move with its core fully busy, at this workload's CPU per byte. Where the "
        "clients' core is near 1.00 busy, the client set the MB/s, not the agent. *Unpinned* "
        "is the main table's figure for the same system, when this run has one.",
        "",
        "| layout | workload | MB/s | unpinned MB/s | broker CPU s/GB | broker cores busy "
        "| clients' cores busy | MB/s per agent core |",
        "|---|---|---|---|---|---|---|---|",
    ]
    affinity = []
    for key, layout in pinned["layouts"].items():
        if "error" in layout:
            lines.append(f"| {key} | **failed:** `{layout['error']}` | | | | | | |")
            continue
        main = report["systems"].get(layout["layout"]["system"], {})
        for w in PINNED_WORKLOADS:
            r = layout.get(w)
            if not r:
                continue
            cells = [
                fmt(r.get("mb_s")),
                fmt(main.get(w, {}).get("mb_s")),
                fmt(r.get("broker_cpu_s_per_gb")),
                f"{r['broker_cores']:.2f}" if "broker_cores" in r else "–",
                f"{r['client_cores']:.2f}" if "client_cores" in r else "–",
                fmt(per_core(r)),
            ]
            lines.append(f"| {key} | {w} | " + " | ".join(cells) + " |")
        affinity.append(
            f"{key}: " + ", ".join(f"{k} on {v}" for k, v in layout.get("affinity", {}).items())
        )
    lines += ["", "Allowed CPUs as read back: " + "; ".join(affinity) + ".", ""]
    return lines


S3_WORKLOADS = ("produce-1p-1x-none", "produce-64p-1x-none", "consume-1p", "consume-1p-cold")
S3_FIGURES = [
    ("mb_s", "MB/s"),
    ("puts_per_gb", "PUTs/GB"),
    ("gets_per_gb", "GETs/GB"),
    ("broker_cpu_s_per_gb", "broker CPU s/GB"),
    ("moto_cpu_s_per_gb", "moto CPU s/GB"),
    ("puts_per_s", "PUTs/s"),
    ("hedged_puts", "PUTs sent twice (hedged)"),
    ("p99_ms", "produce p99 ms"),
]


def s3_section(report: dict[str, Any]) -> list[str]:
    s3 = report.get("s3")
    if not s3:
        return []
    lines = ["## The local store and the S3 store (moto)", ""]
    if "error" in s3:
        return [*lines, f"**Not run:** `{s3['error']}`", ""]
    stores = list(s3)
    lines += [
        "One agent (`serve --agents 1`, SQLite metadata) on the local store and on the S3 "
        "store, moto's server (`moto_server`) on 127.0.0.1 in a process of its own "
        "(`--storage s3://BUCKET/PREFIX --s3-endpoint-url`); each store with its default "
        "flush policy (local 2 ms, S3 250 ms, 4 MiB either way) and the S3 store with its "
        "default hedged PUTs. consume-1p reads the produce-1p topics from the agent's cache; "
        "consume-1p-cold reads them again after the agent restarted, from the store. moto "
        "keeps the objects in its memory and serves each request in a Python thread under one "
        "GIL: its MB/s says little about S3's, but the requests per GB are the agent's and "
        "carry over. moto's CPU is counted apart from the broker's.",
        "",
    ]
    for store in stores:
        if "error" in s3[store]:
            lines += [f"**{store} failed:** `{s3[store]['error']}`", ""]
    lines += ["| workload | store | " + " | ".join(label for _, label in S3_FIGURES) + " |"]
    lines.append("|" + "---|" * (2 + len(S3_FIGURES)))
    for w in S3_WORKLOADS:
        for store in stores:
            r = s3[store].get(w)
            if r:
                cells = [fmt(r.get(figure)) for figure, _ in S3_FIGURES]
                lines.append(f"| {w} | {store} | " + " | ".join(cells) + " |")
    rss = [
        f"{store} {fmt(s3[store].get('peak_rss_mb'))} MB"
        + (
            f" (moto {fmt(s3[store]['moto_peak_rss_mb'])} MB)"
            if "moto_peak_rss_mb" in s3[store]
            else ""
        )
        for store in stores
    ]
    lines += ["", "Peak RSS of the broker: " + ", ".join(rss) + ".", ""]
    return lines


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(markdown(json.load(f)))
