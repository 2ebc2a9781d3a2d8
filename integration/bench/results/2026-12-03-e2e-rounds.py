"""run.py's end-to-end workload in rounds on one agent, with its counters.

    [CMD="<agent command>"] [ROUNDS=2] .venv/bin/python \
        integration/bench/results/2026-12-03-e2e-rounds.py LABEL [spy]

One agent (`CMD`, default this checkout's `bucketlog`) with compaction off; ROUNDS times,
a fresh one-partition topic and run.py's end_to_end at 1,000 records/s for 10 s; per
round, the p50 / p99 end to end and of the produce acks, the agent's user and system
CPU seconds over the round, and the counters that moved. With `spy`, `py-spy record
--native -r 100 --threads` of the agent during the second round, into LABEL.raw
(py-spy stops the process at every sample in this mode: that round's latencies are not
comparable).
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
system = B.Bucketlog(1, extra_args=["--compaction=false"], command=os.environ.get("CMD"))
system.start()
try:
    for k in range(int(os.environ.get("ROUNDS", "2"))):
        t = f"e2e{k}"
        B.create_topic(system.bootstrap, t, 1)
        time.sleep(1)
        c0 = system.counters() or {}
        u0 = B.tree_cpu_user_system(system.root_pid)
        sp = None
        if spy and k == 1:
            sp = subprocess.Popen(
                ["py-spy", "record", "--native", "-r", "100", "-f", "raw", "-d", "14"]
                + ["--threads", "-o", f"{label}.raw", "--pid", str(system.root_pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        r = B.end_to_end(system.bootstrap, t, 1000, 10)
        u1 = B.tree_cpu_user_system(system.root_pid)
        time.sleep(1.2)
        c1 = system.counters() or {}
        if sp:
            sp.wait()
        line = {
            "e2e_p50": round(r["e2e_p50_ms"], 2),
            "e2e_p99": round(r["e2e_p99_ms"], 2),
            "prod_p99": round(r["produce_p99_ms"], 2),
            "user": round(u1[0] - u0[0], 2),
            "sys": round(u1[1] - u0[1], 2),
        }
        print(json.dumps(line), flush=True)
        moved = {key: c1[key] - c0.get(key, 0) for key in sorted(c1) if c1[key] != c0.get(key)}
        print(json.dumps(moved), flush=True)
finally:
    system.stop()
