"""What one hand-off of a call to a worker thread and back costs the process.

    .venv/bin/python integration/bench/thread_handoff.py [--calls 20000] [--rounds 3]

An upload or a metadata commit of the agent runs in a worker thread: the event loop
hands the call over and is woken with its result. This times a no-op so handed over, in
wall time and in the process's CPU time (both threads), three ways, on uvloop:

- `anyio`: `anyio.to_thread.run_sync` with a CapacityLimiter, as the agent does;
- `executor`: `loop.run_in_executor` on a ThreadPoolExecutor;
- `queue`: one thread taking calls from a `queue.SimpleQueue` and answering through
  `loop.call_soon_threadsafe`;
- `pool`: `storage.threads.ThreadPool`, which the agent's flushes, metadata
  transactions and store reads now go through (the `queue` way, with a pool's bounds
  and a cancelled caller waiting for its call).

Prints one JSON line per round and way: microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import queue
import resource
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from storage.threads import ThreadPool


def noop() -> int:
    return 1


class QueueWorker:
    """One thread that runs the calls put on its queue and answers on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._calls: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[[], Any]]]
        self._calls = queue.SimpleQueue()
        self._loop = loop
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            future, call = self._calls.get()
            self._loop.call_soon_threadsafe(future.set_result, call())

    def submit(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        future = self._loop.create_future()
        self._calls.put((future, call))
        return future


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
    worker = QueueWorker(loop)
    pool = ThreadPool(4, "hand-off")
    ways: dict[str, Callable[[], Awaitable[Any]]] = {
        "anyio": lambda: anyio.to_thread.run_sync(noop, limiter=limiter),
        "executor": lambda: loop.run_in_executor(executor, noop),
        "queue": lambda: worker.submit(noop),
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
