"""Compaction before and after, on a small local workload: objects per partition, and
the GETs and MB/s of a catch-up read.

`.venv/bin/python integration/bench/compaction_catch_up.py [--partitions 8] [--flushes
1200] [--batch-kib 8]` produces FLUSHES Produce requests (one ingest file each), each
with a batch of BATCH_KIB KiB (1 KiB records, random bytes, no compression) for every
partition, into one topic on `bucketlog serve` with compaction off. Then, each time on a
freshly started agent (nothing cached) of the same stores, a confluent-kafka consumer
reads from offset 0 one partition alone, then every partition: first as written, then
after an agent compacted with the default settings (but a minimum age of 1 ms, no wait
for level 2 and a pass every 200 ms: the data is taken as long written). Prints a
markdown table: objects per partition, GETs (every GET of the agent's store, read-ahead
included), GETs per GB read and MB/s (10^6 B of record values per second of the read).
A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metadata import keys, log  # noqa: E402
from metadata import topics as topics_layer  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from tests.e2e.test_retention import create, wait_for  # noqa: E402
from tests.e2e.wire import WireClient, produce  # noqa: E402
from tests.support.brokerproc import BrokerProcess, free_ports  # noqa: E402

TOPIC = "catch-up"
OFF = ["--compaction", "false"]
COMPACT = [
    "--compaction-min-age-ms",
    "1",
    "--compaction-l2-max-wait-ms",
    "1",
    "--compaction-interval-ms",
    "200",
]


def objects_per_partition(broker: BrokerProcess, partitions: int) -> list[int]:
    sub = keys.cluster_subspace("default")

    def read(tr):  # type: ignore[no-untyped-def]
        topic = topics_layer.get_topic(tr, sub, TOPIC)
        return [
            len({e.object_key for e in log.read_chunks(tr, sub, topic.topic_id, p, 0)})
            for p in range(partitions)
        ]

    return list(broker.read_metadata(read))


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def queued(broker: BrokerProcess) -> int:
    """Ingest files waiting for compaction."""
    sub = keys.cluster_subspace("default")
    return len(broker.read_metadata(lambda tr: tr.get_range(*sub.range(keys.L0_OBJECT))))


def catch_up(broker: BrokerProcess, partitions: list[int], records: int) -> dict[str, float]:
    """Read `records` records of the partitions from offset 0; GETs, GB and MB/s."""
    gets_before = broker.stats().get("store", {}).get("gets", 0)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    got = size = 0
    started = time.monotonic()
    while got < records:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got += 1
            size += len(msg.value())
    seconds = time.monotonic() - started
    consumer.close()
    time.sleep(1.5)  # the stats file is written once a second
    gets = broker.stats()["store"]["gets"] - gets_before
    return {"gets": gets, "gb": size / 1e9, "mb_s": size / 1e6 / seconds}


def compact(start: Callable[[list[str]], BrokerProcess]) -> dict[str, float]:
    """Run an agent with compaction on until it has nothing left to do; its counters."""
    broker = start(COMPACT)
    assert broker.proc is not None
    began = cpu_seconds(broker.proc.pid)
    wait_for("level-1 jobs done", lambda: queued(broker) <= 1, timeout=600)
    # Level-2 jobs: done once their count has not moved for 5 s.
    counts: list[int] = []

    def settled() -> bool:
        counts.append(broker.stats().get("compaction", {}).get("l2_jobs", 0))
        time.sleep(1.0)
        return len(counts) > 5 and counts[-1] == counts[-6]

    wait_for("level-2 jobs done", settled, timeout=600)
    stats: dict[str, float] = broker.stats()["compaction"]
    # The whole agent's CPU while it compacted (metadata transactions included); it
    # did nothing else but its idle loops.
    stats["agent_cpu_seconds"] = round(cpu_seconds(broker.proc.pid) - began, 2)
    broker.stop()
    return stats


def read_back(
    start: Callable[[list[str]], BrokerProcess], partitions: int, per_partition: int
) -> tuple[list[int], dict[str, float], dict[str, float]]:
    """Objects per partition; a catch-up read of partition 0, then of every partition,
    each by a freshly started agent."""
    broker = start(OFF)
    objects = objects_per_partition(broker, partitions)
    one = catch_up(broker, [0], per_partition)
    broker.stop()
    broker = start(OFF)
    every = catch_up(broker, list(range(partitions)), per_partition * partitions)
    broker.stop()
    return objects, one, every


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--flushes", type=int, default=1200)
    parser.add_argument("--batch-kib", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    try:
        return run(args, root / "data")
    finally:  # a run leaves gigabytes
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, data_dir: Path) -> int:
    port = free_ports(1)[0]

    def start(extra: list[str]) -> BrokerProcess:
        return BrokerProcess(data_dir=data_dir, port=port, extra_args=extra).start()

    broker = start(OFF)
    create(broker, TOPIC, args.partitions)
    ts = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as client:
        for _ in range(args.flushes):
            batch = {
                p: build_batch([(None, os.urandom(1024), [], ts)] * args.batch_kib)
                for p in range(args.partitions)
            }
            assert all(a.error_code == 0 for a in produce(client, {TOPIC: batch}).values())
    broker.stop()
    per_partition = args.flushes * args.batch_kib
    rows = [("as written", *read_back(start, args.partitions, per_partition), {})]
    stats = compact(start)
    rows.append(("compacted", *read_back(start, args.partitions, per_partition), stats))
    print(
        f"{args.partitions} partitions, {args.flushes} flushes of {args.batch_kib} KiB per "
        f"partition ({args.partitions * args.flushes * args.batch_kib / 1024:.0f} MiB)\n"
    )
    print("| layout | objects per partition | read | GETs | GETs per GB | MB/s |")
    print("|---|---|---|---|---|---|")
    for label, objects, one, every, _stats in rows:
        for what, r in (("one partition", one), ("every partition", every)):
            print(
                f"| {label} | {min(objects)}-{max(objects)} | {what} | {r['gets']:.0f} | "
                f"{r['gets'] / r['gb']:.0f} | {r['mb_s']:.1f} |"
            )
    stats = rows[1][4]
    gb = stats["bytes_written"] / 1e9
    print(f"\ncompaction: {stats}")
    print(
        f"CPU seconds per GB written: {stats['cpu_seconds'] / gb:.1f} in the jobs' threads, "
        f"{stats['agent_cpu_seconds'] / gb:.1f} for the whole agent"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
