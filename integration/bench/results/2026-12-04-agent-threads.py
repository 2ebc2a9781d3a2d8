"""Where an agent's CPU goes by thread in consume-1p and half-load, with its page faults
and its garbage collections; and the same with glibc's allocator told to keep what it
frees.

    .venv/bin/python integration/bench/results/2026-12-04-agent-threads.py MODE [MODE ...]

MODE is `plain` or `tuned` (GLIBC_TUNABLES: no trimming of the heap, no mmap below 32
MiB, so that memory freed is kept and used again rather than given back and touched
anew). For each MODE, one agent of this checkout: two one-partition topics and one of
64 partitions written with 300,000 1 KiB records each, 20 s to settle; then
ConsumerPerformance reads each one-partition topic, and ProducerPerformance writes twice
at 35,000 records/s for 12 s into a fresh one-partition topic (2 s of warm-up), measured
as run.py's measure() does. A JSON line each: the agent's CPU by thread (user + system
from /proc, the threads named by `py-spy dump` before and after the run: PY_SPY, default
`py-spy` on PATH; "(unnamed)" without it, or for a thread that ended before the second
dump), its minor page faults, and the garbage collector's runs and
CPU per generation, counted in the agent by gc.callbacks from a sitecustomize module put
on its PYTHONPATH.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

TUNED = "glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432"
PY_SPY = os.environ.get("PY_SPY", "py-spy")
RECORDS = 300_000
RATE = 35_000

# Runs in the agent at start (sitecustomize): gc.callbacks sum each generation's
# collections and their thread CPU, written to GC_FILE.<pid> every second (compaction's
# worker processes, which inherit the hook, to files of their own).
SITECUSTOMIZE = """
import gc, json, os, threading, time
_acc = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0]}
_began = {}
def _timed(phase, info):
    g = info["generation"]
    if phase == "start":
        _began[g] = time.thread_time()
    elif g in _began:
        _acc["n"][g] += 1
        _acc["s"][g] += time.thread_time() - _began.pop(g)
def _write():
    while True:
        time.sleep(1)
        path = f"{os.environ['GC_FILE']}.{os.getpid()}"
        with open(path + ".tmp", "w") as f:
            json.dump(_acc, f)
        os.replace(path + ".tmp", path)
if os.environ.get("GC_FILE"):
    gc.callbacks.append(_timed)
    threading.Thread(target=_write, daemon=True).start()
"""


def thread_names(pid: int) -> dict[str, str]:
    try:
        dump = subprocess.run(
            [PY_SPY, "dump", "--nonblocking", "-p", str(pid)], capture_output=True, text=True
        ).stdout
    except OSError:
        return {}
    return {
        m[1]: m[2] for m in re.finditer(r'Thread (\d+) \((?:idle|active)[^)]*\): "([^"]*)"', dump)
    }


def by_thread(pid: int, names: dict[str, str]) -> tuple[dict[str, float], int]:
    """CPU seconds by thread name, and minor faults, of the threads alive now."""
    cpu: dict[str, float] = {}
    faults = 0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(tid, "(unnamed)")
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        faults += int(fields[7])
    return cpu, faults


def gc_sums(path: Path) -> dict[str, list[float]]:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0]}


def one(mode: str) -> None:
    hook = Path(tempfile.mkdtemp(prefix="agent-threads-"))
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": str(hook), "GC_FILE": str(hook / "gc.json")}
    if mode == "tuned":
        env["GLIBC_TUNABLES"] = TUNED
    system = B.Bucketlog(1, env=env)
    system.start()
    pid = system.root_pid
    gc_file = hook / f"gc.json.{pid}"
    try:
        topics = []
        for i in range(2):
            t = f"c1p-{i}"
            B.create_topic(system.bootstrap, t, 1)
            B.producers_perf(system.bootstrap, t, 1, RECORDS, "none")
            topics.append(t)
        B.create_topic(system.bootstrap, "other", 64)
        B.producers_perf(system.bootstrap, "other", 1, RECORDS, "none")
        time.sleep(20)
        rows = [
            (
                "consume-1p",
                RECORDS * 1024 / 1e6,
                lambda t=t: B.consumer_perf(system.bootstrap, t, RECORDS),
            )
            for t in topics
        ]
        for i in range(2):
            t = f"half-{i}"
            B.create_topic(system.bootstrap, t, 1)
            n, warmup = RATE * 12, RATE * 2
            rows.append(
                (
                    "half-load",
                    n * 1024 / 1e6,
                    lambda t=t, n=n, w=warmup: B.producers_perf(
                        system.bootstrap, t, 1, n, "none", RATE, w
                    ),
                )
            )
        for row, megabytes, fn in rows:
            names = thread_names(pid)
            time.sleep(1.1)  # a fresh write of the collector's sums
            g0 = gc_sums(gc_file)
            c0, f0 = by_thread(pid, names)
            r = B.measure(system, megabytes, fn)
            names.update(thread_names(pid))  # threads started during the run
            c1, f1 = by_thread(pid, names)
            time.sleep(1.1)
            g1 = gc_sums(gc_file)
            line = {
                "mode": mode,
                "row": row,
                "mb_s": r["mb_s"],
                "p99_ms": r.get("p99_ms"),
                "cpu_s": r["broker_cpu_s"],
                "cpu_gb": r["broker_cpu_s_per_gb"],
                "workers": r["broker_workers_cpu_s"],
                # threads that ended meanwhile are not counted (nor their faults)
                "threads": {k: round(v - c0.get(k, 0.0), 2) for k, v in c1.items()},
                "minor_faults": f1 - f0,
                "gc_runs": [int(g1["n"][i] - g0["n"][i]) for i in range(3)],
                "gc_ms": [round((g1["s"][i] - g0["s"][i]) * 1000, 1) for i in range(3)],
            }
            print(json.dumps(line), flush=True)
    finally:
        system.stop()
        shutil.rmtree(hook, ignore_errors=True)


for m in sys.argv[1:]:
    one(m)
