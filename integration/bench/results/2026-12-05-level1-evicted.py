"""consume-1p's read of level-1 objects evicted from the page cache and read through,
interleaved, on one agent.

    .venv/bin/python integration/bench/results/2026-12-05-level1-evicted.py

As 2026-12-04-level1-page-cache.py, with six topics, and before each even-numbered read
every level-1 object is dropped from the page cache (posix_fadvise DONTNEED; pages a
live mapping holds stay), before each odd one read through. One JSON line a read
(2026-12-05-level1-evicted.jsonl, 2026-12-05 00:18): the agent's CPU s per read of
307 MB 0.43, 0.35, 0.30 evicted against 0.43, 0.34, 0.30 read through; MB/s 282.8,
296.8, 349.2 against 382.0, 332.9, 361.2. The agent's CPU falls with its age, not with
the page cache. (The committed lines also carry an "s" field, always null: a
field consumer_perf never gave, since dropped.)
"""

import json
import os
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
    for k in range(6):
        topic = f"c{k}"
        B.create_topic(system.bootstrap, topic, 1)
        B.producers_perf(system.bootstrap, topic, 1, RECORDS, "none")
        topics.append(topic)
    time.sleep(90)
    paths = B.large_objects(system.dir / "data")
    for i, topic in enumerate(topics):
        if i % 2 == 0:
            for path in paths:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        else:
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
            "workers": round(cpu1[1] - cpu0[1], 2),
        }
        print(json.dumps(line), flush=True)
finally:
    system.stop()
