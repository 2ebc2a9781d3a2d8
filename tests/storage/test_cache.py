"""ObjectCache and RangeReader: cached reads cost no GET, uncached ones are coalesced."""

from __future__ import annotations

import os
import time

import anyio
import pytest

from storage import cache as cache_module
from storage.cache import ObjectCache, Pieces, RangeReader
from storage.local import LocalObjectStore
from storage.objectstore import ObjectNotFoundError, ObjectStore

MiB = 1024 * 1024


def test_cache_put_get_slice() -> None:
    cache = ObjectCache(max_bytes=100)
    cache.put("a", b"0123456789")
    assert cache.get("a") == b"0123456789"
    view = cache.slice("a", 2, 5)
    assert isinstance(view, memoryview)
    assert bytes(view) == b"234"
    assert cache.slice("a", 8) == b"89"
    assert cache.get("b") is None
    assert cache.slice("b", 0, 1) is None
    assert cache.stats == {"hits": 3, "misses": 2, "evictions": 0, "bytes": 10}


def test_an_object_held_in_pieces_reads_as_if_joined() -> None:
    parts = [b"0123", memoryview(b"xx45678yy")[2:7], b"", b"9", memoryview(b"abcdef")]
    whole = b"".join(parts)
    assert len(Pieces(parts)) == len(whole) == 16
    for start in range(len(whole) + 2):
        for end in [None, *range(len(whole) + 2)]:
            cache = ObjectCache(max_bytes=100)
            cache.put("a", Pieces(parts))
            view = cache.slice("a", start, end)
            assert view is not None and bytes(view) == whole[start:end], (start, end)
            assert cache.total_bytes == 16
    cache = ObjectCache(max_bytes=100)
    cache.put("a", Pieces(parts))
    inside = cache.slice("a", 5, 8)
    assert inside is not None and inside.obj is parts[1].obj, "in one piece: a view"
    across = cache.slice("a", 3, 11)
    assert across is not None and bytes(across) == whole[3:11]
    assert across.obj is cache.get("a") == whole, "across pieces: joined once, and held"
    cache.put("b", Pieces(parts))
    assert cache.get("b") == whole and cache.slice("b", 5, 8).obj is cache.get("b")


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    cache = ObjectCache(max_bytes=100)
    cache.put("a", b"a" * 40)
    cache.put("b", b"b" * 40)
    assert cache.get("a") is not None  # "b" is now the least recently used
    cache.put("c", b"c" * 40)
    assert "b" not in cache
    assert "a" in cache and "c" in cache
    assert cache.total_bytes == 80
    cache.put("d", b"d" * 90)  # needs room for 90: both others go
    assert len(cache) == 1 and "d" in cache
    assert cache.stats["evictions"] == 3
    assert cache.total_bytes == 90


def test_cache_replaces_and_skips_oversized() -> None:
    cache = ObjectCache(max_bytes=100)
    cache.put("a", b"x" * 60)
    cache.put("a", b"y" * 30)
    assert cache.total_bytes == 30
    assert cache.get("a") == b"y" * 30
    cache.put("huge", b"z" * 101)
    assert "huge" not in cache
    assert cache.get("a") == b"y" * 30, "an object too big to cache evicts nothing"
    cache.discard("a")
    cache.discard("a")
    assert cache.total_bytes == 0 and len(cache) == 0


def test_cache_holds_ranges_of_an_object() -> None:
    cache = ObjectCache(max_bytes=100)
    cache.put_range("big", 1000, b"0123456789")
    assert "big" not in cache, "a range is not the whole object"
    assert cache.covers("big", 1002, 1005) and not cache.covers("big", 1005, 1011)
    assert bytes(cache.slice("big", 1002, 1005) or b"") == b"234"
    assert bytes(cache.slice("big", 1008) or b"") == b"89"
    assert cache.slice("big", 999, 1002) is None, "a range not wholly held is a miss"
    cache.put_range("big", 2000, b"x" * 50)
    assert cache.total_bytes == 60
    cache.put_range("big", 2000, b"y" * 20)  # the same range again replaces it
    assert cache.total_bytes == 30 and bytes(cache.slice("big", 2000, 2001) or b"") == b"y"
    # Least recently used first out, ranges and whole objects alike.
    assert cache.slice("big", 1000, 1001) is not None  # the range at 2000 is now oldest
    cache.put("small", b"s" * 75)
    assert not cache.covers("big", 2000, 2001) and cache.covers("big", 1000, 1010)
    assert cache.total_bytes == 85
    # The whole object supersedes its ranges; discarding forgets everything of it.
    cache.put("small", b"s" * 10)
    cache.put("big", b"B" * 80)
    assert cache.total_bytes == 90 and cache.covers("big", 0, 80)
    cache.put_range("big", 0, b"r" * 5)  # held whole: nothing added
    assert cache.total_bytes == 90
    cache.discard("big")
    assert not cache.covers("big", 0, 1) and cache.total_bytes == 10
    cache.put_range("other", 0, b"o" * 10)
    cache.put_range("other", 50, b"p" * 10)
    cache.discard("other")
    assert cache.total_bytes == 10 and len(cache) == 1


async def test_a_cached_range_costs_no_get(local_store: LocalObjectStore) -> None:
    data = os.urandom(10_000)
    await local_store.put("level2/1", data)
    cache = ObjectCache(max_bytes=MiB)
    cache.put_range("level2/1", 4000, data[4000:8000])
    reader = RangeReader(local_store, cache)
    got = await reader.read_many([("level2/1", 5000, 6000), ("level2/1", 7000, 9000)])
    assert bytes(got[0]) == data[5000:6000] and bytes(got[1]) == data[7000:9000]
    assert reader.stats["cache_reads"] == 1 and reader.gets == 1, "only the range past it"


async def test_cached_object_costs_no_get(local_store: LocalObjectStore) -> None:
    data = os.urandom(10_000)
    await local_store.put("ingest/1", data)
    cache = ObjectCache(max_bytes=MiB)
    cache.put("ingest/1", data)
    reader = RangeReader(local_store, cache)
    assert await reader.read("ingest/1", 100, 200) == data[100:200]
    assert await reader.read_many([("ingest/1", 0, 10), ("ingest/1", 9_000, 10_000)]) == [
        data[:10],
        data[9_000:],
    ]
    assert reader.gets == 0
    assert local_store.stats["gets"] == 0


async def test_cached_ranges_are_views_of_the_cached_object(local_store: LocalObjectStore) -> None:
    data = os.urandom(300_000)
    cache = ObjectCache(max_bytes=MiB)
    cache.put("ingest/1", data)
    reader = RangeReader(local_store, cache)
    (view,) = await reader.read_many([("ingest/1", 1_000, 263_144)])
    # No copy on the Fetch path: the answer points into the cached object itself.
    assert isinstance(view, memoryview) and view.obj is data and view.readonly
    assert view == data[1_000:263_144]
    # read() hands out a copy of its own.
    copy = await reader.read("ingest/1", 0, 10)
    assert type(copy) is bytes and copy == data[:10]


async def test_uncached_ranges_coalesce_into_one_get_per_object(store: ObjectStore) -> None:
    one, two = os.urandom(3 * MiB), os.urandom(100_000)
    await store.put("ingest/1", one)
    await store.put("ingest/2", two)
    reader = RangeReader(store, ObjectCache(max_bytes=MiB))
    requests = [
        ("ingest/1", 2 * MiB, 2 * MiB + 500),
        ("ingest/2", 50, 60),
        ("ingest/1", 8, 4000),
        ("ingest/2", 90_000, 100_000),
        ("ingest/1", 1 * MiB, 1 * MiB + 10),
        ("ingest/1", 100, 200),  # inside another request's range
    ]
    results = await reader.read_many(requests)
    assert results == [
        one[2 * MiB : 2 * MiB + 500],
        two[50:60],
        one[8:4000],
        two[90_000:100_000],
        one[MiB : MiB + 10],
        one[100:200],
    ]
    assert reader.gets == 2
    assert store.stats["gets"] == 2  # type: ignore[attr-defined]
    assert reader.stats["bytes_got"] == (2 * MiB + 500 - 8) + (100_000 - 50)


async def test_far_apart_ranges_are_separate_gets(local_store: LocalObjectStore) -> None:
    data = os.urandom(4 * MiB)
    await local_store.put("ingest/1", data)
    reader = RangeReader(local_store, max_gap=MiB)
    results = await reader.read_many([("ingest/1", 0, 10), ("ingest/1", 3 * MiB, 3 * MiB + 10)])
    assert results == [data[:10], data[3 * MiB : 3 * MiB + 10]]
    assert reader.gets == 2
    assert reader.stats["bytes_got"] == 20


async def test_mixed_cached_and_uncached(local_store: LocalObjectStore) -> None:
    hot, cold = b"hot object", b"cold object"
    await local_store.put("hot", hot)
    await local_store.put("cold", cold)
    cache = ObjectCache(max_bytes=MiB)
    cache.put("hot", hot)
    reader = RangeReader(local_store, cache)
    results = await reader.read_many(
        [("cold", 0, 4), ("hot", 4, 10), ("cold", 5, 11), ("hot", 3, 3)]
    )
    assert results == [b"cold", b"object", b"object", b""]
    assert reader.gets == 1
    assert reader.stats["cache_reads"] == 2


async def test_missing_object_raises_store_error(local_store: LocalObjectStore) -> None:
    await local_store.put("there", b"data")
    reader = RangeReader(local_store)
    with pytest.raises(ObjectNotFoundError):
        await reader.read("missing", 0, 10)
    with pytest.raises(ObjectNotFoundError):
        await reader.read_many([("there", 0, 2), ("missing", 0, 10)])
    with pytest.raises(ValueError):
        await reader.read("there", 5, 2)


async def _read_ahead_of(
    store: LocalObjectStore, cache: ObjectCache, key: str, start: int, end: int, done: anyio.Event
) -> None:
    """What a read-ahead does: one GET of [start, end), into the cache, then the event."""
    await anyio.sleep(0.1)  # still under way when the reader asks
    cache.put_range(key, start, await store.get(key, start, end))
    done.set()


async def test_a_range_a_get_under_way_brings_is_waited_for(
    local_store: LocalObjectStore,
) -> None:
    data = os.urandom(4 * MiB)
    await local_store.put("obj", data)
    cache = ObjectCache(64 * MiB)
    done = anyio.Event()
    under_way = ("obj", MiB, 3 * MiB)

    def in_flight(key: str, start: int, end: int) -> anyio.Event | None:
        covers = key == under_way[0] and under_way[1] <= start and end <= under_way[2]
        return done if covers and not done.is_set() else None

    reader = RangeReader(local_store, cache, in_flight=in_flight)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_read_ahead_of, local_store, cache, *under_way, done)
        got = await reader.read_many([("obj", MiB + 10, 2 * MiB), ("obj", 0, 100)])
    assert [bytes(g) for g in got] == [data[MiB + 10 : 2 * MiB], data[:100]]
    # One GET of the read-ahead, one of the reader for the range it does not cover.
    assert local_store.stats["gets"] == 2
    assert reader.stats["gets"] == 1 and reader.stats["waited_reads"] == 1
    assert reader.stats["waits"] == 1 and reader.stats["wait_timeouts"] == 0


async def test_without_the_hook_the_same_read_gets_it_again(
    local_store: LocalObjectStore,
) -> None:
    data = os.urandom(4 * MiB)
    await local_store.put("obj", data)
    cache = ObjectCache(64 * MiB)
    done = anyio.Event()
    reader = RangeReader(local_store, cache)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_read_ahead_of, local_store, cache, "obj", MiB, 3 * MiB, done)
        got = await reader.read_many([("obj", MiB + 10, 2 * MiB)])
    assert bytes(got[0]) == data[MiB + 10 : 2 * MiB]
    assert local_store.stats["gets"] == 2 and reader.stats["gets"] == 1


async def test_a_get_under_way_that_never_lands_is_waited_for_a_while_only(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "IN_FLIGHT_WAIT_S", 0.2)
    data = os.urandom(MiB)
    await local_store.put("obj", data)
    never = anyio.Event()
    reader = RangeReader(local_store, ObjectCache(64 * MiB), in_flight=lambda *_: never)
    with anyio.fail_after(5):
        got = await reader.read_many([("obj", 0, 1000)])
    assert bytes(got[0]) == data[:1000]
    assert reader.stats["gets"] == 1 and reader.stats["waited_reads"] == 0


async def test_one_read_waits_for_gets_under_way_a_while_in_all_not_each(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fetch of many partitions may wait for many stretches: however many, its read
    waits IN_FLIGHT_WAIT_S at most before it reads what did not come itself."""
    monkeypatch.setattr(cache_module, "IN_FLIGHT_WAIT_S", 0.3)
    data = os.urandom(MiB)
    await local_store.put("obj", data)
    events: dict[tuple[str, int, int], anyio.Event] = {}

    def in_flight(key: str, start: int, end: int) -> anyio.Event:
        return events.setdefault((key, start, end), anyio.Event())  # never set

    reader = RangeReader(local_store, ObjectCache(64 * MiB), in_flight=in_flight, max_gap=0)
    ranges = [("obj", i * 100_000, i * 100_000 + 1000) for i in range(8)]
    started = time.monotonic()
    got = await reader.read_many(ranges)
    assert time.monotonic() - started < 0.3 * 3  # not 8 waits of 0.3 s one after another
    assert [bytes(g) for g in got] == [data[s:e] for _k, s, e in ranges]
    assert reader.stats["gets"] == 8 and reader.stats["waited_reads"] == 0
    # Counted as one wait that gave up, about IN_FLIGHT_WAIT_S long.
    assert reader.stats["waits"] == 1 and reader.stats["wait_timeouts"] == 1
    assert 250 <= reader.stats["wait_ms"] < 900
