"""Where a flush's CPU goes at half load, by thread and by step.

Usage (from the checkout, its venv):
    .venv/bin/python integration/bench/results/2026-12-06-flush-cpu.py [RATE [SECONDS]]

One agent on a local folder (run.py's settings) takes ProducerPerformance's records at
RATE records/s (default 35,000, half load's rate) for SECONDS (default 20) plus 6 s of
warm-up. A sitecustomize on the agent's path wraps four steps of the flush in its upload
thread and adds up the thread CPU (time.thread_time) and the wall time of every call:
the segment write (pwritev and fdatasync), the metadata transaction (SQLite's, with its
commit and sync), commit_ingest inside it (the reads, the chunk entries, producer
states and writes), and the whole upload-and-commit. Over the same 10 s window the
agent's threads' CPU from /proc: the event loop's (the process's first thread) apart
from the others. One JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import run  # noqa: E402  (integration/bench/run.py)

SITE = """
import json, os, threading, time
_stats = {}
_lock = threading.Lock()

def _add(label, cpu, wall):
    with _lock:
        s = _stats.setdefault(label, [0, 0.0, 0.0])
        s[0] += 1; s[1] += cpu; s[2] += wall

def _wrap(owner, name, label):
    f = getattr(owner, name)
    def wrapped(*a, **k):
        c, w = time.thread_time(), time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            _add(label, time.thread_time() - c, time.perf_counter() - w)
    setattr(owner, name, wrapped)

def _install():
    import broker.ingest as ingest, metadata.sqlite_kv as sqlite_kv, storage.segments as seg
    _wrap(seg.SegmentWriter, "write", "segment_write")
    _wrap(sqlite_kv.SQLiteKV, "transact_sync", "transaction")
    _wrap(ingest.IngestPipeline, "_put_and_commit", "upload_and_commit")
    _wrap(ingest, "commit_ingest", "commit_ingest")
    signal_path = os.environ["FLUSH_CPU_SIGNAL"]
    while True:
        time.sleep(0.2)
        if os.path.exists(signal_path + ".start"):
            with _lock:
                _stats.clear()
            os.remove(signal_path + ".start")
        if os.path.exists(signal_path + ".stop"):
            with _lock:
                out = {k: list(v) for k, v in _stats.items()}
            with open(signal_path + ".out", "w") as fh:
                json.dump(out, fh)
            os.remove(signal_path + ".stop")

if os.environ.get("FLUSH_CPU_SIGNAL"):
    threading.Thread(target=lambda: (time.sleep(2), _install()), daemon=True).start()
"""


def thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        ticks = run.stat_ticks(f"/proc/{pid}/task/{tid}/stat")
        if ticks is not None:
            out[int(tid)] = sum(ticks) / run.CLK_TCK
    return out


def main() -> int:
    rate = int(sys.argv[1]) if len(sys.argv) > 1 else 35_000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    site = Path(tempfile.mkdtemp(prefix="flush-cpu-"))
    (site / "sitecustomize.py").write_text(SITE)
    signal = str(site / "signal")
    path = os.environ.get("PYTHONPATH")
    agent = run.Bucketlog(
        1,
        env={
            "FLUSH_CPU_SIGNAL": signal,
            "PYTHONPATH": f"{site}:{path}" if path else str(site),
        },
    )
    agent.start()
    try:
        run.create_topic(agent.bootstrap, "half", 1)
        records = int(rate * (seconds + 6))
        failed: list[BaseException] = []

        def produce() -> None:
            try:
                run.producer_perf(agent.bootstrap, "half", records, "none", rate)
            except BaseException as exc:
                failed.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(6)
        Path(signal + ".start").touch()
        time.sleep(0.5)
        before, began = thread_cpu(agent.root_pid), time.monotonic()
        time.sleep(10)
        after, ended = thread_cpu(agent.root_pid), time.monotonic()
        Path(signal + ".stop").touch()
        while not Path(signal + ".out").exists():
            time.sleep(0.1)
        steps = json.loads(Path(signal + ".out").read_text())
        producer.join()
    finally:
        agent.stop()
    if failed:
        raise RuntimeError(f"the producer failed: {failed[0]}")
    pid = agent.root_pid
    loop = after.get(pid, 0.0) - before.get(pid, 0.0)
    others = sum(v - before.get(t, 0.0) for t, v in after.items() if t != pid)
    flushes = steps.get("upload_and_commit", [0])[0]
    if not steps.get("segment_write"):
        raise RuntimeError(f"no flush counted in the window: {steps}")
    line = {
        "rate": rate,
        "window_s": round(ended - began, 2),
        "loop_cpu_s": round(loop, 2),
        "other_threads_cpu_s": round(others, 2),
        "own_commits_in_steps_window": flushes,
        "steps": {
            label: {
                "calls": n,
                "cpu_us_per_call": round(cpu / n * 1e6),
                "wall_us_per_call": round(wall / n * 1e6),
            }
            for label, (n, cpu, wall) in sorted(steps.items())
            if n
        },
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    subprocess.run(["sync"], check=False)
    sys.exit(main())
