"""Reading byte ranges of ingest files: a cache of recent files and coalesced GETs.

Rules:
- ObjectCache keeps whole objects this agent just wrote or read ahead, least recently
  used first out, bounded by bytes. Objects are immutable and their keys never used
  again, so an entry never goes stale; one deleted from the store (garbage collection
  discards it here too) still holds the bytes a reader with an older index lookup wants.
- RangeReader serves a range from the cache when the object is there; otherwise it
  merges the ranges of one object that lie within `max_gap` of each other into a
  single ranged GET (a GET costs more than the gap bytes) and fetches different
  objects concurrently.
- Both belong to one event loop; they are not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import anyio

from storage.objectstore import ObjectStore, ObjectStoreError

DEFAULT_MAX_GAP = 1024 * 1024


class ObjectCache:
    """An LRU map key -> whole object, holding at most max_bytes of data."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "evictions": 0, "bytes": 0}

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    @property
    def total_bytes(self) -> int:
        """Bytes held now."""
        return self.stats["bytes"]

    def put(self, key: str, data: bytes) -> None:
        self.discard(key)
        if len(data) > self.max_bytes:
            return  # would evict everything and still not fit
        self._objects[key] = data
        self.stats["bytes"] += len(data)
        while self.stats["bytes"] > self.max_bytes:
            _old_key, old = self._objects.popitem(last=False)
            self.stats["bytes"] -= len(old)
            self.stats["evictions"] += 1

    def get(self, key: str) -> bytes | None:
        data = self._objects.get(key)
        if data is None:
            self.stats["misses"] += 1
            return None
        self._objects.move_to_end(key)
        self.stats["hits"] += 1
        return data

    def slice(self, key: str, start: int, end: int | None = None) -> memoryview | None:
        """Bytes [start, end) of a cached object without copying, or None if not cached."""
        data = self.get(key)
        if data is None:
            return None
        return memoryview(data)[start:end]

    def discard(self, key: str) -> None:
        old = self._objects.pop(key, None)
        if old is not None:
            self.stats["bytes"] -= len(old)


class RangeReader:
    """Reads byte ranges of objects: from the cache if possible, else coalesced GETs."""

    def __init__(
        self,
        store: ObjectStore,
        cache: ObjectCache | None = None,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
    ) -> None:
        self.store = store
        self.cache = cache
        self.max_gap = max_gap
        self.stats: dict[str, int] = {"gets": 0, "bytes_got": 0, "cache_reads": 0}

    @property
    def gets(self) -> int:
        return self.stats["gets"]

    async def read(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (a copy of its own)."""
        return bytes((await self.read_many([(key, start, end)]))[0])

    async def read_many(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes | memoryview]:
        """Bytes [start, end) for each (key, start, end), in the order asked.

        A range found in the cache comes back as a read-only view of the cached object,
        without a copy (the object stays alive as long as the view does)."""
        results: list[bytes | memoryview] = [b""] * len(requests)
        pending: dict[str, list[int]] = {}  # key -> indexes of requests not in the cache
        for index, (key, start, end) in enumerate(requests):
            if start < 0 or end < start:
                raise ValueError(f"bad range [{start}, {end}) of {key!r}")
            cached = self.cache.get(key) if self.cache is not None else None
            if cached is not None:
                results[index] = memoryview(cached)[start:end]
                self.stats["cache_reads"] += 1
            elif end > start:
                pending.setdefault(key, []).append(index)
        spans = [
            span for key, indexes in pending.items() for span in self._spans(key, indexes, requests)
        ]
        if len(spans) == 1:
            await self._fetch(spans[0], requests, results)
            return results

        errors: list[ObjectStoreError] = []

        async def fetch(span: _Span) -> None:
            try:
                await self._fetch(span, requests, results)
            except ObjectStoreError as exc:
                # Raise the store's error itself, not an ExceptionGroup, and stop the rest.
                errors.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for span in spans:
                tg.start_soon(fetch, span)
        if errors:
            raise errors[0]
        return results

    def _spans(
        self, key: str, indexes: list[int], requests: Sequence[tuple[str, int, int]]
    ) -> list[_Span]:
        """Group one object's requests into spans whose gaps are below max_gap."""
        indexes.sort(key=lambda i: requests[i][1])
        spans: list[_Span] = []
        for index in indexes:
            _key, start, end = requests[index]
            if spans and start - spans[-1].end < self.max_gap:
                last = spans[-1]
                last.end = max(last.end, end)
                last.indexes.append(index)
            else:
                spans.append(_Span(key, start, end, [index]))
        return spans

    async def _fetch(
        self,
        span: _Span,
        requests: Sequence[tuple[str, int, int]],
        results: list[bytes | memoryview],
    ) -> None:
        self.stats["gets"] += 1
        data = await self.store.get(span.key, span.start, span.end)
        self.stats["bytes_got"] += len(data)
        if len(span.indexes) == 1:
            results[span.indexes[0]] = data
            return
        view = memoryview(data)
        for index in span.indexes:
            _key, start, end = requests[index]
            results[index] = bytes(view[start - span.start : end - span.start])


class _Span:
    """One GET: [start, end) of key, covering the requests at `indexes`."""

    __slots__ = ("key", "start", "end", "indexes")

    def __init__(self, key: str, start: int, end: int, indexes: list[int]) -> None:
        self.key = key
        self.start = start
        self.end = end
        self.indexes = indexes
