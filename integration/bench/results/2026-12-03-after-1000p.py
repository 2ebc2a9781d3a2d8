"""consume-1p right after produce-1000p-1x-none's three runs, on one agent.

    .venv/bin/python integration/bench/results/2026-12-03-after-1000p.py

Three one-partition topics written with 300,000 1 KiB records each, then (P1000=1, the
default) three 1,000-partition topics of 300,000 records each, or (P1000=0) 15 s of
nothing; ConsumerPerformance reads the first two one-partition topics one after the
other, measured as run.py's measure() does; then twelve 5 s windows of the agent's
tree's CPU, and a read of the third topic.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

FIGURES = ("mb_s", "broker_cpu_s", "broker_cpu_s_per_gb", "broker_workers_cpu_s")

system = B.Bucketlog(1)
system.start()
try:
    records = 300_000
    c = []
    for i in range(3):
        t = f"c1p-{i}"
        B.create_topic(system.bootstrap, t, 1)
        B.producers_perf(system.bootstrap, t, 1, records, "none")
        c.append(t)
    if os.environ.get("P1000", "1") == "1":
        for i in range(3):
            t = f"p1000-{i}"
            B.create_topic(system.bootstrap, t, 1000)
            B.producers_perf(system.bootstrap, t, 1, records, "none")
    else:
        time.sleep(3 * 5)
    for t in c[:2]:
        r = B.measure(
            system,
            records * 1024 / 1e6,
            lambda t=t: B.consumer_perf(system.bootstrap, t, records),
        )
        print(json.dumps({k: r[k] for k in FIGURES}), flush=True)
    for _ in range(12):
        u0 = B.tree_cpu_user_system(system.root_pid)
        time.sleep(5)
        u1 = B.tree_cpu_user_system(system.root_pid)
        print("idle 5s", round(sum(u1) - sum(u0), 2), flush=True)
    r = B.measure(
        system,
        records * 1024 / 1e6,
        lambda t=c[2]: B.consumer_perf(system.bootstrap, t, records),
    )
    print("late", json.dumps({k: r[k] for k in FIGURES}), flush=True)
finally:
    system.stop()
