"""Small synchronisation values shared by the broker's tasks."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Flag:
    """A flag set once, awaited by any number of tasks: the event under the values below.

    Made for the request path, where several are made per request: making one costs no
    event-loop lookup (anyio's and asyncio's events ask for the running loop when made or
    awaited, which Python 3.11 pays with a getpid() system call), awaiting one that is set
    returns at once, and a waiter's future is made only when it has to wait. A waiter
    cancelled by its cancel scope leaves nothing behind. Set only from the event loop's
    thread.
    """

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for future in waiters or ():
            if not future.done():
                future.set_result(None)

    async def wait(self) -> None:
        if self._set:
            return
        future = self._waiter(asyncio.get_running_loop())
        try:
            await future
        finally:
            self._forget(future)

    async def wait_until(self, deadline: float) -> bool:
        """Wait until set or until time.monotonic() reaches deadline; whether it is set.
        (A timer on the loop, not a cancel scope: this is on the produce path.)"""
        if self._set:
            return True
        delay = deadline - time.monotonic()
        if delay <= 0:
            return False
        loop = asyncio.get_running_loop()
        future = self._waiter(loop)
        timer = loop.call_later(delay, _expire, future)
        try:
            await future
        finally:
            timer.cancel()
            self._forget(future)
        return self._set

    def _waiter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        future: asyncio.Future[None] = loop.create_future()
        if self._waiters is None:
            self._waiters = [future]
        else:
            self._waiters.append(future)
        return future

    def _forget(self, future: asyncio.Future[None]) -> None:
        """A waiter that stopped waiting before the flag was set takes its future back."""
        if not self._set and self._waiters is not None:
            self._waiters.remove(future)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Channel(Generic[T]):
    """A bounded first-in, first-out queue from one task to another, closed by the task
    that puts.

    What a connection's reader hands its writer for every request: anyio's memory object
    streams cost a checkpoint (a turn of the event loop), an event and a lookup of the
    current task per item, on each side. Here, putting while there is room and taking
    while there are items never yield; a taker that has to wait (or a putter, while
    `size` items wait) waits on one future, which the other side completes. A task
    cancelled while it waits leaves nothing behind. One task puts, one task takes.
    """

    __slots__ = ("_items", "_size", "_closed", "_taker", "_putter")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a channel holds one item at least")
        self._items: deque[T] = deque()
        self._size = size
        self._closed = False
        self._taker: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> None:
        """Add item at the end, once fewer than `size` items wait."""
        if self._closed:
            raise RuntimeError("put into a closed channel")
        while len(self._items) >= self._size:
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None
        if self._closed:
            raise RuntimeError("put into a closed channel")
        self._items.append(item)
        _expire_if_waiting(self._taker)

    def take_nowait(self) -> T | None:
        """The first item, or None when none waits."""
        if not self._items:
            return None
        item = self._items.popleft()
        _expire_if_waiting(self._putter)
        return item

    async def take(self) -> T | None:
        """The first item, once there is one; None once the channel is closed and every
        item put was taken."""
        while not self._items:
            if self._closed:
                return None
            self._taker = asyncio.get_running_loop().create_future()
            try:
                await self._taker
            finally:
                self._taker = None
        return self.take_nowait()

    def close(self) -> None:
        """Nothing more is put: the taker gets None once it took what is there."""
        self._closed = True
        _expire_if_waiting(self._taker)


def _expire_if_waiting(future: asyncio.Future[None] | None) -> None:
    if future is not None:
        _expire(future)


class Promise(Generic[T]):
    """A value that one task sets once and any number of tasks await."""

    __slots__ = ("_flag", "_value", "_error")

    def __init__(self) -> None:
        self._flag = Flag()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        self._value = value
        self._flag.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._flag.set()

    def done(self) -> bool:
        return self._flag.is_set()

    def failed(self) -> bool:
        return self._error is not None

    def value(self) -> T:
        """The value of a promise that is done and did not fail."""
        assert self.done() and not self.failed()
        return self._value  # type: ignore[return-value]

    async def wait(self) -> T:
        await self._flag.wait()
        return self._result()

    async def wait_until(self, deadline: float) -> bool:
        """Wait until done or until time.monotonic() reaches deadline; whether done."""
        return await self._flag.wait_until(deadline)

    def _result(self) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Watch:
    """What one waiter watches: `wait` returns once any of its keys was notified since
    the last `arm`. Arm before reading what the keys guard, wait after: a notification
    that comes in between is not lost."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = Flag()

    def arm(self) -> None:
        if self._event.is_set():
            self._event = Flag()

    @property
    def fired(self) -> bool:
        """Whether a key was notified since the last `arm`."""
        return self._event.is_set()

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    async def wait_until(self, deadline: float) -> bool:
        """Wait until notified or until time.monotonic() reaches deadline; whether
        notified."""
        return await self._event.wait_until(deadline)


MAX_NOTES = 1_000_000  # a Notifier's notes, about 200 bytes each


class Notifier:
    """Wakes waiters on keys (here: partitions) when something about them changed.

    It also keeps a note per key of what a reader last found, until the key is next
    notified: while a key keeps its note, nothing about it changed that this notifier was
    told of (broker.handlers.fetch: a Fetch at the end of a partition that has not moved
    waits before it reads)."""

    def __init__(self) -> None:
        self._waiters: dict[object, set[Watch]] = {}
        self._notes: dict[object, object] = {}

    def notify(self, key: object) -> None:
        self._notes.pop(key, None)
        for watch in self._waiters.get(key, ()):
            watch.fire()

    def note(self, key: object, found: object) -> None:
        """Keep what was found about key (read after a watch of it was armed, with no
        notification since): until key is notified."""
        if len(self._notes) >= MAX_NOTES and key not in self._notes:
            self._notes.clear()  # keys of partitions long gone: start again
        self._notes[key] = found

    def noted(self, key: object) -> object | None:
        """What was last noted about key, if it was not notified since; else None."""
        return self._notes.get(key)

    def has_waiters(self) -> bool:
        return bool(self._waiters)

    def waited_keys(self) -> list[object]:
        return list(self._waiters)

    @contextmanager
    def watch(self, keys: Iterable[object]) -> Iterator[Watch]:
        """Watch keys for the life of the block (callers bound their waits with deadlines)."""
        watch = Watch()
        watched = list(keys)
        for key in watched:
            self._waiters.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            for key in watched:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(watch)
                    if not waiters:
                        del self._waiters[key]


class Turn:
    """One request's turn on its connection: the next request starts once it ends.

    A request holds its turn while it takes effect, so that a connection's requests take
    effect in the order they were sent (as in Kafka, whose socket server handles one
    request of a connection at a time). A request that then waits (a Produce for its
    flush, a Fetch for data) ends its turn early; one that never does ends it when its
    answer is ready.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = Flag()

    @classmethod
    def ended_already(cls) -> Turn:
        turn = cls()
        turn.end()
        return turn

    @property
    def ended(self) -> bool:
        return self._event.is_set()

    def end(self) -> None:
        self._event.set()

    async def wait_ended(self) -> None:
        if not self._event.is_set():
            await self._event.wait()
