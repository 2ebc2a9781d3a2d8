"""Whether what a Kafka run leaves on the disk slows the agent that runs after it.

    .venv/bin/python integration/bench/after_kafka.py --pairs 2

Each cycle runs Kafka (five produce-1p runs of 300,000 records), stops it (its folder
removed, as run.py does), then one agent: a warm-up of 300,000 records produced and
consumed, then three produce-1p runs. Every other cycle waits first: a `sync` and 20 s.
Each cycle prints one JSON line: the dirty and writeback memory at Kafka's end, how long
its stop and the sync took, a 100 KB write + fsync probe's p50 and maximum (ms) before
the agent starts, and the agent's MB/s (the warm-up first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402

RECORDS = 300_000
KAFKA_RUNS = 5
AGENT_RUNS = 3
WAIT_S = 20.0


def memory_mb() -> dict[str, int]:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":")
            fields[name] = int(value.split()[0]) // 1024
    return {name: fields[name] for name in ("Dirty", "Writeback")}


def fsync_probe(writes: int = 20) -> tuple[float, float]:
    """p50 and maximum ms of a 100 KB write and fsync into a fresh file."""
    took = []
    with tempfile.NamedTemporaryFile() as f:
        for _ in range(writes):
            f.write(os.urandom(100_000))
            began = time.perf_counter()
            f.flush()
            os.fsync(f.fileno())
            took.append((time.perf_counter() - began) * 1000)
    took.sort()
    return round(took[len(took) // 2], 2), round(took[-1], 2)


def cycle(wait: bool) -> dict[str, Any]:
    kafka = bench.Kafka()
    kafka.start()
    try:
        for i in range(KAFKA_RUNS):
            topic = f"k{i}"
            bench.create_topic(kafka.bootstrap, topic, 1)
            bench.producers_perf(kafka.bootstrap, topic, 1, RECORDS, "none")
        at_stop = memory_mb()
    finally:
        began = time.monotonic()
        kafka.stop()
    info: dict[str, Any] = {
        "wait": wait,
        "memory_mb_at_stop": at_stop,
        "stop_s": round(time.monotonic() - began, 1),
    }
    if wait:
        began = time.monotonic()
        os.sync()
        info["sync_s"] = round(time.monotonic() - began, 1)
        time.sleep(WAIT_S)
    info["fsync_probe_ms"] = fsync_probe()
    agent = bench.Bucketlog(1, [])
    agent.start()
    try:
        bench.create_topic(agent.bootstrap, "warm", 1)
        runs = [bench.producers_perf(agent.bootstrap, "warm", 1, RECORDS, "none")["mb_s"]]
        bench.consumer_perf(agent.bootstrap, "warm", RECORDS)
        for i in range(AGENT_RUNS):
            topic = f"p{i}"
            bench.create_topic(agent.bootstrap, topic, 1)
            runs.append(bench.producers_perf(agent.bootstrap, topic, 1, RECORDS, "none")["mb_s"])
    finally:
        agent.stop()
    info["agent_mb_s_warm_up_then_runs"] = [round(r, 1) for r in runs]
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.pairs):
        for wait in (False, True):
            print(json.dumps(cycle(wait)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
