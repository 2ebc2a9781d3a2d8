"""Injected object-store latency, for benchmarks and tests: a store that wraps another and
makes each PUT (and, if asked, each GET) wait first.

`bucketlog serve --inject-put-latency-ms MEDIAN,P99` (and `--inject-get-latency-ms`)
puts this wrapper around the configured store; without them there is no wrapper at all.
The delays come from a function the caller gives (seconds per call; the broker gives
metadata.injected_kv.Lognormal, fitted to the median and p99), drawn once per call:

* `put`/`get` wait with anyio.sleep, so the event loop goes on meanwhile;
  `put_sync`/`get_sync` with time.sleep, in the worker thread that calls them.
* The delay comes before the wrapped call, so that an object is not visible (nor its
  put answered) before its delay has passed, as with a slow upload.
* `delete` and `list` are not delayed.

Counters (`injected_stats`, "store_injected" in the agent's stats file; `stats` stays the
wrapped store's): the delays drawn and their sum, and the whole time of every PUT (delay
and wrapped call), summed and in a histogram, so that a benchmark can tell the latency
the agent saw from the injected part.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from storage.objectstore import ObjectInfo, ObjectStore, RangeStream

Delay = Callable[[], float]  # seconds


def put_ms_bucket(ms: float) -> str:
    """The histogram bucket of a duration: its upper bound in ms, 1 ms wide below 100 ms,
    5 ms below 500 ms, 50 ms below 5 s; "inf" beyond."""
    for limit, width in ((100, 1), (500, 5), (5000, 50)):
        if ms <= limit:
            return str(max(width, math.ceil(ms / width) * width))
    return "inf"


class InjectedLatencyStore:
    """An `ObjectStore` that runs every call on `inner`, after an injected delay for puts
    (`put_delay`) and gets (`get_delay`); None: that kind of call is not delayed."""

    def __init__(
        self, inner: ObjectStore, *, put_delay: Delay | None = None, get_delay: Delay | None = None
    ) -> None:
        self.inner = inner
        self._put_delay = put_delay
        self._get_delay = get_delay
        # The wrapped store's request counters, as they are (the store contract's).
        self.stats: dict[str, int] = getattr(inner, "stats", {})
        self._counters = {
            "put_delays": 0,
            "put_delay_us": 0,
            "get_delays": 0,
            "get_delay_us": 0,
            "put_us": 0,  # the whole time of the puts, delays included
        }
        # The whole time of each put, counted by histogram bucket (put_ms_bucket).
        self._put_ms: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"InjectedLatencyStore({self.inner!r})"

    @property
    def injected_stats(self) -> dict[str, object]:
        """The counters, and `put_ms_le`: {upper bound in ms: puts that took at most that
        long and more than the bound below}; a copy."""
        return {**self._counters, "put_ms_le": dict(self._put_ms)}

    def _took(self, started: float) -> None:
        took = time.monotonic() - started
        self._counters["put_us"] += round(took * 1_000_000)
        bucket = put_ms_bucket(took * 1000)
        self._put_ms[bucket] = self._put_ms.get(bucket, 0) + 1

    def _draw(self, delay: Delay | None, kind: str) -> float:
        if delay is None:
            return 0.0
        seconds = max(0.0, delay())
        self._counters[f"{kind}_delays"] += 1
        self._counters[f"{kind}_delay_us"] += round(seconds * 1_000_000)
        return seconds

    def new_key(self, prefix: str, size: int) -> str:
        return self.inner.new_key(prefix, size)

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        started = time.monotonic()
        await anyio.sleep(self._draw(self._put_delay, "put"))
        try:
            await self.inner.put(key, data, if_absent=if_absent)
        finally:
            self._took(started)

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        started = time.monotonic()
        time.sleep(self._draw(self._put_delay, "put"))
        try:
            self.inner.put_sync(key, data, if_absent=if_absent)
        finally:
            self._took(started)

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        started = time.monotonic()
        time.sleep(self._draw(self._put_delay, "put"))
        try:
            self.inner.put_parts_sync(key, parts, if_absent=if_absent)
        finally:
            self._took(started)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if self._get_delay is not None:
            await anyio.sleep(self._draw(self._get_delay, "get"))
        return await self.inner.get(key, start, end)

    def get_sync(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if self._get_delay is not None:
            time.sleep(self._draw(self._get_delay, "get"))
        return self.inner.get_sync(key, start, end)

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        if self._get_delay is not None:
            await anyio.sleep(self._draw(self._get_delay, "get"))
        return await self.inner.get_view(key, start, end)

    def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        if self._get_delay is not None:
            time.sleep(self._draw(self._get_delay, "get"))
        return self.inner.get_view_sync(key, start, end)

    def open_range_stream(self, key: str, start: int, end: int | None = None) -> RangeStream:
        """The wrapped store's stream, opened after a GET's delay (blocking)."""
        if self._get_delay is not None:
            time.sleep(self._draw(self._get_delay, "get"))
        opener = self.inner.open_range_stream  # type: ignore[attr-defined]
        stream: RangeStream = opener(key, start, end)
        return stream

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        return await self.inner.delete_many(keys)

    # builtins.list: in this class body, `list` is the method.
    async def list(self, prefix: str = "", *, start_after: str = "") -> builtins.list[ObjectInfo]:
        return await self.inner.list(prefix, start_after=start_after)

    async def list_folders(self, prefix: str) -> builtins.list[str]:
        return await self.inner.list_folders(prefix)

    async def aclose(self) -> None:
        await self.inner.aclose()


if TYPE_CHECKING:

    def _check(inner: ObjectStore) -> ObjectStore:
        # mypy checks here that InjectedLatencyStore implements the ObjectStore protocol.
        return InjectedLatencyStore(inner)
