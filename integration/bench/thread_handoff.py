"""What one hand-off of a call to a worker thread and back costs the process.

    .venv/bin/python integration/bench/thread_handoff.py [--calls 20000] [--rounds 3]

An upload or a metadata commit of the agent runs in a worker thread: the event loop
hands the call over and is woken with its result. This times a no-op so handed over, in
wall time and in the process's CPU time (both threads), three ways, on uvloop:

- `anyio`: `anyio.to_thread.run_sync` with a CapacityLimiter, as the agent did;
- `executor`: `loop.run_in_executor` on a ThreadPoolExecutor;
- `pool`: `storage.threads.ThreadPool` (threads taking calls from a
  `queue.SimpleQueue` and answering through `loop.call_soon_threadsafe`), which the
  agent's flushes, metadata transactions and store reads go through.

(`results/2026-11-29-thread-handoff.jsonl` has a fourth way, `queue`: one bare thread
on a SimpleQueue, before the pool was written.)

Prints one JSON line per round and way: microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from storage.threads import ThreadPool


def noop() -> int:
    return 1


async def timed(call: Callable[[], Awaitable[Any]], calls: int) -> dict[str, float]:
    for _ in range(200):  # threads started, code warm
        await call()
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    for _ in range(calls):
        await call()
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {
        "wall_us": round(wall / calls * 1e6, 1),
        "cpu_us": round((user + system) / calls * 1e6, 1),
        "user_us": round(user / calls * 1e6, 1),
    }


async def round_of(calls: int, number: int) -> None:
    loop = asyncio.get_running_loop()
    limiter = anyio.CapacityLimiter(4)
    executor = concurrent.futures.ThreadPoolExecutor(4)
    pool = ThreadPool(4, "hand-off")
    ways: dict[str, Callable[[], Awaitable[Any]]] = {
        "anyio": lambda: anyio.to_thread.run_sync(noop, limiter=limiter),
        "executor": lambda: loop.run_in_executor(executor, noop),
        "pool": lambda: pool.run(noop),
    }
    for way, call in ways.items():
        print(json.dumps({"round": number, "way": way, **await timed(call, calls)}), flush=True)
    executor.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for number in range(1, args.rounds + 1):
        anyio.run(round_of, args.calls, number, backend_options={"use_uvloop": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
