"""Object-store requests and bytes attributed to topics: what each topic costs.

The code that calls the store on a topic's behalf says so around the calls:

    with charge(lambda: {"orders": 3_000, "clicks": 1_000}):   # bytes of each topic
        await store.put(key, data)

and `AccountingStore`, the agent's store when metrics are served (`--metrics-port`),
splits each request and its bytes among the topics in proportion to their weights:
that PUT counts 0.75 to "orders" and 0.25 to "clicks". A request made outside any
`charge` (compaction, garbage collection, the sweeps, snapshots, readiness checks)
counts to UNATTRIBUTED, so that the counts of all topics and UNATTRIBUTED add up to
the store's own. The weights travel with the context: into worker threads (anyio
copies it) and into the reads of an open range stream, charged to the topics of the
read that opened it.

Who charges what: a flush's PUT goes to the topics of its batches by their bytes
(broker.ingest); a Fetch's GETs to the topics it read, by the bytes asked of each
(broker.handlers.fetch); a read-ahead stretch to its partition's topic
(broker.readahead).
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from storage.objectstore import DELETE_BATCH_MAX

if TYPE_CHECKING:
    from storage.objectstore import ObjectInfo, ObjectStore, RangeStream

UNATTRIBUTED = "(unattributed)"

Weights = Mapping[str, float]
_charged: ContextVar[Callable[[], Weights] | None] = ContextVar("charged_to", default=None)


@contextlib.contextmanager
def charge(weights: Callable[[], Weights]) -> Iterator[None]:
    """Store calls within the block are charged to the topics `weights()` gives, by
    weight. It is called only by an AccountingStore, at a call: without one (no
    --metrics-port) charging costs the hot paths a context variable and nothing more."""
    token = _charged.set(weights)
    try:
        yield
    finally:
        _charged.reset(token)


def _charged_now() -> Weights | None:
    weights = _charged.get()
    return None if weights is None else weights()


class Ledger:
    """Requests (by kind: PUT, GET, LIST, DELETE) and bytes (in: written, out: read) of
    the object store, per topic; fractional where a request is shared."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.bytes: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._lock = threading.Lock()  # worker threads record too

    def record(
        self, weights: Mapping[str, float] | None, kind: str | None, size: int, direction: str
    ) -> None:
        """One request of `kind` (None: none, only bytes) moving `size` bytes."""
        total = sum(weights.values()) if weights else 0
        with self._lock:
            if not weights or total <= 0:
                if kind is not None:
                    self.requests[UNATTRIBUTED, kind] += 1
                if size:
                    self.bytes[UNATTRIBUTED, direction] += size
                return
            for topic, weight in weights.items():
                share = weight / total
                if kind is not None:
                    self.requests[topic, kind] += share
                if size:
                    self.bytes[topic, direction] += size * share

    def add(
        self, requests: Mapping[tuple[str, str], float], sizes: Mapping[tuple[str, str], float]
    ) -> None:
        """Another ledger's counts (of a worker process, `copy()`) added to these."""
        with self._lock:
            for key, value in requests.items():
                self.requests[key] += value
            for key, value in sizes.items():
                self.bytes[key] += value

    def copy(self) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        with self._lock:
            return dict(self.requests), dict(self.bytes)


class AccountingStore:
    """An ObjectStore that records each call in a Ledger under the topics charged (see
    the module), and otherwise is the store it wraps."""

    def __init__(self, inner: ObjectStore, ledger: Ledger) -> None:
        self.inner = inner
        self.ledger = ledger

    def __getattr__(self, name: str) -> Any:  # stats, conditional_writes, ...
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"AccountingStore({self.inner!r})"

    def _record(self, kind: str, size: int = 0, direction: str = "in") -> None:
        self.ledger.record(_charged_now(), kind, size, direction)

    def new_key(self, prefix: str, size: int) -> str:
        return self.inner.new_key(prefix, size)

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self._record("PUT", len(data), "in")
        await self.inner.put(key, data, if_absent=if_absent)

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self._record("PUT", len(data), "in")
        self.inner.put_sync(key, data, if_absent=if_absent)

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        self._record("PUT", sum(len(part) for part in parts), "in")
        self.inner.put_parts_sync(key, parts, if_absent=if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await self.inner.get(key, start, end)
        self._record("GET", len(data), "out")
        return data

    def get_sync(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = self.inner.get_sync(key, start, end)
        self._record("GET", len(data), "out")
        return data

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        data = await self.inner.get_view(key, start, end)
        self._record("GET", len(data), "out")
        return data

    def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        data = self.inner.get_view_sync(key, start, end)
        self._record("GET", len(data), "out")
        return data

    def open_range_stream(self, key: str, start: int, end: int | None = None) -> RangeStream:
        weights = _charged_now()
        self.ledger.record(weights, "GET", 0, "out")
        stream = self.inner.open_range_stream(key, start, end)  # type: ignore[attr-defined]
        return _ChargedStream(stream, self.ledger, weights)

    async def delete(self, key: str) -> None:
        self._record("DELETE")
        await self.inner.delete(key)

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        for _ in range(0, len(keys), DELETE_BATCH_MAX):  # S3: one DeleteObjects each
            self._record("DELETE")
        return await self.inner.delete_many(keys)

    async def list(self, prefix: str = "", *, start_after: str = "") -> builtins.list[ObjectInfo]:
        self._record("LIST")
        return await self.inner.list(prefix, start_after=start_after)

    async def list_folders(self, prefix: str) -> builtins.list[str]:
        self._record("LIST")
        return await self.inner.list_folders(prefix)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _ChargedStream:
    """A range stream whose bytes are charged to the topics its opening was."""

    def __init__(
        self, stream: RangeStream, ledger: Ledger, weights: Mapping[str, float] | None
    ) -> None:
        self._stream = stream
        self._ledger = ledger
        self._weights = weights

    def read(self, n: int) -> bytes | memoryview:
        data = self._stream.read(n)
        if data:
            self._ledger.record(self._weights, None, len(data), "out")
        return data

    def close(self) -> None:
        self._stream.close()
