"""consume-1p profiled with perf, on a fresh agent.

    .venv/bin/python integration/bench/results/2026-12-03-consume-1p-perf.py LABEL [spy]

One agent of this checkout; three topics of one partition and one of 64 partitions, each
written with 300,000 1 KiB records by ProducerPerformance; SETTLE seconds (default 60);
then ConsumerPerformance reads each one-partition topic in turn, measured as run.py's
measure() does, and one JSON line each. With `spy`, `perf record -g -F 999` of the
agent's process tree runs during the second read, into LABEL.perf.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

label = sys.argv[1]
spy = len(sys.argv) > 2 and sys.argv[2] == "spy"
settle = float(os.environ.get("SETTLE", "60"))
system = B.Bucketlog(1)
system.start()
try:
    records = 300_000
    topics = []
    for i in range(3):
        t = f"c1p-{i}"
        B.create_topic(system.bootstrap, t, 1)
        B.producers_perf(system.bootstrap, t, 1, records, "none")
        topics.append(t)
    # fill the cache with something else, as the table's other rows do
    t = "other"
    B.create_topic(system.bootstrap, t, 64)
    B.producers_perf(system.bootstrap, t, 1, records, "none")
    time.sleep(settle)
    print("tree", B.proc_tree(system.root_pid), flush=True)
    for i, t in enumerate(topics):
        u0 = B.tree_cpu_user_system(system.root_pid)
        sp = None
        if spy and i == 1:
            tree = ",".join(map(str, B.proc_tree(system.root_pid)))
            sp = subprocess.Popen(
                ["perf", "record", "-g", "-F", "999", "-o", f"{label}.perf", "-p", tree],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        r = B.measure(
            system,
            records * 1024 / 1e6,
            lambda t=t: B.consumer_perf(system.bootstrap, t, records),
        )
        u1 = B.tree_cpu_user_system(system.root_pid)
        if sp:
            sp.send_signal(2)
            sp.wait()
        line = {
            "topic": t,
            "mb_s": r["mb_s"],
            "cpu_s": r["broker_cpu_s"],
            "cpu_gb": r["broker_cpu_s_per_gb"],
            "workers": r["broker_workers_cpu_s"],
            "wall": r["wall_s"],
            "user": round(u1[0] - u0[0], 2),
            "sys": round(u1[1] - u0[1], 2),
            "gets": r["gets"],
            "mreads": r["metadata_reads"],
            "path": r["read_path"],
        }
        print(json.dumps(line), flush=True)
finally:
    system.stop()
