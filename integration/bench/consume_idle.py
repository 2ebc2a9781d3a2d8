"""consume-1p's read with compaction idle, and of data just written: the agent's CPU.

    .venv/bin/python integration/bench/consume_idle.py [--topics 5] [--records 300000]

One agent (`serve --agents 1`, the local store; BENCH_BUCKETLOG as in run.py runs
another checkout). A warm-up topic is written and read; then `--topics` 1-partition
topics of `--records` records each and as many into 64 partitions are written with the
Java producer (the produce rows' data), and once compaction's counters have not moved
for 20 s (so that the reads find level-2 objects, written past the page cache), three of
the 1-partition topics are read one after the other with the Java consumer. Then one more
topic is written and read at once ("fresh": ingest objects, in the page cache).

Prints one JSON line per read: MB/s, and the agent's user and system CPU seconds per GB
read (its own process, from /proc; compaction's worker processes are not in it), the
store's GETs and MB read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as R  # noqa: E402  (integration/bench/run.py)

RECORD_BYTES = 1024


def compaction_moved(system: R.Bucketlog) -> tuple[int, int, int]:
    counters = system.counters()
    return (
        counters.get("compaction.bytes_written", 0),
        counters.get("compaction.l1_jobs", 0),
        counters.get("compaction.l2_jobs", 0),
    )


def user_sys(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / R.CLK_TCK, int(fields[12]) / R.CLK_TCK


def read(system: R.Bucketlog, topic: str, records: int, label: str) -> None:
    gb = records * RECORD_BYTES / 1e9
    user0, sys0 = user_sys(system.root_pid)
    before = system.counters()
    result = R.consumer_perf(system.bootstrap, topic, records)
    user1, sys1 = user_sys(system.root_pid)
    time.sleep(1.2)  # the agent writes its counters once a second
    after = system.counters()
    print(
        json.dumps(
            {
                "read": label,
                "mb_s": round(result["mb_s"], 1),
                "agent_user_s_per_gb": round((user1 - user0) / gb, 2),
                "agent_sys_s_per_gb": round((sys1 - sys0) / gb, 2),
                "gets": after.get("store.gets", 0) - before.get("store.gets", 0),
                "get_mb": round(
                    (after.get("store.bytes_got", 0) - before.get("store.bytes_got", 0)) / 1e6
                ),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=5)
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    R.settle_disk(lambda message: None)
    system = R.Bucketlog(1, [])
    system.start()
    try:
        R.create_topic(system.bootstrap, "warm", 1)
        R.producers_perf(system.bootstrap, "warm", 1, args.records, "none")
        R.consumer_perf(system.bootstrap, "warm", args.records)
        topics = [f"c{i}" for i in range(args.topics)]
        for topic in topics:
            R.create_topic(system.bootstrap, topic, 1)
            R.producers_perf(system.bootstrap, topic, 1, args.records, "none")
        R.create_topic(system.bootstrap, "p64", 64)
        R.producers_perf(system.bootstrap, "p64", 1, args.records, "none")
        began = still_since = time.monotonic()
        last = compaction_moved(system)
        while time.monotonic() - still_since < 20 and time.monotonic() - began < 300:
            time.sleep(1)
            now = compaction_moved(system)
            if now != last:
                last, still_since = now, time.monotonic()
        print(json.dumps({"waited_s": round(time.monotonic() - began)}), flush=True)
        for topic in topics[:3]:
            read(system, topic, args.records, "idle")
        R.create_topic(system.bootstrap, "fresh", 1)
        R.producers_perf(system.bootstrap, "fresh", 1, args.records, "none")
        read(system, "fresh", args.records, "fresh")
    finally:
        system.stop()


if __name__ == "__main__":
    main()
