"""What read-ahead reads of each object, and when it asks for the next stretch."""

from __future__ import annotations

from broker.readahead import STRETCH_MAX, STRETCH_MIN, ReadAhead, _Front, _Piece, _pieces
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
    # Behind, and the bytes were not cached: a request from the first entry missing.
    ahead.note_fetch(b"t", 0, [entry("other", 0, 100, 0)], high_watermark=100)
    assert ahead.stats["requests"] == 1
    front = ahead._fronts[(b"t", 0)]
    ahead.note_fetch(b"t", 0, [entry("other", 0, 100, 0)], high_watermark=100)
    assert ahead.stats["requests"] == 1, "one request at a time per partition"
    # The stretch was read: offsets 0-59, its middle at 30.
    front.busy, front.request, front.next_offset, front.refill_at = False, None, 60, 30
    ahead.note_fetch(b"t", 0, [entry("obj", 0, 100, 10)], high_watermark=100)
    assert ahead.stats["requests"] == 1, "cached and before the middle: nothing asked"
    ahead.note_fetch(b"t", 0, [entry("obj", 100, 100, 30)], high_watermark=100)
    assert ahead.stats["requests"] == 2
    assert [(r.partition, r.from_offset) for r in ahead._urgent] == [((b"t", 0), 0)]
    assert [(r.partition, r.from_offset) for r in ahead._ahead] == [((b"t", 0), 60)]


def test_a_fetch_that_overtook_its_read_ahead_waits_for_the_stretch_it_asks_for() -> None:
    cache = ObjectCache(256 * MiB)
    ahead = _read_ahead(cache)
    cache.put_range("obj", 0, b"x" * 100)
    fetched = [entry("obj", 0, 100, 10), entry("obj", 100, 100, 20), entry("obj", 200, 100, 30)]
    ahead.note_fetch(b"t", 0, fetched, high_watermark=100)
    # From the first entry missing; the Fetch's missing ranges are promised to it.
    (request,) = ahead._urgent
    assert request.from_offset == 20 and request.urgent
    assert ahead.in_flight("obj", 0, 100) is None  # cached
    waits = [ahead.in_flight("obj", start, start + 100) for start in (100, 200)]
    assert all(w is not None and not w.is_set() for w in waits)
    assert ahead.stats["promised_ranges"] == 2 and ahead.stats["urgent_requests"] == 1
    # A piece of the stretch brought the first: that Fetch goes on; the other waits on.
    cache.put_range("obj", 100, b"y" * 100)
    ahead._keep_promises(request, ended=False)
    assert waits[0].is_set() and not waits[1].is_set()
    assert ahead.in_flight("obj", 100, 200) is None
    assert ahead.stats["promises_unkept"] == 0
    # The stretch ended without the second: released, the Fetch reads it itself.
    ahead._keep_promises(request, ended=True)
    assert waits[1].is_set() and not ahead._promised
    assert ahead.stats["promises_unkept"] == 1


def test_a_fetch_waits_for_a_queued_stretch_only_if_it_may_bring_its_bytes() -> None:
    ahead = _read_ahead(ObjectCache(256 * MiB))
    ahead.note_fetch(b"t", 0, [entry("a", 0, 100, 0)], high_watermark=1000)
    (request,) = ahead._urgent
    request.until_offset = 50  # planned: offsets 0-49
    ahead.note_fetch(b"t", 0, [entry("b", 0, 100, 40)], high_watermark=1000)
    assert ahead.in_flight("b", 0, 100) is not None
    assert ahead.stats["fetches_beside_stretch"] == 0
    ahead.note_fetch(b"t", 0, [entry("c", 0, 100, 50)], high_watermark=1000)
    assert ahead.in_flight("c", 0, 100) is None  # past the stretch: read by the Fetch
    assert ahead.stats["requests"] == 1
    assert ahead.stats["fetches_beside_stretch"] == 1


def test_a_fetch_of_bytes_read_ahead_and_no_longer_cached_is_counted() -> None:
    ahead = _read_ahead(ObjectCache(256 * MiB))
    front = ahead._fronts[(b"t", 0)] = _Front(next_offset=100, refill_at=50)
    # Offsets 10-19 were read ahead (the front is at 100); the cache has them no more.
    ahead.note_fetch(b"t", 0, [entry("gone", 0, 100, 10)], high_watermark=1000)
    assert ahead.stats["fetches_evicted"] == 1 and ahead.stats["requests"] == 0
    # Cached: nothing counted.
    ahead._cache.put("gone", b"x" * 100)
    ahead.note_fetch(b"t", 0, [entry("gone", 0, 100, 10)], high_watermark=1000)
    assert ahead.stats["fetches_evicted"] == 1
    # Past the middle and missing: counted, and the next stretch is asked for.
    ahead.note_fetch(b"t", 0, [entry("gone2", 0, 100, 60)], high_watermark=1000)
    assert ahead.stats["fetches_evicted"] == 2 and ahead.stats["requests"] == 1
    assert front.busy and [r.from_offset for r in ahead._ahead] == [100]


def test_a_stretch_a_fetch_waits_for_goes_before_those_asked_for_ahead() -> None:
    ahead = _read_ahead(ObjectCache(256 * MiB))
    cache_entry = entry("obj", 0, 100, 0)
    ahead._cache.put("obj", b"x" * 1000)
    ahead.note_fetch(b"t", 0, [cache_entry], high_watermark=1000)  # cached: nothing asked
    front = ahead._fronts[(b"t", 0)]
    front.next_offset, front.refill_at = 100, 0
    ahead.note_fetch(b"t", 0, [cache_entry], high_watermark=1000)  # the next stretch
    ahead.note_fetch(b"t", 1, [entry("missing", 0, 100, 0)], high_watermark=1000)
    assert [r.partition for r in ahead._ahead] == [(b"t", 0)]
    assert [r.partition for r in ahead._urgent] == [(b"t", 1)]
    # Workers kept for stretches Fetches wait for take only those.
    assert ahead._next_request(urgent_only=True).partition == (b"t", 1)
    assert ahead._next_request(urgent_only=True) is None
    assert ahead._next_request().partition == (b"t", 0)
