"""Small synchronisation values shared by the broker's tasks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
        self._event = anyio.Event()

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
