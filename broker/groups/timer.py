"""Keyed deadlines for the group coordinator (Kafka's coordinator timer, without threads).

`schedule(key, deadline, callback)` replaces whatever was scheduled under `key`;
`cancel(key)` forgets it. The coordinator's timer loop pops the callbacks that are due
and runs them. Replaced and cancelled entries stay in the heap until they reach its top
and are then dropped, so rescheduling a heartbeat deadline costs one heap push.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable, Hashable

Callback = Callable[[], Awaitable[None]]


class Timer:
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, int, Callback]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int, callback: Callback) -> None:
        seq = next(self._seq)
        self._entries[key] = (deadline_ms, seq, callback)
        heapq.heappush(self._heap, (deadline_ms, seq, key))

    def cancel(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def cancel_matching(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._entries if predicate(k)]:
            del self._entries[key]

    def deadline(self, key: Hashable) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def _drop_stale_top(self) -> None:
        while self._heap:
            deadline, seq, key = self._heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry[1] == seq:
                return
            heapq.heappop(self._heap)

    def next_deadline(self) -> int | None:
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[Callback]:
        due: list[Callback] = []
        while True:
            self._drop_stale_top()
            if not self._heap or self._heap[0][0] > now_ms:
                return due
            _deadline, _seq, key = heapq.heappop(self._heap)
            due.append(self._entries.pop(key)[2])

    def __len__(self) -> int:
        return len(self._entries)
