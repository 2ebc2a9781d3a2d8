"""consume-1p's read of level-1 objects outside the page cache, and inside it.

    .venv/bin/python integration/bench/results/2026-12-04-level1-page-cache.py

One agent of this checkout (compaction on): four one-partition topics written with
300,000 1 KiB records by ProducerPerformance; 90 s for compaction to merge them into
level-1 objects, which it writes past the page cache (O_DIRECT); how much of the
objects over 1 MiB outside the segment folder the page cache holds (`fincore`); then
ConsumerPerformance reading each topic, the second and fourth after every such object
was read through once (into the page cache). One line a read: whether the objects were
read through just before, the page cache's bytes of them / their size, the read's MB/s
and the agent's CPU seconds.

2026-12-04, 23:12-23:19, two agents (the first read of each finds the objects out of the
page cache; every later read finds them in it, the third without a read-through of its
own):

    objects       in the page cache before the first read: 9.4 of 944.5 MB; 9.6 of 1,078.8
    first read    276.1 MB/s, 0.60 agent CPU s;  228.2 MB/s, 0.67 s
    later reads   325.5, 345.1, 316.7 MB/s, 0.33-0.35 s;  329.9, 335.6, 313.3, 0.34-0.36 s

(The first read of freshly written topics, in `2026-12-04-level-reads.py`, was 286.1-367.1
MB/s: it is not the first read as such that is slower.)
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 300_000
system = B.Bucketlog(1)
system.start()


try:
    topics = []
    for k in range(4):
        topic = f"c{k}"
        B.create_topic(system.bootstrap, topic, 1)
        B.producers_perf(system.bootstrap, topic, 1, RECORDS, "none")
        topics.append(topic)
    time.sleep(90)
    paths = B.large_objects(system.dir / "data")
    for i, topic in enumerate(topics):
        if i % 2 == 1:
            for path in paths:
                with open(path, "rb") as f:
                    while f.read(1 << 22):
                        pass
        cached = B.page_cache_bytes(paths)
        cpu0 = B.tree_cpu_split(system.root_pid)
        read = B.consumer_perf(system.bootstrap, topic, RECORDS)
        cpu1 = B.tree_cpu_split(system.root_pid)
        line = {
            "topic": topic,
            "read_through": i % 2 == 1,
            "page_cache_bytes": cached,
            "mb_s": read["mb_s"],
            "agent_cpu_s": round(cpu1[0] - cpu0[0], 2),
        }
        print(json.dumps(line), flush=True)
finally:
    system.stop()
