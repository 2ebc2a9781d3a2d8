"""consume-1p's read of level-1 objects, mapped against read, on agents of two trees.

    A=<tree> B=<tree> .venv/bin/python integration/bench/results/2026-12-04-level1-read-paired.py PAIRS

PAIRS pairs of one-agent brokers, the order alternating: `mapped` runs the tree A (a
range of 1 MiB or more that the read path asks for as a view is the object's file
mapped, storage/local.py MAP_MIN), `read` the tree B (the same with MAP_MIN at 32 MiB, so
that the level-1 objects, about 4 MB, are read with pread into the allocator's reused
buffers). Each agent: three one-partition topics written with 300,000 1 KiB records by
ProducerPerformance, 75 s for compaction to merge them into level-1 objects, then
ConsumerPerformance reading each topic (read-ahead GETs of level-1 objects, as the
main table's consume-1p row does after the rows before it).

Why it was tried: in one perf profile each (2,000 Hz, the event loop's thread), the
writev copy into the socket (`_copy_from_iter`) had 245 samples reading level-1 objects
against 40 reading level-0 ones held in the agent's memory; apart (300 MB of 4 MiB
objects sent to a socket in 1 MiB writes), the sender spent 0.24-0.56 s per GB copying
from a populated mapping and 0.19-0.34 from a buffer a thread had just read.

2026-12-04, 22:35-22:44 (two pairs; the third stopped once two agreed):

    mapped  262.0 302.3 259.7 270.5 234.2 220.1 MB/s   agent 0.39-0.54 CPU s a read
    read    251.5 265.4 264.9 260.6 238.4 261.1 MB/s   agent 0.47-0.57 CPU s a read

No gain: the medians of the reads are 261 MB/s both ways, and reading costs the agent a
little more CPU. Not kept.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 300_000
PYTHON = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python")
COMMANDS = {
    "mapped": f"env PYTHONPATH={os.environ['A']} {PYTHON} -m broker",
    "read": f"env PYTHONPATH={os.environ['B']} {PYTHON} -m broker",
}

for pair in range(int(sys.argv[1])):
    for label in ("mapped", "read") if pair % 2 == 0 else ("read", "mapped"):
        system = B.Bucketlog(1, command=COMMANDS[label])
        system.start()
        try:
            topics = []
            for k in range(3):
                topic = f"c{k}"
                B.create_topic(system.bootstrap, topic, 1)
                B.producers_perf(system.bootstrap, topic, 1, RECORDS, "none")
                topics.append(topic)
            time.sleep(75)
            for topic in topics:
                before = system.counters() or {}
                client0 = B.client_cpu_seconds()
                cpu0 = B.tree_cpu_split(system.root_pid)
                read = B.consumer_perf(system.bootstrap, topic, RECORDS)
                client1 = B.client_cpu_seconds()
                cpu1 = B.tree_cpu_split(system.root_pid)
                time.sleep(1.2)
                after = system.counters() or {}

                def moved(name: str, before: dict = before, after: dict = after) -> int:
                    return int(after.get(name, 0) - before.get(name, 0))

                line = {
                    "pair": pair,
                    "variant": label,
                    "topic": topic,
                    "mb_s": read["mb_s"],
                    "agent_cpu_s": round(cpu1[0] - cpu0[0], 2),
                    "workers_cpu_s": round(cpu1[1] - cpu0[1], 2),
                    "client_cpu_s": round(client1 - client0, 2),
                    "level1_reads": moved("read_ahead.level1_reads"),
                    "gets": moved("store.gets"),
                    "reader_wait_ms": moved("reader.wait_ms"),
                }
                print(json.dumps(line), flush=True)
        finally:
            system.stop()
