"""Worker threads for the blocking calls of the stores, handed over cheaply.

Rules:
- A `ThreadPool` runs at most `size` calls at once, in threads it starts when every
  thread it has is busy; a thread idle for IDLE_SECONDS ends.
- `await pool.run(fn, *args)` runs fn(*args) in one of them and returns its result or
  raises its exception. A caller cancelled meanwhile still waits for the call to end
  (as `anyio.to_thread.run_sync` does by default), then is cancelled: a transaction or
  a file write is never left running behind its caller's back.
- Any event loop may call it; the loop that called is the one woken with the result.
- The call runs in a copy of the caller's context (contextvars), as with anyio: what
  the caller set (broker.costs' charges) holds in the thread.

Why not `anyio.to_thread.run_sync`: each call of it enters and leaves a cancel scope and
a capacity limiter and looks up the loop's thread pool, and on Python 3.11 every one of
those asks for the running loop, a `getpid()` system call each time. A no-op handed over
costs 69.8-72.3 us of CPU that way against 39.5-49.6 through this pool
(integration/bench/thread_handoff.py). The flushes, commits and reads of the agent's hot
paths each make one or two such calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

IDLE_SECONDS = 10.0  # as anyio's worker threads


class _Call:
    __slots__ = ("fn", "args", "context", "loop", "waiter", "finished", "failed", "value")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.fn = fn
        self.args = args
        self.context = contextvars.copy_context()
        self.loop = loop
        self.waiter: asyncio.Future[None] = loop.create_future()
        self.finished = False
        self.failed = False
        self.value: Any = None


def _settle(call: _Call) -> None:
    """On the caller's loop: the call has ended."""
    call.finished = True
    if not call.waiter.done():
        call.waiter.set_result(None)


class ThreadPool:
    """Up to `size` threads running blocking calls for event loops (see the module)."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError("a thread pool needs at least one thread")
        self.size = size
        self.name = name
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # started and not ended
        self._pending = 0  # calls queued or running
        # The loop of the last caller, and its thread: the running loop of a thread is
        # the same for as long as it runs, which spares asking for it on every call.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def __repr__(self) -> str:
        return f"ThreadPool({self.name!r}, {self._threads}/{self.size} threads)"

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = self._loop
        if loop is None or self._loop_thread != threading.get_ident() or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        call = _Call(fn, args, loop)
        with self._lock:
            self._pending += 1
            start = self._threads < self.size and self._threads < self._pending
            if start:
                self._threads += 1
        if start:
            try:
                threading.Thread(target=self._work, name=f"{self.name} worker", daemon=True).start()
            except BaseException:
                with self._lock:
                    self._threads -= 1
                    self._pending -= 1
                raise
        self._calls.put(call)
        try:
            await call.waiter
        except asyncio.CancelledError:
            while not call.finished:  # the thread has it: wait for its end
                call.waiter = loop.create_future()
                try:
                    await call.waiter
                except asyncio.CancelledError:
                    pass
            raise
        if call.failed:
            exc = call.value
            call.value = None  # no cycle through the frame that raises it
            raise exc
        return call.value  # type: ignore[no-any-return]

    def _work(self) -> None:
        calls = self._calls
        while True:
            try:
                call = calls.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._pending < self._threads:  # the others can take what comes
                        self._threads -= 1
                        return
                continue
            try:
                call.value = call.context.run(call.fn, *call.args)
            except BaseException as exc:  # handed to the caller, raised there
                call.failed = True
                call.value = exc
            call.fn = call.args = call.context = None  # type: ignore[assignment]
            with self._lock:
                self._pending -= 1
            try:
                call.loop.call_soon_threadsafe(_settle, call)
            except RuntimeError:  # the caller's loop is closed: nobody waits
                pass
            # Not held while this thread waits for the next call: the value may be large
            # (a read), or a view that holds a file open (storage.local's mappings).
            del call
