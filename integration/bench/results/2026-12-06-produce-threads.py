"""A produce row of the main table with each broker's CPU split by thread, Kafka and
bucketlog taking turns run by run: where Kafka's CPU goes (its request path, its JIT
compilers, its garbage collector) against bucketlog's (the event loop's thread, the
other threads of the agent's process, compaction's workers), and a py-spy profile of
the agent.

Usage (from the checkout, its venv):
    ROW=64p-1x-none .venv/bin/python integration/bench/results/2026-12-06-produce-threads.py \
        RUNS [WARM [PROFILE]]
    .venv/bin/python integration/bench/results/2026-12-06-produce-threads.py summarize PATH [TOP]
    .venv/bin/python integration/bench/results/2026-12-06-produce-threads.py table JSONL...

ROW is a produce row of the main table at --scale 2 (PARTITIONSp-PRODUCERSx-COMPRESSION;
default 64p-1x-none): PRODUCERS ProducerPerformance tools sharing 300,000 records of
1,024 B into a fresh topic of PARTITIONS partitions. Kafka and one bucketlog agent run side
by side. Each is warmed up with WARM runs of the row (default 3), then the two take turns
for RUNS runs each. A run's window starts 2 s after its topic is created (as run.py's
does, the topic's creation is not in it) and ends when the tools do; its "after"
figures are the 5 s that follow (what the run left to do: compaction, writeback). With
AFTER_ROWS=1 each system first runs what the main table runs before produce-64p
(produce-1p-1x-none and -zstd, five runs each). With PROFILE (a path; "-" for none), RUNS more runs of the agent
under `py-spy record --threads --subprocesses --native --idle` (200 Hz), the raw stacks
written there; `summarize` prints each thread's samples and its TOP functions by the
samples they were in, `table` the medians of the runs in files of these lines.

Each line: the system, the row, MB/s, the broker's CPU s in the window and per GB, each
thread group's CPU s in the window, the CPU s of the 5 s after, the machine's other CPU s
(every process but the broker and the tools), and for bucketlog the PUTs and metadata
commits of the window and the 5 s after.
"""

from __future__ import annotations

import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import run  # noqa: E402  (integration/bench/run.py)

RECORDS = 300_000
GB = RECORDS * run.RECORD_SIZE / 1e9  # of a run: the producers share the records
SETTLE_S = 2.0  # between a topic's creation and the window
# The row: ROW=PARTITIONSp-PRODUCERSx-COMPRESSION as in the main table (default 64p-1x-none).
ROW = os.environ.get("ROW", "64p-1x-none")
_partitions, _producers, COMPRESSION = ROW.split("-")
PARTITIONS, PRODUCERS = int(_partitions.removesuffix("p")), int(_producers.removesuffix("x"))
PY_SPY = os.environ.get("PY_SPY", "py-spy")
# With AFTER_ROWS=1 each system first runs the main table's rows before this one.
AFTER_ROWS = os.environ.get("AFTER_ROWS") == "1"

# A JVM thread's name (its first 15 characters, as Linux keeps it) to the group it is in.
KAFKA_GROUPS = (
    ("data-plane-kafk", "request path (network threads and request handlers)"),
    ("C2 CompilerThre", "JIT compilers"),
    ("C1 CompilerThre", "JIT compilers"),
    ("GC Thread", "garbage collector"),
    ("G1 ", "garbage collector"),
    ("VM Thread", "garbage collector"),
)


def kafka_group(name: str) -> str:
    for prefix, group in KAFKA_GROUPS:
        if name.startswith(prefix):
            return group
    return "other threads"


def threads(system: run.System) -> dict[str, float]:
    """CPU s by thread group of the broker's processes, and of each process what its
    live threads do not account for (threads that ended)."""
    out: dict[str, float] = {}

    def add(group: str, seconds: float) -> None:
        out[group] = out.get(group, 0.0) + seconds

    is_kafka = system.name == "kafka"
    for pid in run.proc_tree(system.root_pid):
        whole, worker = run.cpu_ticks(pid), run.is_worker(pid)
        if whole is None or worker is None:
            continue
        if worker:
            add("compaction's workers", sum(whole) / run.CLK_TCK)
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        live = 0.0
        for tid in tids:
            ticks = run.stat_ticks(f"/proc/{pid}/task/{tid}/stat")
            if ticks is None:
                continue
            seconds = sum(ticks) / run.CLK_TCK
            live += seconds
            if is_kafka:
                try:
                    name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                except OSError:
                    name = ""
                add(kafka_group(name), seconds)
            elif int(tid) == pid:
                add("event loop's thread", seconds)
            else:
                add("the agent's other threads", seconds)
        add("ended threads", sum(whole) / run.CLK_TCK - live)
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 2) for k, v in sorted(after.items())}


def one_run(system: run.System, topic: str) -> dict:
    run.create_topic(system.bootstrap, topic, PARTITIONS)
    # Out of the window: the broker's work of creating the topic (Kafka makes each
    # partition's log files), as run.py's measure() waits before its window.
    time.sleep(SETTLE_S)
    busy_before = run.machine_cpu()[0]
    tool_before = run.client_cpu_seconds()
    before = threads(system)
    counted = system.counters()
    start = time.monotonic()
    perf = run.producers_perf(system.bootstrap, topic, PRODUCERS, RECORDS, COMPRESSION)
    wall = time.monotonic() - start
    during = threads(system)
    busy_during = run.machine_cpu()[0]
    tool = run.client_cpu_seconds() - tool_before
    time.sleep(5)
    after = threads(system)
    counts = {}
    if counted is not None:
        now = system.counters() or {}
        counts = {
            name: now.get(key, 0) - counted.get(key, 0)
            for name, key in (("puts", "store.puts"), ("metadata_commits", "metadata.commits"))
        }
    window = diff(during, before)
    broker = sum(window.values())
    return {
        "system": system.name,
        "row": ROW,
        "mb_s": perf["mb_s"],
        "wall_s": round(wall, 2),
        "broker_cpu_s": round(broker, 2),
        "broker_cpu_s_per_gb": round(broker / GB, 2),
        "threads_cpu_s": window,
        "after_cpu_s": round(sum(diff(after, during).values()), 2),
        "machine_other_cpu_s": round(busy_during - busy_before - broker - tool, 2),
        **counts,
    }


def profile(system: run.System, path: str, runs: int) -> dict:
    """`runs` more runs of the agent, sampled by py-spy with native frames."""
    spy = subprocess.Popen(
        [
            PY_SPY,
            "record",
            "--threads",
            "--subprocesses",
            "--native",
            "--idle",
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            path,
            "-p",
            str(system.root_pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2)  # py-spy attached
    rates = []
    for i in range(runs):
        topic = f"profiled-{i}"
        run.create_topic(system.bootstrap, topic, PARTITIONS)
        time.sleep(SETTLE_S)
        perf = run.producers_perf(system.bootstrap, topic, PRODUCERS, RECORDS, COMPRESSION)
        rates.append(perf["mb_s"])
    spy.send_signal(2)
    spy.wait(60)
    return {"system": system.name, "row": ROW, "profiled": path, "mb_s": rates}


def summarize(path: str, top: int) -> None:
    """Each thread's samples in a raw py-spy file (with --idle: busy or not), and its
    functions by the samples they were in (inclusive) and innermost ('self')."""
    threads: collections.Counter[str] = collections.Counter()
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    innermost: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in Path(path).read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        # process PID:"command line";thread (TID): name;frame;frame...; a command line
        # may hold ';' itself
        head, _, rest = stack.partition(";thread (")
        process = "compaction's workers" if "multiprocessing" in head else "agent"
        frames = rest.split(";")
        thread = f"{process}: {frames[0].split(': ', 1)[-1]}"
        calls = [re.sub(r":\d+\)$", ")", f) for f in frames[1:]]
        threads[thread] += int(count)
        for call in dict.fromkeys(calls):
            inclusive[thread][call] += int(count)
        if calls:
            innermost[thread][calls[-1]] += int(count)
    for thread, samples in threads.most_common():
        print(f"# {thread}: {samples} samples")
        for call, n in inclusive[thread].most_common(top):
            share = 100 * n / samples
            print(f"{n:6d} {share:5.1f}%  self {innermost[thread][call]:5d}  {call}")


def before_rows(system: run.System) -> None:
    """What the main table runs before this row: five runs each of produce-1p-1x-none
    and produce-1p-1x-zstd (300,000 records each, one partition)."""
    for compression in ("none", "zstd"):
        for i in range(5):
            topic = f"before-{compression}-{i}"
            run.create_topic(system.bootstrap, topic, 1)
            run.producer_perf(system.bootstrap, topic, RECORDS, compression)


def table(paths: list[str]) -> None:
    """A markdown table of the measured runs (not the warm-ups) in the files: per file
    and system the medians of MB/s, CPU s per GB and each thread group's CPU s per GB."""
    print("| file | row | system | runs | MB/s | CPU s/GB | by thread, CPU s/GB |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        systems: dict[str, list[dict]] = {}
        for line in Path(path).read_text().splitlines():
            found = json.loads(line)
            if "run" in found:
                systems.setdefault(found["system"], []).append(found)
        for system, runs in systems.items():
            row = runs[0]["row"]
            groups = sorted({g for r in runs for g in r["threads_cpu_s"]})
            split = ", ".join(
                f"{g} {statistics.median(r['threads_cpu_s'].get(g, 0.0) for r in runs) / GB:.2f}"
                for g in groups
            )
            mb_s = statistics.median(r["mb_s"] for r in runs)
            per_gb = statistics.median(r["broker_cpu_s"] for r in runs) / GB
            print(
                f"| {Path(path).name} | {row} | {system} | {len(runs)} | {mb_s:.1f} "
                f"| {per_gb:.2f} | {split} |"
            )


def main() -> int:
    if sys.argv[1:2] == ["summarize"]:
        summarize(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 40)
        return 0
    if sys.argv[1:2] == ["table"]:
        table(sys.argv[2:])
        return 0
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    warm = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    profile_path = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    with run.side_by_side() as systems:
        if AFTER_ROWS:
            for s in systems:
                before_rows(s)
        for w in range(warm):
            for s in systems:
                line = one_run(s, f"warm-{w}")
                line["warm_up"] = w
                print(json.dumps(line), flush=True)
        for i in range(runs):
            for s in systems:
                line = one_run(s, f"row-{i}")
                line["run"] = i
                print(json.dumps(line), flush=True)
        if profile_path:
            print(json.dumps(profile(systems[1], profile_path, runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
