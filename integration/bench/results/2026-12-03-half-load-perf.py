"""The half-load row on one agent, profiled with perf.

    .venv/bin/python integration/bench/results/2026-12-03-half-load-perf.py [perf]

One agent of this checkout; a one-partition topic written with 300,000 1 KiB records,
20 s to settle; then twice ProducerPerformance at 35,000 records/s for 12 s into a
fresh one-partition topic (2 s of warm-up records), measured as run.py's measure()
does, with the flushes, batches, commits and PUTs the agent counted. With `perf`,
`perf record -g -F 499` of the agent's process tree runs during the second, into
half-load.perf.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

COUNTERS = ("pipeline.flushes", "pipeline.batches", "metadata.commits", "store.puts")
FIGURES = ("mb_s", "p99_ms", "broker_cpu_s", "broker_cpu_s_per_gb", "broker_workers_cpu_s")

profile = len(sys.argv) > 1 and sys.argv[1] == "perf"
system = B.Bucketlog(1)
system.start()
try:
    B.create_topic(system.bootstrap, "warm", 1)
    B.producers_perf(system.bootstrap, "warm", 1, 300_000, "none")
    time.sleep(20)
    rate = 35_000
    for i in range(2):
        t = f"half-{i}"
        B.create_topic(system.bootstrap, t, 1)
        n, warmup = rate * 12, rate * 2
        sp = None
        if profile and i == 1:
            tree = ",".join(map(str, B.proc_tree(system.root_pid)))
            sp = subprocess.Popen(
                ["perf", "record", "-g", "-F", "499", "-o", "half-load.perf", "-p", tree],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        c0 = system.counters()
        r = B.measure(
            system,
            n * 1024 / 1e6,
            lambda t=t, n=n, w=warmup: B.producers_perf(system.bootstrap, t, 1, n, "none", rate, w),
        )
        time.sleep(1.2)
        c1 = system.counters()
        if sp:
            sp.send_signal(2)
            sp.wait()
        counted = {k: c1.get(k, 0) - c0.get(k, 0) for k in COUNTERS}
        print(json.dumps({k: r.get(k) for k in FIGURES}), json.dumps(counted), flush=True)
finally:
    system.stop()
