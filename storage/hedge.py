"""Hedged uploads: a PUT that takes longer than most is sent a second time.

An object store's latency is a property of each request, not of the object: S3's
guidance for latency-sensitive applications is to send a request again once it takes
longer than its usual latency, and to take whichever answer comes first (AWS, "Timeouts
and retries for latency-sensitive applications", in the whitepaper "Best Practices Design
Patterns: Optimizing Amazon S3 Performance"). A produce waits for its flush's PUT, and a
connection's answers go out in request order, so one slow PUT holds back every produce
answered behind it: the tail of the PUTs becomes the tail of the produces.

`HedgedPuts.put` writes an object (if absent) and, if the write has not returned after
the `percentile`-th percentile of the recent PUT times of this agent, writes it again
in a second request. Both are conditional writes of the same key and bytes: one lands
and the other is refused (ObjectExistsError), so the first success answers. A refusal
while the other request is still out only means the other landed first, or that the
key holds someone else's object (a journal number claimed by the sweep): the other
request's answer tells which. With percentile P, at most about (100 - P)% of the PUTs are
sent twice; the object-store cost grows by that much at most.

No hedging until `min_samples` PUT times are known, and none below `floor_s`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from storage.objectstore import ObjectExistsError

HEDGE_THREADS = 8  # second requests under way at once, each in a thread of its own

if TYPE_CHECKING:
    from storage.objectstore import ObjectStore


@dataclass(slots=True)
class HedgeStats:
    puts: int = 0
    hedged: int = 0  # PUTs sent a second time
    hedge_won: int = 0  # ... whose second request answered first
    threshold_us: int = 0  # the wait before a second request, as last computed


class HedgedPuts:
    def __init__(
        self,
        store: ObjectStore,
        *,
        percentile: float,
        hedge_threads: int = HEDGE_THREADS,
        window: int = 512,
        min_samples: int = 64,
        floor_s: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < percentile < 100:
            raise ValueError(f"the hedging percentile must be in (0, 100), not {percentile}")
        self._store = store
        # The second requests have their own threads: a flush's hedge must not wait
        # behind other flushes' first requests.
        self._hedge_limiter = anyio.CapacityLimiter(hedge_threads)
        self._percentile = percentile
        self._min_samples = min_samples
        self._floor_s = floor_s
        self._clock = clock
        self._times: deque[float] = deque(maxlen=window)  # every request's, hedges too
        self._lock = threading.Lock()
        self._threshold: float | None = None
        self._since_threshold = 0
        self.stats = HedgeStats()

    def threshold(self) -> float | None:
        """Seconds before a second request; None: not yet known (no hedging)."""
        with self._lock:
            if len(self._times) < self._min_samples:
                return None
            if self._threshold is None or self._since_threshold >= 32:
                ordered = sorted(self._times)
                index = min(len(ordered) - 1, int(len(ordered) * self._percentile / 100))
                self._threshold = max(self._floor_s, ordered[index])
                self._since_threshold = 0
                self.stats.threshold_us = round(self._threshold * 1_000_000)
            return self._threshold

    def _timed_put(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """One conditional PUT, in a worker thread; its time is kept even when nobody
        waits for its answer any more."""
        began = self._clock()
        try:
            self._store.put_parts_sync(key, parts, if_absent=True)
        finally:
            with self._lock:
                self._times.append(self._clock() - began)
                self._since_threshold += 1

    async def put(
        self, key: str, parts: Sequence[bytes | memoryview], limiter: anyio.CapacityLimiter
    ) -> None:
        """Write the parts' bytes, in order, under `key` if absent, hedged; the first
        request in a thread of `limiter`. Raises as the store does (an ObjectExistsError only if neither
        request wrote it)."""
        self.stats.puts += 1
        threshold = self.threshold()
        outcomes: list[tuple[int, Exception | None]] = []  # (request, its failure)
        arrived = anyio.Event()

        async def request(number: int, limiter: anyio.CapacityLimiter) -> None:
            try:
                await anyio.to_thread.run_sync(
                    partial(self._timed_put, key, parts), limiter=limiter, abandon_on_cancel=True
                )
            except Exception as exc:
                outcomes.append((number, exc))
            else:
                outcomes.append((number, None))
            arrived.set()

        requests = 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(request, 0, limiter)
            if threshold is not None:
                with anyio.move_on_after(threshold):
                    await arrived.wait()
                if not outcomes:
                    requests = 2
                    self.stats.hedged += 1
                    tg.start_soon(request, 1, self._hedge_limiter)
            while not any(failure is None for _, failure in outcomes) and len(outcomes) < requests:
                await arrived.wait()
                arrived = anyio.Event()
            tg.cancel_scope.cancel()  # the other request's answer is not needed
        for number, failure in outcomes:
            if failure is None:
                if number == 1:
                    self.stats.hedge_won += 1
                return
        # Every request failed. A refusal means the key holds another object only if no
        # request failed otherwise: a store error is then the answer to give.
        failures = [failure for _, failure in outcomes if failure is not None]
        for failure in failures:
            if not isinstance(failure, ObjectExistsError):
                raise failure
        raise failures[0]
