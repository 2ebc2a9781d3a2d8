"""One workload's window on one fresh agent, after some history: what the main table's
per-workload figures see of earlier workloads.

    .venv/bin/python integration/bench/window.py --workload end-to-end|consume-1p
        [--after none|python|produce-1000p] [--label L] [--out FILE.jsonl] [-- AGENT ARGS]

run.py measures each workload in a window of the same agent that ran the workloads
before it: compaction may be merging their data meanwhile, and its CPU and disk count
in the window. This starts one agent (the bench's Bucketlog, local store), warms it up
(300,000 records into one partition, consumed once), creates the history asked for
(`python`: run.py's confluent-kafka workload, 500,000 records each way; `produce-1000p`:
150,000 records into a topic of one partition read later and 150,000 more into one of
1,000 partitions), then measures one workload as run.py does: `end-to-end` (1,000
records/s for 12 s, a tailing consumer; also the agent's flush histograms over the
window, as bucket bounds holding the median and the p99) or `consume-1p` (the Java
ConsumerPerformance reading 150,000 records; also the agent's own user and system CPU).
`BENCH_BUCKETLOG` may name another agent command. Printed, and appended to --out as
one JSON line. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402

HISTOGRAMS = ("flush_upload", "metadata_commit", "flush_end_to_end")


def scrape(port: int) -> dict[str, list[tuple[float, float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, list[tuple[float, float]]] = {}
    pattern = re.compile(r'bucketlog_(\w+)_seconds_bucket\{le="([^"]+)"\} (\S+)')
    for line in text.decode().splitlines():
        m = pattern.match(line)
        if m and m[1] in HISTOGRAMS:
            out.setdefault(m[1], []).append((float(m[2]), float(m[3])))
    return out


def bucket_of(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the bucket holding quantile q."""
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total and count >= q * total:
            return le
    return None


def cpu_ticks(pid: int) -> tuple[int, int]:
    """User and system ticks of the process (its threads, ended ones included)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("end-to-end", "consume-1p"), required=True)
    parser.add_argument("--after", choices=("none", "python", "produce-1000p"), default="none")
    parser.add_argument("--label", default="")
    parser.add_argument("--out")
    parser.add_argument("agent_args", nargs="*")
    args = parser.parse_args()
    metrics_port = bench.free_port()
    system = bench.Bucketlog(1, [*args.agent_args, "--metrics-port", str(metrics_port)])
    system.start()
    result: dict[str, Any] = {
        "label": args.label,
        "workload": args.workload,
        "after": args.after,
        "agent_args": args.agent_args,
    }
    try:
        bench.create_topic(system.bootstrap, "warm", 1)
        bench.producers_perf(system.bootstrap, "warm", 1, 300_000, "none")
        bench.consumer_perf(system.bootstrap, "warm", 300_000)
        bench.create_topic(system.bootstrap, "read", 1)
        if args.workload == "consume-1p":
            bench.producers_perf(system.bootstrap, "read", 1, 150_000, "none")
        if args.after == "python":
            bench.create_topic(system.bootstrap, "py", 1)
            bench.python_workload(system.bootstrap, "py", 500_000)
        elif args.after == "produce-1000p":
            bench.create_topic(system.bootstrap, "wide", 1000)
            bench.producers_perf(system.bootstrap, "wide", 1, 150_000, "none")
        before, ticks = scrape(metrics_port), cpu_ticks(system.root_pid)
        if args.workload == "end-to-end":
            bench.create_topic(system.bootstrap, "e2e", 1)
            mb = 1000 * 12 * bench.RECORD_SIZE / 1e6
            r = bench.measure(
                system, mb, lambda: bench.end_to_end(system.bootstrap, "e2e", 1000, 12)
            )
            keep = ("e2e_p50_ms", "e2e_p99_ms", "produce_p50_ms", "produce_p99_ms")
        else:
            mb = 150_000 * bench.RECORD_SIZE / 1e6
            r = bench.measure(
                system, mb, lambda: bench.consumer_perf(system.bootstrap, "read", 150_000)
            )
            keep = ("mb_s",)
        after, ticks_after = scrape(metrics_port), cpu_ticks(system.root_pid)
        hz = os.sysconf("SC_CLK_TCK")
        result.update({k: round(r[k], 2) for k in keep})
        result.update(
            {
                k: r.get(k)
                for k in (
                    "broker_cpu_s_per_gb",
                    "broker_cpu_s_per_gb_without_workers",
                    "broker_workers_cpu_s",
                    "puts",
                    "gets",
                )
            }
        )
        result["agent_user_s"] = round((ticks_after[0] - ticks[0]) / hz, 2)
        result["agent_system_s"] = round((ticks_after[1] - ticks[1]) / hz, 2)
        for name in HISTOGRAMS:
            start = dict(before.get(name, []))
            window = [(le, count - start.get(le, 0)) for le, count in after.get(name, [])]
            result[f"{name}_p50_bucket_s"] = bucket_of(window, 0.5)
            result[f"{name}_p99_bucket_s"] = bucket_of(window, 0.99)
    finally:
        system.stop()
    result["at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
