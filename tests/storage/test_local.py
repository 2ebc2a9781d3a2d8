"""LocalObjectStore beyond the contract: other processes, crashes, key rules."""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

from storage import local
from storage.local import (
    DELETE_PAUSE_S,
    DELETE_PIECE,
    DIRECT_PIECE,
    MAP_MIN,
    SYNC_PIECE,
    TEMP_PREFIX,
    WRITE_PIECE,
    LocalObjectStore,
)
from storage.objectstore import ObjectNotFoundError, ObjectStoreError

RACE_KEYS = 200


def all_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


def temp_files(root: Path) -> list[Path]:
    return [path for path in all_files(root) if path.name.startswith(TEMP_PREFIX)]


# Waits for the go file, then tries to create every key; prints the keys it won.
RACER = textwrap.dedent(
    """
    import json, os, sys, time, anyio
    from storage.local import LocalObjectStore
    from storage.objectstore import ObjectExistsError

    root, go, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    async def main():
        store = LocalObjectStore(root)
        while not os.path.exists(go):
            time.sleep(0.001)
        won = []
        for i in range(count):
            key = f"race/{i:04d}"
            try:
                await store.put(key, name.encode() * 100, if_absent=True)
            except ObjectExistsError:
                continue
            won.append(key)
        print(json.dumps(won))

    anyio.run(main)
    """
)


def test_two_processes_race_if_absent(tmp_path: Path) -> None:
    root, go = tmp_path / "objects", tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(root), str(go), name, str(RACE_KEYS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("alpha", "bravo")
    ]
    time.sleep(0.5)  # let both import and reach the start line
    go.touch()
    won = []
    for racer in racers:
        out, _ = racer.communicate(timeout=60)
        assert racer.returncode == 0
        won.append(set(json.loads(out)))
    assert not won[0] & won[1], "a key was won by both processes"
    assert won[0] | won[1] == {f"race/{i:04d}" for i in range(RACE_KEYS)}

    async def check() -> None:
        store = LocalObjectStore(str(root))
        for name, keys in zip(("alpha", "bravo"), won, strict=True):
            for key in sorted(keys)[:20]:
                assert await store.get(key) == name.encode() * 100
        assert len(await store.list()) == RACE_KEYS

    anyio.run(check)
    assert not temp_files(root)


# Writes its temp file, then hangs in fsync, as if the machine stopped mid-put.
CRASHER = textwrap.dedent(
    """
    import os, stat, sys, time, anyio
    from storage.local import LocalObjectStore

    real_fsync = os.fsync

    def hang(fd):
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return real_fsync(fd)  # folders sync as usual
        print("writing", flush=True)
        time.sleep(600)

    os.fsync = hang
    anyio.run(LocalObjectStore(sys.argv[1]).put, "ingest/crashed", b"x" * 100_000)
    """
)


def test_killed_writer_leaves_nothing_visible(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    crasher = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert crasher.stdout is not None
        assert crasher.stdout.readline() == "writing\n"
        crasher.send_signal(signal.SIGKILL)
    finally:
        crasher.wait()
    temps = temp_files(root)
    assert len(temps) == 1, "the crashed writer's temp file is on disk"

    async def check() -> None:
        store = LocalObjectStore(str(root))
        assert await store.list() == []
        assert await store.list("ingest/") == []
        with pytest.raises(ObjectNotFoundError):
            await store.get("ingest/crashed")
        await store.put("ingest/crashed", b"retried", if_absent=True)
        assert [info.key for info in await store.list()] == ["ingest/crashed"]

        assert await store.remove_stale_temp_files(older_than=3600) == 0, "too young to go"
        old = time.time() - 7200
        os.utime(temps[0], (old, old))
        assert await store.remove_stale_temp_files(older_than=3600) == 1
        assert await store.get("ingest/crashed") == b"retried"

    anyio.run(check)
    assert temp_files(root) == []


async def test_failed_put_removes_its_temp_file(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(ObjectStoreError, match="No space left"):
        await local_store.put("k", b"data")
    assert all_files(Path(local_store.root)) == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/", f"a/{TEMP_PREFIX}x"])
async def test_bad_keys_are_rejected(local_store: LocalObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        await local_store.put(key, b"x")
    with pytest.raises(ValueError):
        await local_store.get(key)


async def test_folder_is_not_an_object(local_store: LocalObjectStore) -> None:
    await local_store.put("a/b", b"x")
    with pytest.raises(ObjectNotFoundError):
        await local_store.get("a")


async def test_objects_are_files_under_root(local_store: LocalObjectStore) -> None:
    await local_store.put("ingest/01ABC", b"payload", if_absent=True)
    path = Path(local_store.root) / "ingest" / "01ABC"
    assert path.read_bytes() == b"payload"
    assert path.stat().st_nlink == 1, "the temp link is gone"


async def test_large_objects_are_written_in_pieces(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put never hands the kernel more than WRITE_PIECE bytes in one writev(), and a
    write that takes less than it was given is continued where it stopped, inside one of
    the parts or between two."""
    sizes: list[int] = []
    real_writev = os.writev

    def recording_writev(fd: int, buffers: list[memoryview]) -> int:
        sizes.append(sum(len(b) for b in buffers))
        # Every third write takes only part of what it is given, as a short write may.
        if len(sizes) % 3 == 0:
            return real_writev(fd, [b"".join(buffers)[: sizes[-1] // 2 + 1]])
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", recording_writev)
    data = os.urandom(3 * WRITE_PIECE + 12345)
    await local_store.put("ingest/large", data, if_absent=True)
    parts = [os.urandom(n) for n in (WRITE_PIECE // 3, WRITE_PIECE, 5, WRITE_PIECE + 7)]
    await anyio.to_thread.run_sync(
        lambda: local_store.put_parts_sync("ingest/parts", parts, if_absent=True)
    )
    monkeypatch.undo()
    assert sizes and max(sizes) <= WRITE_PIECE, sizes
    assert sum(1 for size in sizes if size == WRITE_PIECE) >= 3
    assert await local_store.get("ingest/large") == data
    assert await local_store.get("ingest/parts") == b"".join(parts)


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_large_objects_are_written_no_faster_than_the_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """With large_write_bytes_per_s, each piece of a large object waits until the pieces
    before it had their time at that rate, written buffered or direct; small objects,
    and a store without the setting, never wait. (The store's clock here moves only
    when it sleeps; other threads of the process keep the real clock and sleep.)"""
    clock = [0.0]
    slept: list[float] = []
    here = threading.get_ident()
    real_sleep, real_monotonic = time.sleep, time.monotonic

    def sleep(seconds: float) -> None:
        if threading.get_ident() != here:
            return real_sleep(seconds)
        slept.append(seconds)
        clock[0] += seconds

    def monotonic() -> float:
        return clock[0] if threading.get_ident() == here else real_monotonic()

    monkeypatch.setattr(local.time, "monotonic", monotonic)
    monkeypatch.setattr(local.time, "sleep", sleep)
    piece, pieces = (DIRECT_PIECE, 16) if direct else (WRITE_PIECE, 8)  # over SYNC_PIECE
    rate = 4 * piece  # bytes per second: four pieces a second
    paced = LocalObjectStore(
        str(tmp_path / "paced"), large_write_bytes_per_s=rate, large_io_direct=direct
    )
    data = os.urandom(pieces * piece)
    paced.put_sync("compacted/large", data, if_absent=True)
    assert slept == [0.25] * (pieces - 1), "each piece a quarter of a second after the one before"
    assert paced.get_sync("compacted/large") == data

    slept.clear()
    paced.put_sync("ingest/small", os.urandom(SYNC_PIECE), if_absent=True)
    unpaced = LocalObjectStore(str(tmp_path / "unpaced"), large_io_direct=direct)
    unpaced.put_sync("compacted/large", data, if_absent=True)
    monkeypatch.undo()
    assert slept == []


@pytest.mark.parametrize(
    "size",
    [SYNC_PIECE + 4096, 3 * WRITE_PIECE, 3 * WRITE_PIECE + 12345, SYNC_PIECE + 1],
)
def test_large_objects_can_be_written_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """With large_io_direct, a large object is written through an O_DIRECT and O_DSYNC
    descriptor, in aligned pieces of DIRECT_PIECE at most (the last padded, the file cut
    back to the object's size); small objects, and a store without the setting, are
    written buffered."""
    opened: list[tuple[str, bool]] = []
    written: list[tuple[int, int]] = []  # (offset, length) of each direct write
    real_open, real_pwrite = os.open, os.pwrite

    def recording_open(path: str, flags: int, *args: int) -> int:
        if flags & os.O_CREAT:
            direct = flags & os.O_DIRECT and flags & os.O_DSYNC
            opened.append((os.path.basename(path), bool(direct)))
        return real_open(path, flags, *args)

    def recording_pwrite(fd: int, data: memoryview, offset: int) -> int:
        written.append((offset, len(data)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "pwrite", recording_pwrite)
    direct = LocalObjectStore(str(tmp_path / "direct"), large_io_direct=True)
    data = os.urandom(size)
    direct.put_sync("compacted/large", data, if_absent=True)
    direct.put_sync("ingest/small", b"small", if_absent=True)
    buffered = LocalObjectStore(str(tmp_path / "buffered"))
    buffered.put_sync("compacted/large", data, if_absent=True)
    monkeypatch.undo()
    assert [flag for _name, flag in opened] == [True, False, False], opened
    assert written and all(
        offset % local.DIRECT_ALIGN == 0
        and length % local.DIRECT_ALIGN == 0
        and length <= DIRECT_PIECE
        for offset, length in written
    ), written
    assert sum(length for _offset, length in written) == -(-size // 4096) * 4096
    path = tmp_path / "direct" / "compacted" / "large"
    assert path.stat().st_size == size
    assert direct.get_sync("compacted/large") == data
    assert direct.get_sync("ingest/small") == b"small"
    assert temp_files(tmp_path) == []


def test_direct_writes_fall_back_where_the_file_system_refuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that answers O_DIRECT with EINVAL (as tmpfs did before Linux 6.6)
    gets the object written buffered, whole."""
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            real_open(path, flags & ~os.O_DIRECT, *args)  # created, as tmpfs did
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    store = LocalObjectStore(str(tmp_path), large_io_direct=True)
    data = os.urandom(3 * WRITE_PIECE + 7)
    store.put_sync("compacted/large", data, if_absent=True)
    monkeypatch.undo()
    assert store.get_sync("compacted/large") == data
    assert temp_files(tmp_path) == []


def _recording_truncates(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = os.ftruncate

    def ftruncate(fd: int, size: int) -> None:
        sizes.append(size)
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    return sizes


async def test_a_large_object_is_freed_a_piece_at_a_time(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted object over DELETE_PIECE is gone by name at once, and its blocks are
    given back DELETE_PIECE at a time (one ftruncate each, from its end), DELETE_PAUSE_S
    after the one before; a small one is only unlinked."""
    size = 3 * DELETE_PIECE + 12345
    await local_store.put("compacted/large", os.urandom(size), if_absent=True)
    await local_store.put("ingest/small", os.urandom(DELETE_PIECE), if_absent=True)
    sizes = _recording_truncates(monkeypatch)
    pauses: list[tuple[int, float]] = []  # (pieces freed before it, seconds)
    monkeypatch.setattr(local.time, "sleep", lambda seconds: pauses.append((len(sizes), seconds)))
    await local_store.delete("compacted/large")
    assert sizes == [size - DELETE_PIECE, size - 2 * DELETE_PIECE, size - 3 * DELETE_PIECE]
    assert pauses == [(1, DELETE_PAUSE_S), (2, DELETE_PAUSE_S), (3, DELETE_PAUSE_S)]
    sizes.clear()
    pauses.clear()
    await local_store.delete("ingest/small")
    await local_store.delete("ingest/small")  # idempotent
    assert sizes == [] and pauses == []
    assert all_files(Path(local_store.root)) == []
    for key in ("compacted/large", "ingest/small"):
        with pytest.raises(ObjectNotFoundError):
            await local_store.get(key)


async def test_an_open_range_stream_reads_a_deleted_large_object_whole(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range stream opened before the delete reads every byte after it: the object is
    unlinked, never truncated under the stream."""
    data = os.urandom(2 * DELETE_PIECE + 777)
    await local_store.put("compacted/large", data, if_absent=True)
    stream = local_store.open_range_stream("compacted/large", 5)
    try:
        sizes = _recording_truncates(monkeypatch)
        await local_store.delete("compacted/large")
        assert sizes == []
        assert all_files(Path(local_store.root)) == []
        assert stream.read(len(data)) == data[5:]
    finally:
        stream.close()


async def test_a_large_object_being_deleted_is_not_found_by_a_new_stream(
    local_store: LocalObjectStore,
) -> None:
    """A stream that opens the file while a delete holds it (its exclusive lock, taken
    before the pieces are freed) is told the object is gone, not given a shrinking file."""
    await local_store.put("compacted/large", os.urandom(DELETE_PIECE + 1), if_absent=True)
    fd = os.open(Path(local_store.root) / "compacted" / "large", os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ObjectNotFoundError, match="being deleted"):
            local_store.open_range_stream("compacted/large", 0)
    finally:
        os.close(fd)
    stream = local_store.open_range_stream("compacted/large", 0)
    stream.close()


async def test_a_read_of_an_object_freed_under_it_is_not_found(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get whose file shrinks while it reads (a delete freeing it) answers that the
    object is gone rather than returning fewer bytes than the range."""
    await local_store.put("compacted/large", os.urandom(1000), if_absent=True)
    real = os.pread

    def shrinking(fd: int, n: int, offset: int) -> bytes:
        return real(fd, min(n, 100), offset) if offset < 100 else b""

    monkeypatch.setattr(os, "pread", shrinking)
    with pytest.raises(ObjectNotFoundError, match="deleted while read"):
        await local_store.get("compacted/large", 0, 1000)


async def test_a_large_view_is_the_file_mapped_and_a_small_one_a_copy(
    local_store: LocalObjectStore,
) -> None:
    """A range of MAP_MIN bytes or more comes back as a view of the mapped file (no copy
    into memory), counted among the mappings until its last view is gone; a smaller
    range is read as before."""
    data = os.urandom(MAP_MIN * 3 + 99)
    await local_store.put("ingest/a", data, if_absent=True)
    small = await local_store.get_view("ingest/a", 10, 10 + MAP_MIN - 1)
    assert isinstance(small.obj, bytes)
    assert local_store.mappings.alive == 0
    large = await local_store.get_view("ingest/a", 4099, 4099 + MAP_MIN)
    assert isinstance(large.obj, mmap.mmap)
    assert large == data[4099 : 4099 + MAP_MIN]
    assert local_store.mappings.alive == 1
    piece = large[10:20]
    del large
    assert local_store.mappings.alive == 1  # a slice keeps the mapping
    assert piece == data[4109:4119]
    del piece
    assert _mappings_end(local_store)


def _mappings_end(store: LocalObjectStore) -> bool:
    """Whether every mapping is given back within a second (the worker thread that
    made one drops its own reference to the call once it got the GIL again)."""
    deadline = time.monotonic() + 1
    while store.mappings.alive and time.monotonic() < deadline:
        time.sleep(0.001)
    return store.mappings.alive == 0


async def test_mappings_are_bounded_and_reads_past_the_bound_are_copies(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path / "objects"), max_mappings=1)
    data = os.urandom(MAP_MIN * 2)
    await store.put("ingest/a", data, if_absent=True)
    first = await store.get_view("ingest/a")
    second = await store.get_view("ingest/a")
    assert isinstance(first.obj, mmap.mmap) and isinstance(second.obj, bytes)
    assert first == second == data
    del first
    assert _mappings_end(store)  # second is a copy: first was the one mapping
    third = await store.get_view("ingest/a")
    assert isinstance(third.obj, mmap.mmap)


async def test_a_mapped_view_keeps_a_deleted_object_whole(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view's mapping holds the file's shared lock as a range stream does: a delete
    only unlinks the file, never frees its pieces under the view (which would end the
    process with SIGBUS at the next touch). The same for a stream's mapped read."""
    data = os.urandom(2 * DELETE_PIECE + 777)
    await local_store.put("compacted/large", data, if_absent=True)
    stream = local_store.open_range_stream("compacted/large", 5)
    streamed = stream.read(DELETE_PIECE)
    stream.close()  # its mapping holds the file on its own
    view = await local_store.get_view("compacted/large", 3, None)
    assert isinstance(view.obj, mmap.mmap) and isinstance(streamed.obj, mmap.mmap)
    sizes = _recording_truncates(monkeypatch)
    await local_store.delete("compacted/large")
    assert sizes == []
    assert all_files(Path(local_store.root)) == []
    assert view == data[3:]
    assert streamed == data[5 : 5 + DELETE_PIECE]


async def test_a_view_of_an_object_being_deleted_is_not_found(
    local_store: LocalObjectStore,
) -> None:
    await local_store.put("compacted/large", os.urandom(DELETE_PIECE + 1), if_absent=True)
    fd = os.open(Path(local_store.root) / "compacted" / "large", os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ObjectNotFoundError, match="being deleted"):
            await local_store.get_view("compacted/large", 0, MAP_MIN)
    finally:
        os.close(fd)
    assert local_store.mappings.alive == 0


async def test_a_kernel_that_cannot_populate_a_mapping_gets_copies(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """madvise answers EINVAL for advice the kernel does not know (MADV_POPULATE_READ
    before Linux 5.14): the read is a copy, and no mapping is tried again."""
    monkeypatch.setattr(local, "MADV_POPULATE_READ", 0x7FFF)
    data = os.urandom(MAP_MIN)
    await local_store.put("ingest/a", data, if_absent=True)
    view = await local_store.get_view("ingest/a")
    assert isinstance(view.obj, bytes) and view == data
    assert not local_store.mappings.works and local_store.mappings.alive == 0


def test_an_object_put_in_parts_is_written_as_they_are(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts go to the file through writev, never joined (each call at most
    WRITE_PIECE bytes)."""
    calls: list[int] = []  # bytes each writev was given
    given: list[object] = []  # what each buffer given is a view of
    real_writev = os.writev

    def recording_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(sum(len(b) for b in buffers))
        given.extend(b.obj for b in buffers)
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", recording_writev)
    parts = [os.urandom(300_000) for _ in range(10)]
    local_store.put_parts_sync("ingest/large", parts, if_absent=True)
    assert calls == [WRITE_PIECE, WRITE_PIECE, 3_000_000 - 2 * WRITE_PIECE]
    assert all(any(obj is part for part in parts) for obj in given)  # the parts themselves
    assert local_store.get_sync("ingest/large") == b"".join(parts)


def test_a_direct_write_of_parts_is_their_bytes(tmp_path: Path) -> None:
    """An object written with O_DIRECT from parts (compaction's outputs): the parts,
    crossing the aligned buffer's edges, land whole and in order."""
    store = LocalObjectStore(str(tmp_path / "direct"), large_io_direct=True)
    parts = [os.urandom(n) for n in (5, DIRECT_PIECE - 3, 7, 5 * DIRECT_PIECE + 1, 4096, 1)]
    store.put_parts_sync("compacted/large", parts, if_absent=True)
    assert store.get_sync("compacted/large") == b"".join(parts)


def _takes_direct_io(folder: Path) -> bool:
    try:
        os.close(os.open(folder / "probe", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


def test_large_ranges_are_read_direct_a_piece_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With large_io_direct, a range of MAP_MIN bytes or more is read through an O_DIRECT
    descriptor in aligned reads of DIRECT_PIECE at most, and is the range's bytes from
    any start to any end; without the setting such a range is mapped, not read; a
    smaller range is read as before."""
    if not _takes_direct_io(tmp_path):
        pytest.skip(f"the file system under {tmp_path} refuses O_DIRECT")
    data = os.urandom(MAP_MIN + 3 * DIRECT_PIECE + 12345)
    direct = LocalObjectStore(str(tmp_path / "direct"), large_io_direct=True)
    direct.put_sync("compacted/large", data, if_absent=True)
    plain = LocalObjectStore(str(tmp_path / "plain"))
    plain.put_sync("compacted/large", data, if_absent=True)
    reads: list[tuple[int, int, bool]] = []  # (offset, length, O_DIRECT) of each preadv
    real_preadv = os.preadv

    def recording_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        is_direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        reads.append((offset, sum(len(b) for b in buffers), is_direct))
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", recording_preadv)
    for start, end in [(0, None), (4097, len(data) - 3), (1, MAP_MIN + 1)]:
        reads.clear()
        view = direct.get_view_sync("compacted/large", start, end)
        assert bytes(view) == data[start:end]
        assert reads and all(
            is_direct and offset % local.DIRECT_ALIGN == 0 and length <= DIRECT_PIECE
            for offset, length, is_direct in reads
        ), reads
    reads.clear()
    assert bytes(plain.get_view_sync("compacted/large", 5)) == data[5:]
    small = direct.get_view_sync("compacted/large", 5, 5 + MAP_MIN - 1)
    assert bytes(small) == data[5 : 5 + MAP_MIN - 1]
    assert reads == []


def test_direct_reads_fall_back_where_the_file_system_refuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where O_DIRECT cannot be set on the open file (EINVAL), a large range is still
    the range's bytes (mapped)."""
    data = os.urandom(MAP_MIN + 4097)
    store = LocalObjectStore(str(tmp_path), large_io_direct=True)
    store.put_sync("compacted/large", data, if_absent=True)
    real_fcntl = fcntl.fcntl
    refused: list[int] = []

    def refusing_fcntl(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refusing_fcntl)
    assert bytes(store.get_view_sync("compacted/large", 3)) == data[3:]
    assert refused
