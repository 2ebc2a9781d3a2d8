"""Compaction's CPU by process for one write into 64 partitions, until the agent is idle.

    .venv/bin/python integration/bench/results/2026-12-04-compaction-cpu.py ROUNDS [BASE_TREE]

Each round runs one agent of this checkout and, with BASE_TREE, one of that tree
(`env PYTHONPATH=BASE_TREE python -m broker`) first: ProducerPerformance writes
1,000,000 1 KiB records into a 64-partition topic, and then the script waits until the
agent's process tree used under 0.25 CPU s in each of 16 windows of 5 s in a row (at
most 900 s). Level-2 jobs wait 60 s (--compaction-l2-max-wait-ms 60000, 10 minutes by
default) so that they run within that wait. A JSON line per agent: CPU seconds (user,
system) and minor page faults of the agent, of compaction's process and of its worker
process, from before the write until idle, and compaction's counters.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 1_000_000
TICK = os.sysconf("SC_CLK_TCK")


def processes(root: int) -> dict[int, tuple[str, float, float, int]]:
    """Per process of the tree: its role, user and system CPU seconds, minor faults."""
    out = {}
    for pid in B.proc_tree(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid == root:
            role = "agent"
        elif b"resource_tracker" in cmd:
            role = "resource_tracker"
        elif int(f[1]) == root:
            role = "compaction_process"
        else:
            role = "worker"
        out[pid] = (role, int(f[11]) / TICK, int(f[12]) / TICK, int(f[7]))
    return out


def one(label: str, command: str | None) -> None:
    system = B.Bucketlog(1, extra_args=["--compaction-l2-max-wait-ms", "60000"], command=command)
    system.start()
    try:
        B.create_topic(system.bootstrap, "t64", 64)
        before = processes(system.root_pid)
        began = time.monotonic()
        B.producers_perf(system.bootstrap, "t64", 1, RECORDS, "none")
        last, quiet = None, 0
        while time.monotonic() - began < 900 and quiet < 16:
            time.sleep(5)
            now = sum(u + s for _, u, s, _ in processes(system.root_pid).values())
            quiet = quiet + 1 if last is not None and now - last < 0.25 else 0
            last = now
        roles: dict[str, dict[str, float]] = {}
        for pid, (role, user, system_s, faults) in processes(system.root_pid).items():
            b = before.get(pid, (role, 0.0, 0.0, 0))
            r = roles.setdefault(role, {"user": 0.0, "system": 0.0, "minor_faults": 0})
            r["user"] = round(r["user"] + user - b[1], 2)
            r["system"] = round(r["system"] + system_s - b[2], 2)
            r["minor_faults"] += faults - b[3]
        time.sleep(1.2)  # the counters' last write is at most a second old
        counters = system.counters() or {}
        line = {
            "agent": label,
            "waited_s": round(time.monotonic() - began, 1),
            "cpu": roles,
            "compaction": {k[11:]: v for k, v in counters.items() if k.startswith("compaction.")},
            "produced": counters.get("pipeline.bytes"),
        }
        print(json.dumps(line), flush=True)
    finally:
        system.stop()


rounds = int(sys.argv[1])
base = sys.argv[2] if len(sys.argv) > 2 else None
for _ in range(rounds):
    if base:
        one("base", f"env PYTHONPATH={base} {sys.executable} -m broker")
    one("this", None)
