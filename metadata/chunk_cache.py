"""Chunk index entries already read, kept in memory for a while.

An entry of the chunk index says which bytes of which object hold offsets [base, last]
of a partition. Offsets never change, but entries do go: retention, DeleteRecords and
topic deletion drop them, and compaction replaces them with entries in a new object.
Either way the object an old entry names is deleted only once nothing names it and the
delete delay (`--object-delete-delay-ms`) has passed since, so an entry read at time t
names bytes that stay readable until at least t + delete delay. A copy is therefore
used for `max_age_s` at most, well within that delay (the agent gives half of it),
which leaves the rest of the delay for the read that follows. What does change for
every Fetch, the partition's high watermark and log start offset, is still read from
the store, and it decides what may be served; the cache only saves reading and
decoding the entries.

Rules:
- `ChunkCache.lookup` answers what `log.read_chunks` answered in a transaction that saw
  `high_watermark` at most `max_age_s` ago (the same offsets and bytes, perhaps in the
  objects they were in then), or None when the entries it holds cannot tell;
  `read_chunks_cached` reads the store then and keeps what it read.
- A miss may read `wider` times the byte budget asked for (within the same entry
  limit) and keep it all, returning only what the budget takes: a consumer reading
  forward asks next for the entries after those it got, and finds them held.
- Per partition one run of contiguous entries is kept (consumers read forward, so a new
  run replaces one it does not extend), at most `ENTRIES` entries of it, for the
  `PARTITIONS` partitions used last. A run is as old as its oldest entry.
- An entry just committed (`extend`) joins the run it continues, if one is held: a
  consumer at the end of a partition finds the entries of each flush held when the
  flush wakes it. The run stays as old as it was (an entry committed at t names bytes
  kept until t + delete delay at least, as one read at t). A run it does not continue
  is left as it is, and nothing is held for a partition no one reads.
- Thread-safe: transaction functions may run on worker threads.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable

from metadata import keys
from metadata.kv import ReadTransaction
from metadata.log import ChunkEntry, read_chunks, within_budget

PARTITIONS = 4096
ENTRIES = 64
MAX_AGE_S = 30.0  # half the default delete delay


def _last_offset(entry: ChunkEntry) -> int:
    return entry.last_offset


def _contiguous_prefix(entries: list[ChunkEntry]) -> list[ChunkEntry]:
    for i in range(1, len(entries)):
        if entries[i].base_offset != entries[i - 1].last_offset + 1:
            return entries[:i]
    return entries


class _Run:
    """Contiguous entries of one partition in offset order, and when the oldest was read."""

    __slots__ = ("entries", "read_at")

    def __init__(self, entries: list[ChunkEntry], read_at: float) -> None:
        self.entries = entries
        self.read_at = read_at


class ChunkCache:
    def __init__(
        self,
        partitions: int = PARTITIONS,
        entries: int = ENTRIES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._partitions = partitions
        self._entries = entries
        self._max_age = max_age_s
        self._clock = clock
        self._runs: OrderedDict[tuple[bytes, int], _Run] = OrderedDict()
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "expired": 0, "extended": 0}

    def lookup(
        self,
        topic_id: bytes,
        partition: int,
        from_offset: int,
        limit: int,
        max_bytes: int,
        high_watermark: int | None = None,
    ) -> list[ChunkEntry] | None:
        """`read_chunks(from_offset, limit, max_bytes)` as seen with `high_watermark`
        (None: not known, so only an answer that stops at limit or max_bytes counts)."""
        with self._lock:
            run = self._fresh((topic_id, partition))
            found = (
                None
                if run is None
                else self._answer(run.entries, from_offset, limit, max_bytes, high_watermark)
            )
            self.stats["misses" if found is None else "hits"] += 1
            if found is not None:
                self._runs.move_to_end((topic_id, partition))
            return found

    def _fresh(self, key: tuple[bytes, int], now: float | None = None) -> _Run | None:
        """The partition's run, unless it is too old to use (then it is dropped)."""
        run = self._runs.get(key)
        if run is None:
            return None
        if (self._clock() if now is None else now) - run.read_at >= self._max_age:
            del self._runs[key]
            self.stats["expired"] += 1
            return None
        return run

    @staticmethod
    def _answer(
        entries: list[ChunkEntry],
        from_offset: int,
        limit: int,
        max_bytes: int,
        high_watermark: int | None,
    ) -> list[ChunkEntry] | None:
        if from_offset < entries[0].base_offset:
            return None  # an earlier entry, not held, may hold from_offset
        if high_watermark is not None and from_offset >= high_watermark:
            return []  # no entry holds an offset at or past the watermark
        out: list[ChunkEntry] = []
        after_first = 0
        first = bisect_left(entries, from_offset, key=_last_offset)
        for i in range(first, len(entries)):
            entry = entries[i]
            if high_watermark is not None and entry.base_offset >= high_watermark:
                return out  # the end of the index in that transaction
            out.append(entry)
            if len(out) > 1:
                after_first += entry.length
                if after_first >= max_bytes:
                    return out
            if limit and len(out) >= limit:
                return out
        if high_watermark is not None and entries[-1].last_offset + 1 >= high_watermark:
            return out
        return None  # the index may go on past what is held

    def extend(self, committed: Iterable[tuple[bytes, int, ChunkEntry]]) -> None:
        """Add the entries of one commit, (topic id, partition, entry) in offset order per
        partition, each to its partition's run if it continues it. One lock and one
        clock reading for the commit: a flush may write an entry for each of a thousand
        partitions."""
        with self._lock:
            if not self._runs:
                return
            now = self._clock()
            for topic_id, partition, entry in committed:
                run = self._fresh((topic_id, partition), now)
                if run is None or run.entries[-1].last_offset + 1 != entry.base_offset:
                    continue
                run.entries.append(entry)
                if len(run.entries) > self._entries:
                    del run.entries[0]
                self.stats["extended"] += 1

    def forget(self, topic_id: bytes, partition: int) -> None:
        """Drop what is held of the partition (an object it named was found gone)."""
        with self._lock:
            self._runs.pop((topic_id, partition), None)

    def add(self, topic_id: bytes, partition: int, entries: list[ChunkEntry]) -> None:
        """Keep entries read from the index (in offset order, as read_chunks returns them)."""
        entries = _contiguous_prefix(entries)
        if not entries:
            return
        key = (topic_id, partition)
        now = self._clock()
        with self._lock:
            held = self._fresh(key)
            read_at = now
            if held is not None:
                old = held.entries
                if old[0].base_offset <= entries[0].base_offset <= old[-1].last_offset + 1:
                    # Extends (or lies inside) the run held: as old as the run.
                    entries = old + [e for e in entries if e.base_offset > old[-1].last_offset]
                    read_at = held.read_at
            self._runs[key] = _Run(entries[-self._entries :], read_at)
            self._runs.move_to_end(key)
            while len(self._runs) > self._partitions:
                self._runs.popitem(last=False)


def read_chunks_cached(
    tr: ReadTransaction,
    cache: ChunkCache,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    from_offset: int,
    limit: int,
    max_bytes: int,
    high_watermark: int | None = None,
    *,
    wider: int = 1,
) -> list[ChunkEntry]:
    """`log.read_chunks` through the cache; `high_watermark` is the one tr saw, if known.
    A miss reads `wider` times max_bytes (within limit) into the cache."""
    found = cache.lookup(topic_id, partition, from_offset, limit, max_bytes, high_watermark)
    if found is not None:
        return found
    budget = max_bytes * max(1, wider)
    entries = read_chunks(tr, sub, topic_id, partition, from_offset, limit, max_bytes=budget)
    cache.add(topic_id, partition, entries)
    # What read_chunks with max_bytes itself would have answered: the same rule.
    return within_budget(entries, max_bytes) if budget != max_bytes else entries
