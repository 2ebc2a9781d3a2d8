"""What read-ahead reads of each object, and when it asks for the next stretch."""

from __future__ import annotations

from broker.readahead import STRETCH_MAX, STRETCH_MIN, ReadAhead, _Piece, _pieces
from metadata.compaction import L1, L2
from metadata.lifecycle import ObjectRecord
from metadata.log import ChunkEntry
from storage.cache import ObjectCache

MiB = 1024 * 1024


def entry(key: str, start: int, length: int, base: int, count: int = 10) -> ChunkEntry:
    return ChunkEntry(key, start, length, base, base + count - 1, 1, 0)


def record(size: int, level: int | None) -> ObjectRecord:
    return ObjectRecord(size, 1, 0, None, level)


def test_what_one_get_reads_of_each_object() -> None:
    entries = [
        entry("small", 0, MiB, 0),
        entry("small-level1", MiB, MiB, 5),  # a 3 MiB object of many partitions
        entry("level1", 5 * MiB, MiB, 10),  # a 40 MiB one
        entry("level2", 3 * MiB, MiB, 20),  # a 40 MiB object of this partition
        entry("level2", 4 * MiB, MiB, 30),
        entry("unknown", 9 * MiB, MiB, 50),  # no record: read whole
    ]
    records = {
        "small": record(2 * MiB, L2),
        "small-level1": record(3 * MiB, L1),
        "level1": record(40 * MiB, L1),
        "level2": record(40 * MiB, L2),
    }
    # Whole when no larger than the stretch; else the partition's bytes, whatever the
    # object's level (a 40 MiB object of many partitions was once read whole).
    assert _pieces(entries, records, stretch=4 * MiB) == [
        _Piece("small", None, None),
        _Piece("small-level1", None, None),
        _Piece("level1", 5 * MiB, 6 * MiB),
        _Piece("level2", 3 * MiB, 5 * MiB),
        _Piece("unknown", None, None),
    ]


def _read_ahead(cache: ObjectCache) -> ReadAhead:
    return ReadAhead(None, None, None, cache, None)  # type: ignore[arg-type]


def test_the_stretch_is_a_third_of_the_cache_shared_among_partitions_read() -> None:
    ahead = _read_ahead(ObjectCache(256 * MiB))
    assert ahead.stretch_bytes() == STRETCH_MAX  # nothing read yet: one partition
    for p in range(64):
        ahead.note_fetch(b"t", p, [entry("x", 0, MiB, 0)], high_watermark=100)
    ahead._active_counted_at = 0.0  # counted again at once, not a second later
    assert ahead.stretch_bytes() == 256 * MiB // (3 * 64)
    small = _read_ahead(ObjectCache(2 * MiB))
    assert small.stretch_bytes() == STRETCH_MIN


def test_the_next_stretch_is_asked_for_at_the_middle_of_the_last() -> None:
    cache = ObjectCache(256 * MiB)
    ahead = _read_ahead(cache)
    cache.put_range("obj", 0, b"x" * 1000)
    # At the head of the partition: nothing to read ahead.
    ahead.note_fetch(b"t", 0, [entry("obj", 0, 100, 90)], high_watermark=100)
    assert ahead.stats["requests"] == 0
    # Behind, and the bytes were not cached: a request from the last entry read.
    ahead.note_fetch(b"t", 0, [entry("other", 0, 100, 0)], high_watermark=100)
    assert ahead.stats["requests"] == 1
    front = ahead._fronts[(b"t", 0)]
    ahead.note_fetch(b"t", 0, [entry("other", 0, 100, 0)], high_watermark=100)
    assert ahead.stats["requests"] == 1, "one request at a time per partition"
    # The stretch was read: offsets 0-59, its middle at 30.
    front.busy, front.next_offset, front.refill_at = False, 60, 30
    ahead.note_fetch(b"t", 0, [entry("obj", 0, 100, 10)], high_watermark=100)
    assert ahead.stats["requests"] == 1, "cached and before the middle: nothing asked"
    ahead.note_fetch(b"t", 0, [entry("obj", 100, 100, 30)], high_watermark=100)
    assert ahead.stats["requests"] == 2
    assert ahead._receive.receive_nowait() == ((b"t", 0), 0)
    assert ahead._receive.receive_nowait() == ((b"t", 0), 60)
