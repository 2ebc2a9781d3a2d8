"""Reading byte ranges of ingest files: a cache of recent files and coalesced GETs.

Rules:
- ObjectCache keeps whole objects this agent just wrote or read ahead, and ranges of
  large objects read ahead, least recently used first out, bounded by bytes. Objects are immutable and their keys never used
  again, so an entry never goes stale; one deleted from the store (garbage collection
  discards it here too) still holds the bytes a reader with an older index lookup wants.
- RangeReader serves a range from the cache when the object is there; otherwise it
  merges the ranges of one object that lie within `max_gap` of each other into a
  single ranged GET (a GET costs more than the gap bytes) and fetches different
  objects concurrently.
- An object this agent just wrote may be held as the pieces it was built from
  (`Pieces`: a flush's batches, views of the requests that brought them), joined only
  once a read spans pieces or wants it whole: a flush nobody reads costs no copy.
- RangeReader reads a range of an object the disk cache holds (storage.disk_cache: an
  object of many partitions that read-ahead read whole) from there, not with a GET.
- Both belong to one event loop; they are not thread-safe.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Protocol

import anyio

from storage.disk_cache import DiskCache
from storage.objectstore import ObjectStore, ObjectStoreError

DEFAULT_MAX_GAP = 1024 * 1024
# The longest a read waits for a GET under way that brings its bytes (RangeReader).
IN_FLIGHT_WAIT_S = 2.0


class Pieces:
    """An object as the pieces it is made of, in order, not joined."""

    __slots__ = ("parts", "ends", "size")

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self.parts = [part for part in parts if len(part)]
        self.ends = list(accumulate(len(part) for part in self.parts))
        self.size = self.ends[-1] if self.ends else 0

    def __len__(self) -> int:
        return self.size

    def view(self, start: int, end: int | None) -> memoryview | None:
        """Bytes [start, end) (end None: to the end) as memoryview(joined)[start:end]
        would give them, for 0 <= start, if they lie in one piece; else None."""
        stop = self.size if end is None else min(end, self.size)
        if start >= stop:
            return memoryview(b"")
        i = bisect_right(self.ends, start)
        if stop > self.ends[i]:
            return None
        begin = self.ends[i] - len(self.parts[i])
        return memoryview(self.parts[i])[start - begin : stop - begin]

    def joined(self) -> bytes:
        return b"".join(self.parts)


class ObjectCache:
    """An LRU map of whole objects and of byte ranges of objects, holding at most
    max_bytes of data.

    A range is what read-ahead brings of a large object: one partition's stretch of a
    level-2 object, where the object is too large to hold whole for every partition a
    consumer reads at once. A whole object replaces the ranges of it held before.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # key -> whole object, or (key, start) -> bytes [start, start + len) of it
        self._entries: OrderedDict[str | tuple[str, int], bytes | memoryview | Pieces] = (
            OrderedDict()
        )
        self._ranges: dict[str, dict[int, int]] = {}  # key -> {start: end} held
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "evictions": 0, "bytes": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether the whole object is held."""
        return isinstance(key, str) and key in self._entries

    @property
    def total_bytes(self) -> int:
        """Bytes held now."""
        return self.stats["bytes"]

    def whole_objects(self) -> list[str]:
        """The keys of the objects held whole, least recently used first."""
        return [key for key in self._entries if isinstance(key, str)]

    def put(self, key: str, data: bytes | memoryview | Pieces) -> None:
        self.discard(key)
        self._add(key, data)

    def put_range(self, key: str, start: int, data: bytes | memoryview) -> None:
        """Hold bytes [start, start + len(data)) of the object (unless it is held whole)."""
        if key in self._entries:
            return
        old = self._entries.pop((key, start), None)
        if old is not None:
            self.stats["bytes"] -= len(old)
        self._ranges.setdefault(key, {})[start] = start + len(data)
        self._add((key, start), data)

    def _add(self, entry: str | tuple[str, int], data: bytes | memoryview | Pieces) -> None:
        if len(data) > self.max_bytes:
            self._forget_range(entry)
            return  # would evict everything and still not fit
        self._entries[entry] = data
        self.stats["bytes"] += len(data)
        while self.stats["bytes"] > self.max_bytes:
            old_entry, old = self._entries.popitem(last=False)
            self._forget_range(old_entry)
            self.stats["bytes"] -= len(old)
            self.stats["evictions"] += 1

    def _forget_range(self, entry: str | tuple[str, int]) -> None:
        if isinstance(entry, tuple):
            key, start = entry
            held = self._ranges.get(key)
            if held is not None:
                held.pop(start, None)
                if not held:
                    del self._ranges[key]

    def get(self, key: str) -> bytes | memoryview | None:
        """The whole object, if held whole."""
        data = self._entries.get(key)
        if data is None:
            self.stats["misses"] += 1
            return None
        self._entries.move_to_end(key)
        self.stats["hits"] += 1
        if isinstance(data, Pieces):  # wanted whole: joined once, and held so
            data = self._entries[key] = data.joined()
        return data

    def slice(self, key: str, start: int, end: int | None = None) -> memoryview | None:
        """Bytes [start, end) of a held object or range without copying (but for the
        first range across an object's pieces), or None (end None: to the end of the
        object, or of the range holding start)."""
        data = self._entries.get(key)
        if data is not None:
            self._entries.move_to_end(key)
            self.stats["hits"] += 1
            if isinstance(data, Pieces):
                view = data.view(start, end)
                if view is not None:
                    return view
                # Across pieces: joined once, and held so (a consumer reads it all).
                data = self._entries[key] = data.joined()
            return memoryview(data)[start:end]
        found = self._range_start(key, start, end)
        if found is None:
            self.stats["misses"] += 1
            return None
        entry = (key, found)
        self._entries.move_to_end(entry)
        self.stats["hits"] += 1
        stop = None if end is None else end - found
        held = self._entries[entry]
        assert not isinstance(held, Pieces)  # a range is read ahead, never pieces
        return memoryview(held)[start - found : stop]

    def demote(self, key: str, start: int) -> None:
        """The range of the object held from `start` is not wanted again soon (its
        reader is past it): it goes first when room is wanted, unless read before that."""
        if (key, start) in self._entries:
            self._entries.move_to_end((key, start), last=False)

    def covers(self, key: str, start: int, end: int) -> bool:
        """Whether bytes [start, end) are held, whole or in one range (nothing counted)."""
        return key in self._entries or self._range_start(key, start, end) is not None

    def _range_start(self, key: str, start: int, end: int | None) -> int | None:
        for begin, stop in self._ranges.get(key, {}).items():
            if begin <= start and (start < stop if end is None else end <= stop):
                return begin
        return None

    def discard(self, key: str) -> None:
        """Forget the object, whole and every range of it."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.stats["bytes"] -= len(old)
        for begin in self._ranges.pop(key, {}):
            old = self._entries.pop((key, begin), None)
            if old is not None:
                self.stats["bytes"] -= len(old)


class Done(Protocol):
    """Set once something is done (a GET under way, here); awaited until then."""

    async def wait(self) -> None: ...


class RangeReader:
    """Reads byte ranges of objects: from the cache if possible, else coalesced GETs.

    A range that is not cached but that a GET under way will bring into the cache (a
    read-ahead's: `in_flight` names the event set once it is there) is waited for rather
    than read a second time: a consumer catching up would otherwise overtake its
    read-ahead and read every stretch twice. One call waits IN_FLIGHT_WAIT_S at most in
    all, however many of its ranges it waits for."""

    def __init__(
        self,
        store: ObjectStore,
        cache: ObjectCache | None = None,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        in_flight: Callable[[str, int, int], Done | None] | None = None,
        disk: DiskCache | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.disk = disk
        self.max_gap = max_gap
        self.in_flight = in_flight
        self.stats: dict[str, int] = {
            "gets": 0,
            "bytes_got": 0,
            "cache_reads": 0,
            "waited_reads": 0,  # ranges found in the cache after waiting for a GET under way
            "waits": 0,  # calls that waited for GETs under way
            "wait_ms": 0,  # how long, in all
            "wait_timeouts": 0,  # of them, those that waited IN_FLIGHT_WAIT_S and gave up
            "disk_reads": 0,  # spans read from the disk cache rather than with a GET
        }

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
        waiting: list[tuple[int, Done]] = []  # requests a GET under way will bring
        for index, (key, start, end) in enumerate(requests):
            if start < 0 or end < start:
                raise ValueError(f"bad range [{start}, {end}) of {key!r}")
            cached = self.cache.slice(key, start, end) if self.cache is not None else None
            if cached is None and self.cache is not None and self.in_flight is not None:
                done = self.in_flight(key, start, end)
                if done is not None:
                    waiting.append((index, done))
                    continue
            self._take(index, requests[index], cached, results, pending)
        if waiting:
            began = time.monotonic()
            with anyio.move_on_after(IN_FLIGHT_WAIT_S) as scope:
                for done in dict.fromkeys(done for _index, done in waiting):
                    await done.wait()
            self.stats["waits"] += 1
            self.stats["wait_ms"] += round((time.monotonic() - began) * 1000)
            if scope.cancelled_caught:
                self.stats["wait_timeouts"] += 1
            assert self.cache is not None
            for index, _done in waiting:
                key, start, end = requests[index]
                cached = self.cache.slice(key, start, end)
                if cached is not None:
                    self.stats["waited_reads"] += 1
                self._take(index, requests[index], cached, results, pending)
        spans = [
            span for key, indexes in pending.items() for span in self._spans(key, indexes, requests)
        ]
        if len(spans) <= 1:  # no task group for one GET, or none (all cached)
            if spans:
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

    def _take(
        self,
        index: int,
        request: tuple[str, int, int],
        cached: memoryview | None,
        results: list[bytes | memoryview],
        pending: dict[str, list[int]],
    ) -> None:
        """The request's bytes from the cache, or the request noted for a GET."""
        key, start, end = request
        if cached is not None:
            results[index] = cached
            self.stats["cache_reads"] += 1
        elif end > start:
            pending.setdefault(key, []).append(index)

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
        data: bytes | memoryview | None = None
        if self.disk is not None and span.key in self.disk:
            data = await anyio.to_thread.run_sync(self.disk.read, span.key, span.start, span.end)
            if data is not None:
                self.stats["disk_reads"] += 1
        if data is None:
            self.stats["gets"] += 1
            data = await self.store.get_view(span.key, span.start, span.end)
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
