"""Chunk index entries already read, kept in memory: they never change.

An entry of the chunk index (which bytes of which object hold offsets [base, last] of a
partition) is written once, in the transaction that gives its batches offsets, and is
removed only with its topic, whose id is never used again. A copy read once therefore
stays right for as long as anyone can ask for it. What does change, the partition's high
watermark and log start offset, is still read from the store for every Fetch, and it
decides what may be served; the cache only saves reading and decoding the entries.

Rules:
- `ChunkCache.lookup` answers exactly what `log.read_chunks` would answer in a
  transaction that saw `high_watermark`, or None when the entries it holds cannot tell;
  `read_chunks_cached` reads the store then and keeps what it read.
- Per partition one run of contiguous entries is kept (consumers read forward, so a new
  run replaces one it does not extend), at most `ENTRIES` entries of it, for the
  `PARTITIONS` partitions used last.
- Thread-safe: transaction functions may run on worker threads.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict

from metadata import keys
from metadata.kv import ReadTransaction
from metadata.log import ChunkEntry, read_chunks

PARTITIONS = 4096
ENTRIES = 64


def _last_offset(entry: ChunkEntry) -> int:
    return entry.last_offset


def _contiguous_prefix(entries: list[ChunkEntry]) -> list[ChunkEntry]:
    for i in range(1, len(entries)):
        if entries[i].base_offset != entries[i - 1].last_offset + 1:
            return entries[:i]
    return entries


class ChunkCache:
    def __init__(self, partitions: int = PARTITIONS, entries: int = ENTRIES) -> None:
        self._partitions = partitions
        self._entries = entries
        # Per partition, contiguous entries in offset order.
        self._runs: OrderedDict[tuple[bytes, int], list[ChunkEntry]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {"hits": 0, "misses": 0}

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
            run = self._runs.get((topic_id, partition))
            found = (
                None
                if run is None
                else self._answer(run, from_offset, limit, max_bytes, high_watermark)
            )
            self.stats["misses" if found is None else "hits"] += 1
            if found is not None:
                self._runs.move_to_end((topic_id, partition))
            return found

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

    def add(self, topic_id: bytes, partition: int, entries: list[ChunkEntry]) -> None:
        """Keep entries read from the index (in offset order, as read_chunks returns them)."""
        entries = _contiguous_prefix(entries)
        if not entries:
            return
        key = (topic_id, partition)
        with self._lock:
            held = self._runs.get(key)
            if held is not None:
                if held[0].base_offset <= entries[0].base_offset <= held[-1].last_offset + 1:
                    # Extends (or lies inside) the run held.
                    entries = held + [e for e in entries if e.base_offset > held[-1].last_offset]
            self._runs[key] = entries[-self._entries :]
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
) -> list[ChunkEntry]:
    """`log.read_chunks` through the cache; `high_watermark` is the one tr saw, if known."""
    found = cache.lookup(topic_id, partition, from_offset, limit, max_bytes, high_watermark)
    if found is not None:
        return found
    entries = read_chunks(tr, sub, topic_id, partition, from_offset, limit, max_bytes=max_bytes)
    cache.add(topic_id, partition, entries)
    return entries
