"""consume-1p's read of what an agent still holds, and of the same data merged to level 1.

    .venv/bin/python integration/bench/results/2026-12-04-level-reads.py WAIT_S

One agent of this checkout (compaction on, as by default): three one-partition topics
written with 300,000 1 KiB records by ProducerPerformance; WAIT_S seconds; then
ConsumerPerformance reading each topic, measured as run.py does. With WAIT_S 2 the read
finds the level-0 ingest objects (read-ahead GETs of about 470 KB each, 638-667 a read);
with WAIT_S 90, compaction has merged them into level-1 objects of about 4 MB (68-77 GETs
a read). One line a read: its MB/s, the client's, the agent's and compaction's workers'
CPU seconds, and the read path's counters that moved.

2026-12-04, 22:19-22:33, three agents of each kind (the third of each with perf
recording the agent during its second read):

    WAIT_S 2   329.2 388.6 409.2 | 367.1 338.7 322.7 | 286.1 209.9 307.4 MB/s
    WAIT_S 90  256.5 262.8 255.2 | 243.5 263.5 267.3 | 279.3 263.7 266.3 MB/s

The agent answered in about the same time either way (its Fetch requests under 0.5 ms:
285-290 of 299 at level 0, 271-278 at level 1), with 299-300 Fetches a read.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 300_000
wait = float(sys.argv[1])
system = B.Bucketlog(1)
system.start()
try:
    topics = []
    for k in range(3):
        topic = f"c{k}"
        B.create_topic(system.bootstrap, topic, 1)
        B.producers_perf(system.bootstrap, topic, 1, RECORDS, "none")
        topics.append(topic)
    time.sleep(wait)
    for topic in topics:
        before = system.counters() or {}
        client0 = B.client_cpu_seconds()
        cpu0 = B.tree_cpu_split(system.root_pid)
        read = B.consumer_perf(system.bootstrap, topic, RECORDS)
        client1 = B.client_cpu_seconds()
        cpu1 = B.tree_cpu_split(system.root_pid)
        time.sleep(1.2)
        after = system.counters() or {}
        line = {
            "wait_s": wait,
            "mb_s": read["mb_s"],
            "client_cpu_s": round(client1 - client0, 2),
            "agent_cpu_s": round(cpu1[0] - cpu0[0], 2),
            "workers_cpu_s": round(cpu1[1] - cpu0[1], 2),
            "read_path": {
                key: after[key] - before.get(key, 0)
                for key in sorted(after)
                if key.startswith(("read_ahead.", "reader.", "cache.", "store.gets"))
                and after[key] != before.get(key, 0)
            },
        }
        print(json.dumps(line), flush=True)
finally:
    system.stop()
