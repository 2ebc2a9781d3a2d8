"""End-to-end latency at 1,000 records/s for 50 s right after a backlog of 600,000
records in one partition, across compaction's burst (its level-1 and level-2 jobs start
30 s after the backlog was written). Arguments: one variant each, comma-separated
`bucketlog serve` arguments ('' for the defaults); a variant starting with 'ionice3;'
also puts compaction's worker processes (niceness 10) in the idle I/O class
(ionice -c3) as they appear. Thirty-second pass of integration/bench/README.md."""

import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import run as bench  # noqa: E402


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, niceness) of every process under pid."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,ni="], capture_output=True, text=True)
    kids: dict[int, list[tuple[int, int]]] = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if "-" in fields:  # a kernel thread's niceness
            continue
        p, parent, ni = (int(x) for x in fields)
        kids.setdefault(parent, []).append((p, ni))
    todo, found = [pid], []
    while todo:
        for p, ni in kids.get(todo.pop(), []):
            found.append((p, ni))
            todo.append(p)
    return found


def one(spec: str, seconds: float) -> dict[str, float]:
    idle_io = spec.startswith("ionice3;")
    args = [a for a in spec.removeprefix("ionice3;").split(",") if a]
    system = bench.Bucketlog(1, args)
    system.start()
    done = threading.Event()

    def to_idle_class() -> None:
        seen: set[int] = set()
        while not done.wait(0.5):
            for p, ni in descendants(system.root_pid):
                if ni == 10 and p not in seen:
                    subprocess.run(["ionice", "-c3", "-p", str(p)], check=False)
                    seen.add(p)

    if idle_io:
        threading.Thread(target=to_idle_class, daemon=True).start()
    try:
        bench.create_topic(system.bootstrap, "w", 1)
        bench.producer_perf(system.bootstrap, "w", 600_000, "none")
        bench.create_topic(system.bootstrap, "e", 1)
        r = bench.end_to_end(system.bootstrap, "e", 1000, seconds)
        return {k: round(v, 1) for k, v in r.items() if k.endswith(("p50_ms", "p99_ms"))}
    finally:
        done.set()
        system.stop()


for spec in sys.argv[1:]:
    print(spec or "default", one(spec, 50), flush=True)
