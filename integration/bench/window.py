"""One workload's window on one fresh agent, after some history: what the main table's
per-workload figures see of earlier workloads.

    .venv/bin/python integration/bench/window.py --workload end-to-end|consume-1p|python
        [--after none|python|produce-1000p] [--settle-s S] [--label L] [--out FILE.jsonl]
        [-- AGENT ARGS]

run.py measures each workload in a window of the same agent that ran the workloads
before it: compaction may be merging their data meanwhile, and its CPU and disk count
in the window. This starts one agent (the bench's Bucketlog, local store), warms it up
(300,000 records into one partition, consumed once), creates the history asked for
(`python`: run.py's confluent-kafka workload, 500,000 records each way; `produce-1000p`:
150,000 records into a topic of one partition read later and 150,000 more into one of
1,000 partitions), then measures one workload as run.py does: `end-to-end` (1,000
records/s for 12 s, a tailing consumer; also the agent's flush histograms over the
window, as bucket bounds holding the median and the p99) or `consume-1p` (the Java
ConsumerPerformance reading 150,000 records; also the agent's own user and system CPU)
or `python` (run.py's confluent-kafka workload: 500,000 records produced and then
consumed, the broker's CPU per GB of both). `--settle-s` waits that long after the
history, before the window (for compaction to merge what consume-1p reads, with agent
arguments that let it run soon).
`BENCH_BUCKETLOG` may name another agent command; `--system kafka` measures the same
window on Apache Kafka (run.py's broker; its JVM's CPU as the agent's). Printed, and
appended to --out as one JSON line. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backlog_latency  # noqa: E402
import run as bench  # noqa: E402

FLUSHES = ("flush_upload", "metadata_commit", "flush_end_to_end")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("end-to-end", "consume-1p", "python"), required=True)
    parser.add_argument("--after", choices=("none", "python", "produce-1000p"), default="none")
    parser.add_argument(
        "--settle-s", type=float, default=0.0, help="a pause between the history and the window"
    )
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--system",
        choices=("bucketlog", "kafka"),
        default="bucketlog",
        help="Kafka: the same window on Apache Kafka (no flush histograms, no agent arguments)",
    )
    parser.add_argument("--out")
    parser.add_argument("agent_args", nargs="*")
    args = parser.parse_args()
    kafka = args.system == "kafka"
    if kafka and args.agent_args:
        parser.error("agent arguments are bucketlog's")
    metrics_port = bench.free_port()
    system: bench.System = (
        bench.Kafka()
        if kafka
        else bench.Bucketlog(1, [*args.agent_args, "--metrics-port", str(metrics_port)])
    )
    system.start()
    result: dict[str, Any] = {
        "system": args.system,
        "label": args.label,
        "workload": args.workload,
        "after": args.after,
        "settle_s": args.settle_s,
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
        time.sleep(args.settle_s)
        before = {} if kafka else backlog_latency.buckets(metrics_port)
        ticks = bench.cpu_ticks(system.root_pid)
        if args.workload == "end-to-end":
            bench.create_topic(system.bootstrap, "e2e", 1)
            mb = 1000 * 12 * bench.RECORD_SIZE / 1e6
            r = bench.measure(
                system, mb, lambda: bench.end_to_end(system.bootstrap, "e2e", 1000, 12)
            )
            keep = ("e2e_p50_ms", "e2e_p99_ms", "produce_p50_ms", "produce_p99_ms")
        elif args.workload == "python":
            bench.create_topic(system.bootstrap, "python", 1)
            mb = 2 * 500_000 * bench.RECORD_SIZE / 1e6  # produced and consumed, as run.py
            r = bench.measure(
                system, mb, lambda: bench.python_workload(system.bootstrap, "python", 500_000)
            )
            keep = ("produce_mb_s", "consume_mb_s")
        else:
            mb = 150_000 * bench.RECORD_SIZE / 1e6
            r = bench.measure(
                system, mb, lambda: bench.consumer_perf(system.bootstrap, "read", 150_000)
            )
            keep = ("mb_s",)
        after = {} if kafka else backlog_latency.buckets(metrics_port)
        ticks_after = bench.cpu_ticks(system.root_pid)
        assert ticks is not None and ticks_after is not None, "the agent is gone"
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
        result["agent_user_s"] = round((ticks_after[0] - ticks[0]) / bench.CLK_TCK, 2)
        result["agent_system_s"] = round((ticks_after[1] - ticks[1]) / bench.CLK_TCK, 2)
        if not kafka:
            flushes = backlog_latency.quantiles(before, after)
            for name in FLUSHES:
                found = flushes.get(f"bucketlog_{name}_seconds")  # none: no flush in the window
                for q in ("p50", "p99"):
                    result[f"{name}_{q}_bucket_s"] = found and found[f"{q}_le_ms"] / 1000
    finally:
        system.stop()
    result["at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    bench.print_line(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
