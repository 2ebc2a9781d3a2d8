"""The python-confluent-kafka workload with its produce and consume halves measured
apart: the broker's CPU in each half (for bucketlog also its event loop's thread apart
from its other threads), and what the rest of the machine did beside it.

Usage (from the checkout, its venv):
    .venv/bin/python integration/bench/results/2026-12-06-confluent-split.py RUNS [RECORDS [WARM]]

Kafka and one bucketlog agent run side by side, each warmed up with WARM runs of the
workload first (default 1); then RUNS runs each of RECORDS records (default 500,000),
the systems taking turns run by run. Each line:
the system, the half, MB/s, the broker's CPU s (user + system) and per GB, compaction's
workers' part of it and the loop thread's (bucketlog), the client's (this process: librdkafka's threads) and the
machine's other CPU s (every process but the broker and this one, the kernel's
threads among them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import run  # noqa: E402  (integration/bench/run.py)

RECORDS = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
WARM = int(sys.argv[3]) if len(sys.argv) > 3 else 1
SIZE = run.RECORD_SIZE


def loop_thread_cpu(pid: int) -> float:
    """CPU s of the process's first thread (bucketlog's event loop)."""
    ticks = run.stat_ticks(f"/proc/{pid}/task/{pid}/stat")
    return sum(ticks) / run.CLK_TCK if ticks else 0.0


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class Snapshot:
    def __init__(self, system: run.System) -> None:
        self.broker, self.workers = run.tree_cpu_split(system.root_pid)
        self.loop = loop_thread_cpu(system.root_pid) if system.name != "kafka" else 0.0
        self.client = own_cpu()
        self.machine = run.machine_cpu()[0]
        self.at = time.monotonic()


def figures(system: run.System, half: str, before: Snapshot, after: Snapshot) -> dict:
    gb = RECORDS * SIZE / 1e9
    broker = after.broker - before.broker
    client = after.client - before.client
    other = (after.machine - before.machine) - broker - client
    out = {
        "system": system.name,
        "half": half,
        "mb_s": round(gb * 1000 / (after.at - before.at), 1),
        "broker_cpu_s": round(broker, 2),
        "broker_cpu_s_per_gb": round(broker / gb, 2),
        "workers_cpu_s": round(after.workers - before.workers, 2),
        "client_cpu_s": round(client, 2),
        "machine_other_cpu_s": round(other, 2),
    }
    if system.name != "kafka":
        out["loop_cpu_s"] = round(after.loop - before.loop, 2)
    return out


def one_run(system: run.System, topic: str) -> list[dict]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    run.create_topic(system.bootstrap, topic, 1)
    payload = os.urandom(SIZE)
    producer = Producer(
        {
            "bootstrap.servers": system.bootstrap,
            "acks": "all",
            "linger.ms": run.LINGER_MS,
            "batch.size": 1048576,
        }
    )
    failed = [0]

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed[0] += 1

    producer.list_topics(timeout=30)  # connected before the clock starts
    before = Snapshot(system)
    run.produce_all(producer, topic, payload, RECORDS, report, time.monotonic() + 120)
    if producer.flush(120) != 0 or failed[0]:
        raise RuntimeError(f"produce: {failed[0]} failed")
    produced = Snapshot(system)
    time.sleep(3)  # the flushes' tails and commits out of the consume half
    consumer = Consumer(
        {
            "bootstrap.servers": system.bootstrap,
            "group.id": f"split-{topic}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    start = Snapshot(system)
    got = 0
    deadline = time.monotonic() + 120
    while got < RECORDS and time.monotonic() < deadline:
        for m in consumer.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    consumed = Snapshot(system)
    consumer.close()
    if got != RECORDS:
        raise RuntimeError(f"consumed {got} of {RECORDS}")
    return [
        figures(system, "produce", before, produced),
        figures(system, "consume", start, consumed),
    ]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with run.side_by_side() as systems:
        for w in range(WARM):
            for s in systems:
                one_run(s, f"warm-{s.name}-{w}")
                time.sleep(5)
        for i in range(runs):
            for s in systems:
                for line in one_run(s, f"split-{s.name}-{i}"):
                    line["run"] = i
                    print(json.dumps(line), flush=True)
                time.sleep(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
