"""Read-ahead reads a large object's ranges through one open GET (broker.readahead
_read_range), on the local store and on S3 (moto)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from broker import readahead
from broker.readahead import ReadAhead, _Front
from metadata import keys
from metadata.chunk_cache import ChunkCache
from metadata.compaction import L1, L2
from metadata.lifecycle import ObjectRecord, put_object
from metadata.log import ChunkEntry, put_entry
from metadata.sqlite_kv import SQLiteKV
from storage.cache import ObjectCache, RangeReader
from storage.objectstore import ObjectStore
from tests.storage.conftest import make_store

MiB = 1024 * 1024
HALF = MiB // 2
SIZE = 6 * MiB
DATA = os.urandom(SIZE)


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    made = make_store(request.param, request, tmp_path)
    await made.put("big", DATA)
    await made.put("other", DATA)
    yield made
    await made.aclose()


@pytest.fixture
async def ahead(store: ObjectStore) -> AsyncIterator[ReadAhead]:
    made = ReadAhead(None, None, store, ObjectCache(64 * MiB), None)  # type: ignore[arg-type]
    yield made
    await made.aclose()


def gets(store: ObjectStore) -> int:
    return store.stats["gets"]  # type: ignore[attr-defined]


async def test_consecutive_ranges_are_one_get(store: ObjectStore, ahead: ReadAhead) -> None:
    before = gets(store)
    for start in range(0, SIZE, MiB):
        end = start + MiB
        assert await ahead._read_range("big", start, end, SIZE) == DATA[start:end]
    assert gets(store) - before == 1
    assert ahead.stats["streams_opened"] == 1 and ahead.stats["streamed_ranges"] == 6
    assert not ahead._streams  # read to its end: closed


async def test_a_small_gap_is_read_through_a_jump_back_opens_another(
    store: ObjectStore, ahead: ReadAhead
) -> None:
    before = gets(store)
    assert await ahead._read_range("big", 0, MiB, SIZE) == DATA[:MiB]
    # 1000 bytes further on: read and dropped on the same stream.
    assert await ahead._read_range("big", MiB + 1000, 2 * MiB, SIZE) == DATA[MiB + 1000 : 2 * MiB]
    assert gets(store) - before == 1
    assert await ahead._read_range("big", 100, 200, SIZE) == DATA[100:200]  # behind it
    assert gets(store) - before == 2
    far = 2 * MiB + readahead.STREAM_SKIP + 1  # too far ahead: a new GET too
    assert await ahead._read_range("big", far, far + 10, SIZE) == DATA[far : far + 10]
    assert gets(store) - before == 3


async def test_streams_are_bounded_and_closed_when_idle(
    store: ObjectStore, ahead: ReadAhead, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readahead, "STREAMS", 1)
    await ahead._read_range("big", 0, MiB, SIZE)
    await ahead._read_range("other", 0, MiB, SIZE)
    assert list(ahead._streams) == [("other", SIZE)]  # the least recently read was closed
    before = gets(store)
    await ahead._read_range("big", MiB, 2 * MiB, SIZE)
    assert gets(store) - before == 1  # its stream was gone
    monkeypatch.setattr(readahead, "STREAM_IDLE_SECONDS", 0.0)
    await ahead._read_range("other", MiB, 2 * MiB, SIZE)
    assert gets(store) - before == 2  # closed as idle before this read


async def test_the_runs_of_two_partitions_in_one_object_keep_a_stream_each(
    store: ObjectStore, ahead: ReadAhead
) -> None:
    """A level-2 object of two partitions' runs, read by both at once in turns: each run
    is one GET, not a GET whenever the other partition read last."""
    half = SIZE // 2
    before = gets(store)
    for start in range(0, half, MiB):
        for run in (0, half):
            got = await ahead._read_range("big", run + start, run + start + MiB, run + half)
            assert got == DATA[run + start : run + start + MiB]
    assert gets(store) - before == 2
    assert ahead.stats["streams_opened"] == 2 and not ahead._streams


async def test_a_store_without_streams_gets_each_range(
    store: ObjectStore, ahead: ReadAhead
) -> None:
    ahead._open_stream = None
    before = gets(store)
    for start in range(0, 3 * MiB, MiB):
        assert await ahead._read_range("big", start, start + MiB, SIZE) == DATA[start : start + MiB]
    assert gets(store) - before == 3


async def test_a_partitions_range_of_a_large_object_of_many_is_one_plain_get(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Read-ahead of one partition of an object of many partitions, larger than its share
    of the cache: the partition's bytes with one ranged GET, no stream left open behind
    them (what follows them is another partition's), and not the whole object."""
    sub = keys.cluster_subspace("read-ahead-of-many")
    topic = b"t" * 16
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    # "big" as a level-1 object: partition p's bytes at [p MiB, p+1 MiB), 10 offsets each.
    entries = [ChunkEntry("big", p * MiB, MiB, 0, 9, 1, 0) for p in range(6)]

    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "big", ObjectRecord(SIZE, len(entries), 0, None, L1))
        for p, e in enumerate(entries):
            put_entry(tr, sub, topic, p, e)

    kv.transact_sync(write)
    # A 24 MiB cache, a third of it for read-ahead, shared by 4 partitions read lately:
    # stretches of 2 MiB. The 6 MiB object would fit the third, not the stretch.
    ahead = ReadAhead(kv, sub, store, ObjectCache(24 * MiB), ChunkCache())
    ahead._active, ahead._active_counted_at = 4, time.monotonic()
    try:
        assert ahead.stretch_bytes() == 2 * MiB
        before = gets(store)
        await ahead._read_stretch((topic, 2), 0, None)
        assert gets(store) - before == 1
        assert ahead.stats["ranges"] == 1 and ahead.stats["objects"] == 0
        assert ahead.stats["bytes"] == MiB
        assert ahead.stats["level1_reads"] == 1 and ahead.stats["level0_reads"] == 0
        assert ahead.stats["level1_bytes"] == MiB
        assert ahead.stats["level0_bytes"] == ahead.stats["level2_bytes"] == 0
        assert ahead.stats["streams_opened"] == 0 and not ahead._streams
        assert bytes(ahead._cache.slice("big", 2 * MiB, 3 * MiB) or b"") == DATA[2 * MiB : 3 * MiB]
    finally:
        await ahead.aclose()
        kv.close()


async def test_the_stretch_before_the_last_goes_first_from_the_cache_once_the_next_is_read(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A partition's third stretch is asked for half way through its second: its reader
    is past the first, whose ranges go first when the cache wants room, before those that
    other partitions' readers have still to read (and were put in earlier)."""
    sub = keys.cluster_subspace("read-ahead-let-go")
    topic = b"t" * 16
    kv = SQLiteKV(str(tmp_path / "meta.db"))

    def write(tr):  # type: ignore[no-untyped-def]
        # "big" as one partition's level-1 object: twelve entries of 512 KiB, 10 offsets
        # each.
        put_object(tr, sub, "big", ObjectRecord(SIZE, 12, 0, None, L1))
        for i in range(12):
            entry = ChunkEntry("big", i * HALF, HALF, 10 * i, 10 * i + 9, 1, 0)
            put_entry(tr, sub, topic, 0, entry)

    kv.transact_sync(write)
    ahead = ReadAhead(kv, sub, store, ObjectCache(24 * MiB), ChunkCache())
    ahead._active, ahead._active_counted_at = 4, time.monotonic()  # 2 MiB stretches
    front = ahead._fronts[(topic, 0)] = _Front(seen=time.monotonic())
    cache = ahead._cache
    try:
        starts = []  # where each stretch starts, in the object and in offsets
        for _ in range(3):
            offset = max(front.next_offset, 0)
            starts.append((offset // 10 * HALF, offset))
            await ahead._read_stretch((topic, 0), starts[-1][1], front)
            if len(starts) == 2:
                cache.slice("big", 0, 10)  # its reader reads the first: the most recent
                assert list(cache._entries) == [("big", starts[1][0]), ("big", 0)]
        assert len(set(starts)) == 3, "three stretches of the object"
        first, second, third = (("big", start) for start, _offset in starts)
        assert list(cache._entries) == [first, second, third]
        # A stretch that does not go on from the last (a reader gone back) lets go of none.
        cache.slice(*second, second[1] + 10)
        await ahead._read_stretch((topic, 0), 0, front)
        assert list(cache._entries) == [first, third, second]
    finally:
        await ahead.aclose()
        kv.close()


async def test_a_partitions_run_in_a_level_two_object_of_several_is_one_stream_to_its_end(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A level-2 object may hold the runs of a few partitions one after the other: the
    stream read-ahead opens for one partition's run ends where that run ends, not at the
    object's end, and is closed once the run is read."""
    sub = keys.cluster_subspace("read-ahead-of-level-two")
    topic = b"t" * 16
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    quarter = MiB // 4
    # "big" as a level-2 object: partition p's run at [p MiB, p+1 MiB), in 4 entries.
    entries = {
        p: [
            ChunkEntry("big", p * MiB + i * quarter, quarter, 10 * i, 10 * i + 9, 1, 0)
            for i in range(4)
        ]
        for p in range(6)
    }

    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "big", ObjectRecord(SIZE, 24, 0, None, L2))
        for p, run in entries.items():
            for e in run:
                put_entry(tr, sub, topic, p, e)

    kv.transact_sync(write)
    ahead = ReadAhead(kv, sub, store, ObjectCache(24 * MiB), ChunkCache())
    ahead._active, ahead._active_counted_at = 4, time.monotonic()  # 2 MiB stretches
    opened: list[tuple[str, int, int | None]] = []
    open_stream = ahead._open_stream
    assert open_stream is not None

    def noting(key: str, start: int, end: int | None = None):  # type: ignore[no-untyped-def]
        opened.append((key, start, end))
        return open_stream(key, start, end)

    ahead._open_stream = noting
    try:
        before = gets(store)
        await ahead._read_stretch((topic, 2), 0, None)
        assert opened == [("big", 2 * MiB, 3 * MiB)]
        assert gets(store) - before == 1
        assert ahead.stats["streams_opened"] == 1 and not ahead._streams  # read to its end
        assert ahead.stats["level0_reads"] == ahead.stats["level1_reads"] == 0
        # Its GET is the stream's, not a read of its own; its bytes are level 2's.
        assert ahead.stats["level2_reads"] == 0 and ahead.stats["level2_bytes"] == MiB
        assert ahead.stats["level0_bytes"] == ahead.stats["level1_bytes"] == 0
        assert bytes(ahead._cache.slice("big", 2 * MiB, 3 * MiB) or b"") == DATA[2 * MiB : 3 * MiB]
        # From a store without streams, another partition's run is a plain GET of its own.
        ahead._open_stream = None
        await ahead._read_stretch((topic, 3), 0, None)
        assert gets(store) - before == 2 and opened == [("big", 2 * MiB, 3 * MiB)]
        assert ahead.stats["level2_reads"] == 1 and ahead.stats["level2_bytes"] == 2 * MiB
    finally:
        await ahead.aclose()
        kv.close()


async def test_a_fetch_that_overtook_its_read_ahead_waits_for_it_instead_of_a_get(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A Fetch whose bytes are neither cached nor being read asks for a stretch from its
    first missing entry and waits for it: the stretch's GET is the only one."""
    sub = keys.cluster_subspace("read-ahead-overtaken")
    topic = b"t" * 16
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    quarter = MiB // 4
    # "big" as a level-1 object: partition p's bytes at [p MiB, p+1 MiB), in 4 entries.
    entries = {
        p: [
            ChunkEntry("big", p * MiB + i * quarter, quarter, 10 * i, 10 * i + 9, 1, 0)
            for i in range(4)
        ]
        for p in range(6)
    }

    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "big", ObjectRecord(SIZE, 24, 0, None, L1))
        for p, run in entries.items():
            for e in run:
                put_entry(tr, sub, topic, p, e)

    kv.transact_sync(write)
    cache = ObjectCache(24 * MiB)
    ahead = ReadAhead(kv, sub, store, cache, ChunkCache())
    ahead._active, ahead._active_counted_at = 4, time.monotonic()  # 2 MiB stretches
    reader = RangeReader(store, cache, in_flight=ahead.in_flight)
    fetched = entries[2][:2]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ahead.run)
            before = gets(store)
            ahead.note_fetch(topic, 2, fetched, high_watermark=1000)
            got = await reader.read_many(
                [(e.object_key, e.start, e.start + e.length) for e in fetched]
            )
            tg.cancel_scope.cancel()
        assert [bytes(b) for b in got] == [DATA[e.start : e.start + e.length] for e in fetched]
        assert gets(store) - before == 1
        assert reader.stats["gets"] == 0 and reader.stats["waited_reads"] == 2
        assert ahead.stats["urgent_requests"] == 1 and ahead.stats["ranges"] == 1
    finally:
        await ahead.aclose()
        kv.close()


async def _small_objects(
    store: ObjectStore, tmp_path: Path, count: int
) -> tuple[SQLiteKV, keys.Subspace, bytes, list[bytes]]:
    """`count` ingest files of 64 KiB, each one entry of partition 0, in offset order."""
    sub = keys.cluster_subspace("read-ahead-batches")
    topic = b"t" * 16
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    bodies = [os.urandom(64 * 1024) for _ in range(count)]
    for i, body in enumerate(bodies):
        await store.put(f"small-{i}", body)

    def write(tr):  # type: ignore[no-untyped-def]
        for i, body in enumerate(bodies):
            put_object(tr, sub, f"small-{i}", ObjectRecord(len(body), 1, 0, None, 0))
            put_entry(
                tr, sub, topic, 0, ChunkEntry(f"small-{i}", 0, len(body), 10 * i, 10 * i + 9, 1, 0)
            )

    kv.transact_sync(write)
    return kv, sub, topic, bodies


def _count_hand_offs(ahead: ReadAhead) -> list[int]:
    """The pieces of each call read-ahead hands to its worker threads, as they come."""
    handed: list[int] = []
    run = ahead._threads.run

    async def counting(fn, *args):  # type: ignore[no-untyped-def]
        handed.append(len(args[0]) if args and isinstance(args[0], list) else 1)
        return await run(fn, *args)

    ahead._threads.run = counting  # type: ignore[method-assign]
    return handed


async def test_small_objects_of_a_stretch_are_read_by_one_worker_thread_in_a_row(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Whole objects (and plain ranges) are handed to a worker thread together, up to
    BATCH_PIECES at a time, instead of one hand-off each."""
    kv, sub, topic, bodies = await _small_objects(store, tmp_path, readahead.BATCH_PIECES + 2)
    ahead = ReadAhead(kv, sub, store, ObjectCache(64 * MiB), ChunkCache())
    handed = _count_hand_offs(ahead)
    try:
        before = gets(store)
        await ahead._read_stretch((topic, 0), 0, None)
        assert handed == [readahead.BATCH_PIECES, 2]
        assert gets(store) - before == len(bodies)
        assert ahead.stats["objects"] == len(bodies) and ahead.stats["level0_reads"] == len(bodies)
        assert ahead.stats["level0_bytes"] == sum(len(b) for b in bodies)
        for i, body in enumerate(bodies):
            assert bytes(ahead._cache.slice(f"small-{i}", 0, len(body)) or b"") == body
        assert not ahead._reading
    finally:
        await ahead.aclose()
        kv.close()


async def test_a_failed_read_in_a_batch_keeps_what_came_before_it_and_releases_the_rest(
    store: ObjectStore, tmp_path: Path
) -> None:
    kv, sub, topic, bodies = await _small_objects(store, tmp_path, 5)
    await store.delete("small-2")
    ahead = ReadAhead(kv, sub, store, ObjectCache(64 * MiB), ChunkCache())
    try:
        with pytest.raises(Exception, match="small-2"):
            await ahead._read_stretch((topic, 0), 0, None)
        assert "small-0" in ahead._cache and "small-1" in ahead._cache
        assert "small-3" not in ahead._cache and "small-4" not in ahead._cache
        assert not ahead._reading  # no Fetch waits for a read that will not come
    finally:
        await ahead.aclose()
        kv.close()


async def test_a_stretch_a_fetch_waits_for_is_read_piece_by_piece_until_it_has_its_bytes(
    store: ObjectStore, tmp_path: Path
) -> None:
    kv, sub, topic, bodies = await _small_objects(store, tmp_path, readahead.BATCH_PIECES + 2)
    ahead = ReadAhead(kv, sub, store, ObjectCache(64 * MiB), ChunkCache())
    handed = _count_hand_offs(ahead)
    request = readahead._Request((topic, 0), 0, urgent=True)
    waited = [ChunkEntry(f"small-{i}", 0, len(bodies[i]), 10 * i, 10 * i + 9, 1, 0) for i in (0, 1)]
    ahead._promise(request, waited)
    try:
        await ahead._read_stretch((topic, 0), 0, None, request)
        # The two pieces the Fetch waits for one by one, then the rest together.
        assert handed == [1, 1, readahead.BATCH_PIECES]
        assert not request.promised and not ahead._promised and not ahead._reading
    finally:
        await ahead.aclose()
        kv.close()
