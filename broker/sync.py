"""Small synchronisation values shared by the broker's tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class Promise(Generic[T]):
    """A value that one task sets once and any number of tasks await."""

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Watch:
    """What one waiter watches: `wait` returns once any of its keys was notified since
    the last `arm`. Arm before reading what the keys guard, wait after: a notification
    that comes in between is not lost."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def arm(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


class Notifier:
    """Wakes waiters on keys (here: partitions) when something about them changed."""

    def __init__(self) -> None:
        self._waiters: dict[object, set[Watch]] = {}

    def notify(self, key: object) -> None:
        for watch in self._waiters.get(key, ()):
            watch.fire()

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


class Turnstile:
    """Lets tasks through one at a time in the order their tickets were taken.

    A connection takes a ticket for each Produce request as its frame arrives; the
    handler holds its turn until its batches are queued for a flush, so a producer's
    pipelined requests reach the log in the order it sent them (as in Kafka, where a
    connection's requests are handled one after another).
    """

    def __init__(self) -> None:
        self._next_ticket = 0
        self._serving = 0
        self._changed = anyio.Event()

    def take(self) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        return ticket

    @asynccontextmanager
    async def turn(self, ticket: int) -> AsyncIterator[None]:
        while self._serving != ticket:
            await self._changed.wait()
        try:
            yield
        finally:
            self._serving += 1
            changed, self._changed = self._changed, anyio.Event()
            changed.set()
