"""An idle agent's CPU after writing, and its system calls.

    .venv/bin/python integration/bench/results/2026-12-03-idle-agent.py N [STRACE_OUT]

One agent of this checkout; topics of 1, 64 and 1,000 partitions, each written with
300,000 1 KiB records by ProducerPerformance; then the CPU seconds of the agent's process tree
(and of compaction's workers apart) over N windows of 10 s, and `strace -c -f` of its process tree
for 10 s more into STRACE_OUT (default idle.strace).
"""

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

system = B.Bucketlog(1)
system.start()
try:
    records = 300_000
    for j, n in enumerate([1, 64, 1000]):
        t = f"other{j}"
        B.create_topic(system.bootstrap, t, n)
        B.producers_perf(system.bootstrap, t, 1, records, "none")
    for k in range(int(sys.argv[1])):
        u0 = B.tree_cpu_split(system.root_pid)
        time.sleep(10)
        u1 = B.tree_cpu_split(system.root_pid)
        tree, workers = round(u1[0] - u0[0], 3), round(u1[1] - u0[1], 3)
        print(f"t+{(k + 1) * 10}s idle 10 s: {tree} CPU s, {workers} of it workers'", flush=True)
    print("tree", B.proc_tree(system.root_pid), flush=True)
    out = sys.argv[2] if len(sys.argv) > 2 else "idle.strace"
    p = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(system.root_pid)])
    time.sleep(10)
    p.send_signal(2)
    p.wait()
finally:
    system.stop()
