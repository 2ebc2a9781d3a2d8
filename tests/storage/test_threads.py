"""ThreadPool: calls handed to worker threads and their results handed back."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import weakref

import anyio
import pytest

from storage import threads
from storage.threads import ThreadPool


async def test_result_and_exception_come_back_from_another_thread() -> None:
    pool = ThreadPool(2, "test")
    caller = threading.get_ident()
    ran_in = await pool.run(threading.get_ident)
    assert ran_in != caller
    assert await pool.run(divmod, 17, 5) == (3, 2)

    def fails() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        await pool.run(fails)


async def test_the_call_sees_the_callers_context() -> None:
    pool = ThreadPool(1, "test")
    charged: contextvars.ContextVar[str] = contextvars.ContextVar("charged", default="nobody")
    token = charged.set("orders")
    try:
        assert await pool.run(charged.get) == "orders"
    finally:
        charged.reset(token)
    assert await pool.run(charged.get) == "nobody"


async def test_an_idle_thread_does_not_hold_the_last_result() -> None:
    """Once the caller drops a result, nothing of the pool keeps it alive while the
    thread waits for its next call (a large read, a view holding a file open)."""
    pool = ThreadPool(1, "test")

    class Result:
        pass

    result = await pool.run(Result)
    gone = threading.Event()
    weakref.finalize(result, gone.set)
    del result
    assert await anyio.to_thread.run_sync(gone.wait, 1.0)
    assert pool._threads == 1  # the thread is still there, idle


async def test_at_most_size_calls_run_at_once() -> None:
    pool = ThreadPool(3, "at most")
    lock = threading.Lock()
    running = [0]
    most = [0]

    def busy() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(pool.run, busy)
    assert most[0] == 3
    # A thread is started only when every one there is works: 10 calls, 3 threads.
    assert len([t for t in threading.enumerate() if t.name == "at most worker"]) == 3


async def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    pool = ThreadPool(1, "test")
    started = threading.Event()
    ended = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        ended.set()
        return "done"

    with anyio.move_on_after(0.05) as scope:
        await pool.run(slow)
    assert scope.cancelled_caught
    assert started.is_set()
    assert ended.is_set()  # the cancellation waited for the thread


async def test_a_cancelled_task_is_cancelled_once_its_call_ends() -> None:
    pool = ThreadPool(1, "test")
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    task = asyncio.ensure_future(pool.run(slow))
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the thread
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()


async def test_idle_threads_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "IDLE_SECONDS", 0.05)
    pool = ThreadPool(4, "idle test")
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(pool.run, time.sleep, 0.05)

    workers = [t for t in threading.enumerate() if t.name == "idle test worker"]
    assert len(workers) == 4
    for worker in workers:  # the loop has nothing else to do: block it
        worker.join(5)
    assert not any(worker.is_alive() for worker in workers)
    assert await pool.run(sum, [1, 2]) == 3  # a new thread for a new call


def test_one_pool_serves_one_loop_after_another() -> None:
    pool = ThreadPool(1, "test")

    async def two() -> int:
        return await pool.run(int, "2")

    assert anyio.run(two) == 2
    assert anyio.run(two) == 2
    assert anyio.run(two, backend_options={"use_uvloop": True}) == 2
