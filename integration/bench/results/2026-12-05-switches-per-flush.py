"""Context switches and CPU per flush, by thread, of two agent commands, interleaved.

    .venv/bin/python integration/bench/results/2026-12-05-switches-per-flush.py \
        --a "env PYTHONPATH=<tree> .venv/bin/python -m broker" [--b CMD] [--pairs 3] \
        [--workload end-to-end|produce-1p] [--out FILE.jsonl]

Each run starts a fresh one-agent broker of one command (--b defaults to this checkout's
`bucketlog`; the order alternates pair by pair), warms it up (100,000 records produced
and read), lets it settle for 15 s, then runs the workload: run.py's end_to_end (1,000
records/s for 12 s, a tailing consumer) or one ProducerPerformance of 150,000 records
into one partition. Before and 2 s after it, each thread's voluntary and involuntary
context switches (/proc/PID/task/TID/status) and user + system CPU (its stat) are read,
and the agent's flushes from its counters. One JSON line a run: switches and CPU ms per
flush of the event loop's thread and of the others together (threads that ended in
between are missing from the second reading); bytes per flush; the workload's own
figures.

2026-12-05-switches-per-flush.jsonl, a the tree at 3db0738 and b at ad51488 (a flush
next in order commits itself in its upload's thread): first three pairs of produce-1p,
taken by a first version of this script that summed the threads by their kernel name,
which Python leaves as the process's own (so each line has one entry, the whole agent);
then three pairs of end to end, as the script is now. End to end: 20.4, 18.5 and 18.4
switches per flush before (the loop's 4.9-5.0), 13.6, 14.3 and 13.8 after (3.9-4.0);
CPU per flush 2.10, 2.16 and 1.95 ms against 2.08, 2.11 and 2.06.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[str, tuple[int, int]]:
    """(context switches, CPU ticks) of the event loop's thread (the process's first) and
    of all its other threads together (Python does not name them to the kernel)."""
    out: dict[str, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = "loop" if task.name == str(pid) else "other threads"
        try:
            status = (task / "status").read_text().splitlines()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
        switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        was = out.get(name, (0, 0))
        out[name] = (was[0] + switches, was[1] + ticks)
    return out


def one_run(label: str, command: str | None, workload: str) -> dict[str, Any]:
    system = B.Bucketlog(1, command=command)
    system.start()
    try:
        B.create_topic(system.bootstrap, "warm", 1)
        B.producers_perf(system.bootstrap, "warm", 1, 100_000, "none")
        B.consumer_perf(system.bootstrap, "warm", 100_000)
        B.create_topic(system.bootstrap, "w", 1)
        time.sleep(15)
        before, counters0 = threads(system.root_pid), system.counters()
        if workload == "end-to-end":
            figures = B.end_to_end(system.bootstrap, "w", 1000, 12)
        else:
            figures = B.producers_perf(system.bootstrap, "w", 1, 150_000, "none")
        time.sleep(2)  # the counters are written once a second
        after, counters1 = threads(system.root_pid), system.counters()
    finally:
        system.stop()
    flushes = counters1["pipeline.flushes"] - counters0["pipeline.flushes"]
    per_thread = {}
    for name, (switches, ticks) in sorted(after.items()):
        s0, t0 = before.get(name, (0, 0))
        if switches - s0 or ticks - t0:
            per_thread[name] = {
                "switches_per_flush": round((switches - s0) / flushes, 2),
                "cpu_ms_per_flush": round((ticks - t0) / TICK * 1000 / flushes, 3),
            }
    return {
        "variant": label,
        "workload": workload,
        "flushes": flushes,
        "bytes_per_flush": round(
            (counters1["pipeline.bytes"] - counters0["pipeline.bytes"]) / flushes
        ),
        "switches_per_flush": round(sum(t["switches_per_flush"] for t in per_thread.values()), 1),
        "cpu_ms_per_flush": round(sum(t["cpu_ms_per_flush"] for t in per_thread.values()), 3),
        "threads": per_thread,
        "figures": figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the first agent command")
    parser.add_argument("--b", help="the second (default: this checkout's bucketlog)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workload", default="end-to-end", choices=("end-to-end", "produce-1p"))
    parser.add_argument("--out", help="append the JSON lines to this file too")
    args = parser.parse_args()
    variants = [("a", args.a), ("b", args.b)]
    for pair in range(args.pairs):
        for label, command in variants if pair % 2 == 0 else variants[::-1]:
            B.print_line(one_run(label, command, args.workload), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
