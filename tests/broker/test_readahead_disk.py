"""An object of many partitions that a catch-up read wants for several of them is read
whole once into the disk cache (storage.disk_cache), and every partition's range of it
after comes from there: on the local store and on S3 (moto)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from broker.cli import build_parser, config_from_args
from broker.readahead import ReadAhead, _Front
from metadata import keys
from metadata.chunk_cache import ChunkCache
from metadata.compaction import L1, L2
from metadata.lifecycle import ObjectRecord, put_object
from metadata.log import ChunkEntry, put_entry
from metadata.sqlite_kv import SQLiteKV
from storage import disk_cache
from storage.cache import ObjectCache, RangeReader
from storage.disk_cache import DiskCache, temporary_path
from storage.objectstore import ObjectStore
from tests.storage.conftest import make_store

MiB = 1024 * 1024
PARTITIONS = 6
SIZE = PARTITIONS * MiB
DATA = os.urandom(SIZE)
TOPIC = b"t" * 16


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    made = make_store(request.param, request, tmp_path)
    await made.put("big", DATA)
    yield made
    await made.aclose()


def gets(store: ObjectStore) -> int:
    return store.stats["gets"]  # type: ignore[attr-defined]


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[tuple[SQLiteKV, keys.Subspace]]:
    """ "big" at `level`: partition p's bytes at [p MiB, p+1 MiB), offsets 0-9."""
    made = SQLiteKV(str(tmp_path / "meta.db"))
    sub = keys.cluster_subspace("read-ahead-disk")
    yield made, sub
    made.close()


def write_object(kv: SQLiteKV, sub: keys.Subspace, level: int) -> None:
    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "big", ObjectRecord(SIZE, PARTITIONS, 0, None, level))
        for p in range(PARTITIONS):
            put_entry(tr, sub, TOPIC, p, ChunkEntry("big", p * MiB, MiB, 0, 9, 1, 0))

    kv.transact_sync(write)


def read_ahead(
    kv: SQLiteKV, sub: keys.Subspace, store: ObjectStore, disk: DiskCache, reading: range
) -> ReadAhead:
    """2 MiB stretches (the 6 MiB object is larger), with `reading` read ahead lately and
    not yet past the object."""
    ahead = ReadAhead(kv, sub, store, ObjectCache(24 * MiB), ChunkCache(), disk=disk)
    ahead._active, ahead._active_counted_at = 4, time.monotonic()
    for p in reading:
        ahead._fronts[(TOPIC, p)] = _Front(seen=time.monotonic())
    return ahead


def cached(ahead: ReadAhead, p: int) -> bytes:
    return bytes(ahead._cache.slice("big", p * MiB, (p + 1) * MiB) or b"")


@pytest.fixture
async def caught_up(
    store: ObjectStore, kv: tuple[SQLiteKV, keys.Subspace], tmp_path: Path
) -> AsyncIterator[tuple[ReadAhead, DiskCache]]:
    """ "big" at level 1, all of its partitions read ahead lately, a 64 MiB disk cache."""
    write_object(*kv, L1)
    disk = DiskCache(str(tmp_path / "disk"), 64 * MiB)
    ahead = read_ahead(*kv, store, disk, range(PARTITIONS))
    yield ahead, disk
    await ahead.aclose()


async def test_an_object_several_partitions_read_is_got_once_for_them_all(
    store: ObjectStore, caught_up: tuple[ReadAhead, DiskCache]
) -> None:
    ahead, disk = caught_up
    before = gets(store)
    await ahead._read_stretch((TOPIC, 2), 0, None)
    assert gets(store) - before == 1
    assert "big" in disk and disk.held_bytes == SIZE
    assert ahead.stats["disk_fills"] == 1 and ahead.stats["disk_fill_bytes"] == SIZE
    assert ahead.stats["level1_reads"] == 1 and ahead.stats["level1_bytes"] == MiB
    assert cached(ahead, 2) == DATA[2 * MiB : 3 * MiB]
    # The other partitions' stretches read the disk, not the store.
    for p in (3, 0):
        await ahead._read_stretch((TOPIC, p), 0, None)
        assert cached(ahead, p) == DATA[p * MiB : (p + 1) * MiB]
    assert gets(store) - before == 1
    assert ahead.stats["disk_reads"] == 2 and ahead.stats["level1_reads"] == 1
    assert ahead.stats["level1_bytes"] == 3 * MiB
    # So does a Fetch's own read of bytes no longer (or never) cached.
    reader = RangeReader(store, ObjectCache(24 * MiB), disk=disk)
    assert await reader.read("big", 4 * MiB + 5, 5 * MiB) == DATA[4 * MiB + 5 : 5 * MiB]
    assert gets(store) - before == 1 and reader.stats["disk_reads"] == 1


async def test_two_stretches_at_once_get_the_object_once(
    store: ObjectStore, caught_up: tuple[ReadAhead, DiskCache]
) -> None:
    ahead, disk = caught_up
    before = gets(store)
    async with anyio.create_task_group() as tg:
        for p in range(PARTITIONS):
            tg.start_soon(ahead._read_stretch, (TOPIC, p), 0, None)
    assert gets(store) - before == 1
    for p in range(PARTITIONS):
        assert cached(ahead, p) == DATA[p * MiB : (p + 1) * MiB]
    assert ahead.stats["disk_fills"] == 1 and ahead.stats["disk_reads"] == PARTITIONS - 1
    assert not ahead._filling and not ahead._reading


async def test_an_object_mostly_of_partitions_not_being_read_is_read_as_a_range(
    store: ObjectStore, kv: tuple[SQLiteKV, keys.Subspace], tmp_path: Path
) -> None:
    """One partition of six read (a consumer of one partition), or others read but
    already past the object: a share under a quarter, so only the partition's range."""
    write_object(*kv, L1)
    disk = DiskCache(str(tmp_path / "disk"), 64 * MiB)
    ahead = read_ahead(*kv, store, disk, range(2, 3))
    past = _Front(next_offset=10, seen=time.monotonic())  # offsets 0-9 read ahead already
    for p in (0, 1, 3, 4, 5):
        ahead._fronts[(TOPIC, p)] = past
    try:
        before = gets(store)
        await ahead._read_stretch((TOPIC, 2), 0, None)
        assert gets(store) - before == 1 and "big" not in disk
        assert ahead.stats["disk_fills"] == 0 and ahead.stats["ranges"] == 1
        assert cached(ahead, 2) == DATA[2 * MiB : 3 * MiB]
    finally:
        await ahead.aclose()


async def test_a_level_two_object_of_several_partitions_is_filled_one_of_one_streamed(
    store: ObjectStore, kv: tuple[SQLiteKV, keys.Subspace], tmp_path: Path
) -> None:
    """A level-2 object holding the runs of several partitions read at once is read whole
    as an ingest file is; one holding a single partition's run is read through a stream
    (the disk would only add a copy)."""
    write_object(*kv, L2)
    disk = DiskCache(str(tmp_path / "disk"), 64 * MiB)
    ahead = read_ahead(*kv, store, disk, range(PARTITIONS))
    try:
        before = gets(store)
        await ahead._read_stretch((TOPIC, 2), 0, None)
        await ahead._read_stretch((TOPIC, 3), 0, None)
        assert gets(store) - before == 1 and "big" in disk
        assert ahead.stats["disk_fills"] == 1 and ahead.stats["streams_opened"] == 0
    finally:
        await ahead.aclose()
    kv_, _sub = kv
    sub = keys.cluster_subspace("read-ahead-disk-one-run")

    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "big", ObjectRecord(SIZE, 6, 0, None, L2))
        for i in range(6):
            put_entry(tr, sub, TOPIC, 0, ChunkEntry("big", i * MiB, MiB, 10 * i, 10 * i + 9, 1, 0))

    kv_.transact_sync(write)
    ahead = read_ahead(kv_, sub, store, DiskCache(str(tmp_path / "disk2"), 64 * MiB), range(1))
    try:
        await ahead._read_stretch((TOPIC, 0), 0, None)
        assert ahead.stats["disk_fills"] == 0 and ahead.stats["streams_opened"] == 1
    finally:
        await ahead.aclose()


async def test_without_a_disk_cache_each_partition_gets_its_range(
    store: ObjectStore, kv: tuple[SQLiteKV, keys.Subspace]
) -> None:
    write_object(*kv, L1)
    plain = ReadAhead(kv[0], kv[1], store, ObjectCache(24 * MiB), ChunkCache())
    plain._active, plain._active_counted_at = 4, time.monotonic()
    try:
        before = gets(store)
        for p in range(3):
            plain._fronts[(TOPIC, p)] = _Front(seen=time.monotonic())
            await plain._read_stretch((TOPIC, p), 0, None)
        assert gets(store) - before == 3 and plain.stats["disk_fills"] == 0
    finally:
        await plain.aclose()


def test_the_disk_cache_is_bounded_least_recently_read_out(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    folder.mkdir()
    (folder / "keep.txt").write_bytes(b"not the cache's")
    (folder / ("ab" * 20)).write_bytes(b"a file of a run before")
    disk = DiskCache(str(folder), 80)
    assert sorted(os.listdir(folder)) == ["keep.txt"], "only its own files are removed"
    assert disk.fits(10) and not disk.fits(11) and not disk.fits(0)  # an eighth at most
    for name in "abcdefgh":
        disk.put(name, name.encode() * 10)
    assert disk.held_bytes == 80
    assert disk.read("a", 2, 5) == b"aaa"  # read: now the most recent
    disk.put("i", b"i" * 10)
    assert "b" not in disk and "a" in disk and disk.held_bytes == 80
    assert disk.read("b", 0, 1) is None
    assert disk.stats["objects_evicted"] == 1 and disk.stats["objects_kept"] == 9
    disk.put("big", b"x" * 11)  # too large to keep
    assert "big" not in disk
    disk.discard("a")
    assert "a" not in disk and disk.held_bytes == 70
    assert len([n for n in os.listdir(folder) if n != "keep.txt"]) == 7


def test_released_objects_make_room_first_the_first_released_first(tmp_path: Path) -> None:
    disk = DiskCache(str(tmp_path / "disk"), 80)
    for name in "abcdefgh":
        disk.put(name, name.encode() * 10)
    disk.release("f")
    disk.release("c")
    disk.release("e")
    assert disk.read("e", 0, 2) == b"ee"  # read again: kept as any other
    disk.put("i", b"i" * 10)
    assert "f" not in disk and "a" in disk and "c" in disk
    disk.put("j", b"j" * 10)
    assert "c" not in disk and "a" in disk and "e" in disk
    disk.put("k", b"k" * 10)  # none released left: the least recently read
    assert "a" not in disk and "e" in disk
    disk.release("b")
    disk.discard("b")  # released, then deleted: no longer in line
    disk.put("l", b"l" * 10)
    assert disk.held_bytes == 80 and "d" in disk
    disk.put("m", b"m" * 10)
    assert "d" not in disk and disk.held_bytes == 80
    assert disk.stats["objects_released"] == 4 and disk.stats["released_evicted"] == 2
    assert disk.stats["objects_evicted"] == 4


async def test_an_object_every_partition_read_past_is_released_from_the_disk(
    store: ObjectStore, caught_up: tuple[ReadAhead, DiskCache]
) -> None:
    """Kept for the partitions still to come; released once the last one read past it."""
    ahead, disk = caught_up
    for p in range(PARTITIONS - 1):
        await ahead._read_stretch((TOPIC, p), 0, ahead._fronts[(TOPIC, p)])
        assert ahead._fronts[(TOPIC, p)].next_offset == 10  # past the object
        assert disk.stats["objects_released"] == 0, f"partition {PARTITIONS - 1} still to come"
    # The last partition's stretch takes it past the object too.
    last = (TOPIC, PARTITIONS - 1)
    await ahead._read_stretch(last, 0, ahead._fronts[last])
    assert disk.stats["objects_released"] == 1 and "big" in disk
    assert list(disk._released) == ["big"]
    # A partition read ahead lately that is not past it keeps it wanted.
    disk.read("big", 0, 1)  # read again: no longer released
    ahead._fronts[(TOPIC, 3)].next_offset = 5
    ahead._release_passed(disk, ["big"])
    assert not disk._released
    # One no longer read ahead lately does not.
    ahead._fronts[(TOPIC, 3)].seen -= 60
    ahead._release_passed(disk, ["big"])
    assert list(disk._released) == ["big"]


def test_the_disk_cache_defaults_by_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BUCKETLOG_DISK_CACHE_BYTES", raising=False)

    def config_of(*argv: str):  # type: ignore[no-untyped-def]
        return config_from_args(build_parser().parse_args(["serve", *argv]))

    assert config_of().resolved_disk_cache_bytes == 0
    on_s3 = config_of("--storage", "s3://bucket/p", "--data-dir", str(tmp_path / "not-yet"))
    seen = []

    def usage(path: str) -> SimpleNamespace:
        seen.append(path)
        return SimpleNamespace(free=free)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    free = 99 * 1024**3
    assert on_s3.resolved_disk_cache_bytes == 4 * 1024**3
    free = 2 * 1024**3  # a quarter of the room left on the disk, if less
    assert on_s3.resolved_disk_cache_bytes == 1024**3 // 2
    assert seen == [str(tmp_path)] * 2, "the nearest folder that exists"
    on_disk = config_of("--disk-cache-bytes", "1000", "--disk-cache-dir", "/somewhere")
    assert on_disk.resolved_disk_cache_bytes == 1000
    assert on_disk.resolved_disk_cache_dir == "/somewhere/agent-9092"
    assert config_of("--data-dir", "/d").resolved_disk_cache_dir == "/d/disk-cache/agent-9092"
    # The agents of --agents N: a folder each.
    second = config_of("--data-dir", "/d").with_port(9093)
    assert second.resolved_disk_cache_dir == "/d/disk-cache/agent-9093"
    with pytest.raises(SystemExit):
        config_of("--disk-cache-bytes", "-1")


async def test_a_store_without_streams_fills_with_one_whole_get(
    store: ObjectStore, caught_up: tuple[ReadAhead, DiskCache]
) -> None:
    ahead, _disk = caught_up
    ahead._open_stream = None
    before = gets(store)
    for p in (5, 1):
        await ahead._read_stretch((TOPIC, p), 0, None)
        assert cached(ahead, p) == DATA[p * MiB : (p + 1) * MiB]
    assert gets(store) - before == 1 and ahead.stats["disk_fills"] == 1


def test_a_fill_cut_short_keeps_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    disk = DiskCache(str(folder), 80)
    disk.fill("short", 10, iter((b"abc", b"de")))  # counted, not raised
    assert "short" not in disk and disk.held_bytes == 0 and os.listdir(folder) == []
    assert disk.stats["write_failures"] == 1
    disk.fill("whole", 10, iter((b"abcde", memoryview(b"fghij"))))
    assert disk.read("whole", 3, 7) == b"defg"


def test_a_file_written_for_the_disk_is_kept_only_whole_and_fitting(tmp_path: Path) -> None:
    """What a compaction job (a worker process too) GETs whole into the folder is kept
    once the agent adopts it: of its size and within an eighth of the bound, else
    deleted; and a kept object's file is where path_of says."""
    folder = tmp_path / "disk"
    disk = DiskCache(str(folder), 80)

    def written(key: str, data: bytes) -> str:
        path = temporary_path(disk.directory, key)
        Path(path).write_bytes(data)
        return path

    disk.adopt("whole", written("whole", b"abcdefghij"), 10)
    assert disk.read("whole", 2, 5) == b"cde" and disk.held_bytes == 10
    kept = disk.path_of("whole")
    assert kept is not None and Path(kept).read_bytes() == b"abcdefghij"
    disk.adopt("short", written("short", b"abcde"), 10)
    disk.adopt("large", written("large", b"x" * 11), 11)
    assert "short" not in disk and "large" not in disk and disk.path_of("short") is None
    assert sorted(os.listdir(folder)) == [os.path.basename(kept)]
    # A second copy of an object kept already leaves the first as it is.
    disk.adopt("whole", written("whole", b"abcdefghij"), 10)
    assert disk.held_bytes == 10 and len(os.listdir(folder)) == 1


def test_a_file_is_on_the_disk_before_it_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file is written out (fdatasync) before it is kept, so that the folder never
    holds more than a file's worth of dirty pages for the disk to take at once."""
    disk = DiskCache(str(tmp_path / "disk"), 80)
    synced: list[tuple[int, bool]] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append((os.fstat(fd).st_size, "whole" in disk))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    disk.fill("whole", 10, iter((b"abcde", b"fghij")))
    assert synced == [(10, False)] and disk.read("whole", 0, 10) == b"abcdefghij"


async def test_a_small_object_of_many_partitions_goes_to_the_disk_not_whole_into_memory(
    store: ObjectStore, kv: tuple[SQLiteKV, keys.Subspace], tmp_path: Path
) -> None:
    """An object no larger than the stretch, of several partitions read at once: the
    memory cache holds the partition's range, the disk the object (read whole once)."""
    kv_, _sub = kv
    sub = keys.cluster_subspace("read-ahead-disk-small")
    part = 100 * 1024
    await store.put("small", DATA[: PARTITIONS * part])

    def write(tr):  # type: ignore[no-untyped-def]
        put_object(tr, sub, "small", ObjectRecord(PARTITIONS * part, PARTITIONS, 0, None, L1))
        for p in range(PARTITIONS):
            put_entry(tr, sub, TOPIC, p, ChunkEntry("small", p * part, part, 0, 9, 1, 0))

    kv_.transact_sync(write)
    disk = DiskCache(str(tmp_path / "disk"), 64 * MiB)
    ahead = read_ahead(kv_, sub, store, disk, range(PARTITIONS))
    try:
        before = gets(store)
        for p in (1, 4):
            await ahead._read_stretch((TOPIC, p), 0, None)
            got = ahead._cache.slice("small", p * part, (p + 1) * part)
            assert bytes(got or b"") == DATA[p * part : (p + 1) * part]
        assert gets(store) - before == 1 and "small" in disk
        assert "small" not in ahead._cache and ahead._cache.total_bytes == 2 * part
        assert ahead.stats["disk_fills"] == 1 and ahead.stats["disk_reads"] == 1
    finally:
        await ahead.aclose()


async def test_a_disk_that_cannot_keep_the_object_leaves_the_range_read_as_before(
    store: ObjectStore,
    caught_up: tuple[ReadAhead, DiskCache],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ahead, disk = caught_up

    def full(f: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_cache, "written_out", full)
    for p in (2, 3):
        await ahead._read_stretch((TOPIC, p), 0, None)
        assert cached(ahead, p) == DATA[p * MiB : (p + 1) * MiB]
    assert disk.stats["write_failures"] == 2 and ahead.stats["failures"] == 0
    assert ahead.stats["disk_fills"] == 0 and ahead.stats["level1_reads"] == 2
    assert os.listdir(disk.directory) == []  # no file left half written
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "No space left" in warned[0].getMessage()
