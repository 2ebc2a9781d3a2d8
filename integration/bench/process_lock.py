"""How long a commit waits for another process's write transactions on one SQLite file.

One process (the other agent: `--agents 2`, or any second writer of the metadata file)
runs write transactions that hold SQLite's writer lock `--hold-ms` each, at Poisson
arrivals of `--rate` a second; this process commits a small transaction every
`--interval-ms` and times each. Two ways, interleaved in pairs: with the lock file of
`metadata.sqlite_kv` (the writers of both processes queue on it) and without it (the
lock file's calls made no-ops in both processes: a writer then waits for the other's
lock in SQLite's busy handler, as before the lock file).

    .venv/bin/python integration/bench/process_lock.py --pairs 3

Prints one line per run: the commits timed, their p50, p90, p99 and longest time in ms,
and how many waited for the other process (took over 2 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from metadata import sqlite_kv
from metadata.kv import Transaction
from metadata.sqlite_kv import SQLiteKV


@contextlib.contextmanager
def _lock_file_off() -> Iterator[None]:
    """The lock file's calls made no-ops in this process (SQLite's busy handler alone)
    until the block ends."""
    lock = sqlite_kv._ProcessLock
    saved = (lock._try, lock.release)
    lock._try = lambda self: True  # type: ignore[method-assign]
    lock.release = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        lock._try, lock.release = saved  # type: ignore[method-assign]


def _lock_file(on: bool) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if on else _lock_file_off()


def other(path: str, hold_ms: float, rate: float, seconds: float) -> None:
    """The other process: long write transactions at Poisson arrivals."""
    kv = SQLiteKV(path)

    def hold(tr: Transaction) -> None:
        tr.set(b"other", b"x")
        time.sleep(hold_ms / 1000)  # the writer lock held, the GIL not

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(random.expovariate(rate))
        kv.transact_sync(hold)
    kv.close()


def run(path: str, args: argparse.Namespace, lock_file: bool) -> str:
    command = [
        sys.executable,
        __file__,
        "--role=other",
        f"--path={path}",
        f"--hold-ms={args.hold_ms}",
        f"--rate={args.rate}",
        f"--seconds={args.seconds + 1}",
        *([] if lock_file else ["--no-lock-file"]),
    ]
    child = subprocess.Popen(command, env={**os.environ, "PYTHONSAFEPATH": "1"})
    kv = SQLiteKV(path)
    times = []
    try:
        time.sleep(0.5)  # the other process started
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            kv.transact_sync(lambda tr: tr.set(b"mine", b"y"))
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(args.interval_ms / 1000)
    finally:
        kv.close()
        child.wait(60)
    cuts = statistics.quantiles(times, n=100)
    waited = sum(t > 2 for t in times)
    return (
        f"{'lock file' if lock_file else 'busy handler'}: {len(times)} commits, "
        f"p50 {cuts[49]:.1f} p90 {cuts[89]:.1f} p99 {cuts[98]:.1f} max {max(times):.1f} ms, "
        f"{waited} over 2 ms (mean of those {statistics.fmean([t for t in times if t > 2] or [0]):.1f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-ms", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--role", default="main")
    parser.add_argument("--path")
    parser.add_argument("--no-lock-file", action="store_true")
    args = parser.parse_args()
    if args.role == "other":
        with _lock_file(not args.no_lock_file):
            other(args.path, args.hold_ms, args.rate, args.seconds)
        return 0
    print(
        f"hold {args.hold_ms:g} ms at {args.rate:g}/s in the other process; "
        f"a commit every {args.interval_ms:g} ms here, {args.seconds:g} s a run",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(args.pairs):
            order = [True, False] if pair % 2 == 0 else [False, True]
            for lock_file in order:
                path = str(Path(folder) / f"run-{pair}-{int(lock_file)}.db")
                with _lock_file(lock_file):
                    print(run(path, args, lock_file), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
