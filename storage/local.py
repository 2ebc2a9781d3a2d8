"""A local folder as an object store: the embedded default.

Rules:
- A key maps to a file under the root; '/' in a key makes subfolders. Keys are
  relative, with no empty, '.', '..' or temp-named segments. Unlike S3, "a" and
  "a/b" cannot both be objects (a file cannot also be a folder).
- put writes a temp file next to its target, fsyncs it, then publishes it in one
  atomic step and fsyncs the folder, so a reader sees the whole object or nothing,
  and a returned put survives a power cut.
- put(if_absent=True) publishes with os.link, which fails if the name exists, so
  no other writer, in this process or another one sharing the folder, can replace
  an object once written. Plain put uses os.replace (last writer wins).
- delete unlinks without an fsync of the folder: a power cut can bring a deleted
  object back (bucketlog only deletes garbage, which the orphan sweep finds again).
  A large object's blocks are then freed a piece at a time, unless a range stream
  has it open (DELETE_PIECE below).
- Temp files start with TEMP_PREFIX; list() never shows them. A crashed writer can
  leave one behind; remove_stale_temp_files() sweeps those.
- get_view and range streams hand a range of MAP_MIN bytes or more out as a read-only
  view of the file mapped into memory: the page cache's own pages, not a copy. Each
  mapping holds a shared lock on its file (delete then only unlinks it, as for a range
  stream), and a file descriptor until its last view is gone, so at most `max_mappings`
  are alive; past that, and where the kernel cannot populate a mapping ahead, a range is
  read into memory as before. A store with `large_io_direct` (compaction's workers)
  reads such a range with O_DIRECT instead, a piece at a time (DIRECT_PIECE below).
- Blocking file I/O runs in at most max_concurrency worker threads (storage.threads).
- With `segments`, new_key gives small objects (the agent's flushes) a place in a segment
  file instead of a file of their own (storage.segments, its rules). Their keys are read,
  deleted and listed as any others', by every store on the same root, segments on or off.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import mmap
import os
import resource
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from storage.files import TEMP_PREFIX, fsync_dir
from storage.ingest import new_object_key
from storage.objectstore import (
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStoreError,
    new_stats,
    pacing,
)
from storage.segments import (
    SEGMENT_FOLDER,
    PackedRangeStream,
    SegmentFolder,
    SegmentWriter,
    is_packed_key,
)
from storage.threads import ThreadPool

# Objects are written in pieces of at most this size: one write() of 4 MiB took from
# 0.8 to 4 ms (a put of 4 MiB up to 13 ms with its fsync), the same bytes in 1 MiB
# pieces 0.8 ms every time (integration/bench/README.md, fifth pass; the kernel's reason
# was not looked into).
WRITE_PIECE = 1 << 20
# A large object (compaction's, the cleaner's) is flushed to the disk every SYNC_PIECE
# bytes as it is written, not all at its end. On ext4 an fsync commits the journal, and
# the commit waits for the data of every file whose blocks it allocates: a small flush's
# fsync issued while 64 MiB of another file sit dirty waits for all of them. On this
# machine's disk (ext4 on virtio, about 1 GB/s), a 100 KB write and fsync every 5 ms took
# p50 0.54 / p99 0.97 ms alone, 22 / 55 ms beside a writer of 64 MiB files fsync'd at
# their end, 1.7 / 16 ms when that writer fdatasync'd every MiB (and 3 / 16 ms every 2
# MiB, at 894 MB/s instead of 1,007 for the large writer).
SYNC_PIECE = 2 << 20
# A large object may also be written no faster than a given rate (`large_write_bytes_per_s`,
# set in compaction's worker processes by --compaction-write-bytes-per-s). Even synced
# every 2 MiB, a writer at the disk's full speed kept the small writer above at 14-16 ms
# p99; paced to 100 MB/s, 2.9 and 10.8 ms, to 200 MB/s 13.6-13.8 ms
# (integration/bench/fsync_beside.py, two rounds of 20 s each). A caller that must not
# wait (compaction fallen behind its inputs) puts inside `storage.objectstore.unpaced()`.

# A large object may be written with O_DIRECT (`large_io_direct`, set in compaction's
# worker processes): its bytes go from an aligned buffer to the disk, not through the
# page cache. The kernel's copy into the page cache was 47% of a worker's CPU (py-spy),
# and the dirty pages it left were what a flush's fsync waited behind: a 100 KB write and
# fsync beside a 64 MiB writer took p99 14.3-16.1 ms with buffered writes and 10.8-12.4
# ms with O_DIRECT ones (fsync_beside.py). The object is not in the page cache
# afterwards: whoever reads it next reads the disk. A file system that refuses O_DIRECT
# (tmpfs) gets buffered writes.
#
# Each direct write is O_DSYNC too, and DIRECT_PIECE long: done and durable before the
# next is issued, so that neither the disk's queue nor its write cache ever holds more
# than one piece of it, for a flush's write to queue behind or a flush's fdatasync (a
# cache flush: all the cache holds) to wait for. A 100 KB append and fdatasync every 5
# ms beside a writer of 64 MiB files, nothing deleted, took p50 / p99 19.16 / 27.89 and
# 14.74 / 27.04 ms with 1 MiB O_DIRECT writes, 8.76 / 11.86 and 9.46 / 17.46 with 256
# KiB ones, 5.91 / 12.01 and 7.10 / 14.85 with 1 MiB O_DSYNC ones, 2.46 / 8.91 and 2.45
# / 6.34 with 256 KiB O_DSYNC ones (alone 1.17 / 2.75 and 1.25 / 3.79); the writer went
# at 155-160 MB/s against 206-361 (integration/bench/fsync_beside.py --writer
# direct-dsync --piece-kib, results/2026-12-02-fsync-beside-dsync-pass33.json). With
# `large_io_direct`, a range of MAP_MIN bytes or more is read with O_DIRECT too,
# DIRECT_PIECE at a time, where a mapping's readahead would queue the whole range ahead
# of the flushes (as level 2 reads level-1 objects, which are not in the page cache).
DIRECT_ALIGN = 4096  # offset, length and buffer address of an O_DIRECT write
DIRECT_PIECE = 256 << 10
IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers one writev takes

# A deleted object over DELETE_PIECE bytes has its blocks freed DELETE_PIECE at a time
# (ftruncate, from its end) after its name is gone, not all at once by the unlink. On
# ext4 mounted with `discard` (as this machine's disk is) the blocks a journal commit
# frees are discarded in that commit, and every fsync waits for it: a 100 KB write and
# fsync every 5 ms took p99 18.0-21.1 ms beside a writer of 64 MiB O_DIRECT files that
# unlinked each one when done, 4.5-10.9 ms when each was then truncated in 4 MiB steps
# (integration/bench/fsync_beside.py --delete unlink --delete pieces, four rounds of
# 10 s each). Beside the O_DSYNC writer above, 4 MiB steps at once still cost the small
# writes' p99 most of what they gain (16.96 and 18.29 ms against 6.29 with nothing
# deleted): a step frees 1 MiB and the next waits DELETE_PAUSE_S, freeing at most 200
# MB/s per deleting thread (4.88 and 6.59 ms; 1 MiB steps 10 ms apart 6.87, 6.15 and
# 8.31; 4 MiB steps 40 ms apart 9.73 and 9.98; results/2026-12-02-fsync-beside-deletes-
# pass33.json and …-deletes-5ms-pass33.json). A range stream takes a shared lock (flock)
# on its file; a file so locked is only unlinked, so that the stream still reads every
# byte, and a stream that finds the file locked for deletion answers that the object is
# gone.
DELETE_PIECE = 1 << 20
DELETE_PAUSE_S = 0.005

# A range of MAP_MIN bytes or more that a reader asks for as a view (get_view, range
# streams) is mapped rather than read: read() copies the page cache into memory the
# kernel first has to zero for the copy. Reading a 40 MB file in the page cache took
# 0.53-0.64 s of system CPU per GB with pread and 0.05-0.06 mapped and populated; read
# and written to a socket, 1.02-1.19 s per GB against 0.46-0.59 (a 40 MB file 25 times,
# three rounds). The mapping is populated in the worker thread (MADV_POPULATE_READ,
# Linux 5.14; WILLNEED first, so that a file not in the page cache is read in large
# requests), so that the event loop's write of a view does not wait for the disk; a
# failure to read then is an error of the read, not a SIGBUS at the first touch.
# Smaller ranges are read: a buffer that size is soon reused by the allocator, not new
# memory to zero. Read and freed at once, with another thread busy, ranges of 440 KiB
# took 0.18 s of CPU per GB read and 0.20-0.21 mapped, 1 MiB 0.19 and 0.17, 16 MiB 0.23
# and 0.14; and each mapping holds a file descriptor while it is cached.
MAP_MIN = 1 << 20
MADV_POPULATE_READ = 22  # <linux/mman.h>; Python's mmap module does not name it

_T = TypeVar("_T")


class _Mappings:
    """Counts the mappings alive (each holds the duplicate of a file descriptor that
    Python's mmap keeps) against a limit; `works` goes false the first time the kernel
    refuses to populate one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.alive = 0
        self.works = True
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if not self.works or self.alive >= self.limit:
                return False
            self.alive += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.alive -= 1


def _default_max_mappings() -> int:
    """A quarter of the process's file descriptors, at most 4,096."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(0, min(4096, soft // 4))


class LocalObjectStore:
    """Objects as files under `root`; safe to share between processes on one host."""

    def __init__(
        self,
        root: str,
        *,
        max_concurrency: int = 16,
        large_write_bytes_per_s: float | None = None,
        large_io_direct: bool = False,
        max_mappings: int | None = None,
        segments: bool = False,
    ) -> None:
        self.root = os.path.abspath(root)
        # Objects over SYNC_PIECE are written no faster than this (None: at the disk's pace)
        # and, with large_io_direct, with O_DIRECT where the file system allows it (and
        # ranges of MAP_MIN bytes or more read so).
        self.large_write_bytes_per_s = large_write_bytes_per_s
        self.large_io_direct = large_io_direct
        os.makedirs(self.root, exist_ok=True)
        self._threads = ThreadPool(max_concurrency, "local store")
        self.mappings = _Mappings(_default_max_mappings() if max_mappings is None else max_mappings)
        self.stats = new_stats()
        self.segments = SegmentFolder(self.root)
        self._writer = SegmentWriter(self.segments) if segments else None

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root!r})"

    def new_key(self, prefix: str, size: int) -> str:
        """A fresh key for an object of `size` bytes, to be put once: with segments on, a
        place in this store's segment file for a small one."""
        if self._writer is not None:
            key = self._writer.reserve(prefix, size)
            if key is not None:
                return key
        return new_object_key(prefix)

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        await self._threads.run(partial(self.put_sync, key, data, if_absent=if_absent))

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self._put(key, [data], len(data), if_absent)

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        """put_sync of the parts' bytes in order, written as they are (writev, or into
        the O_DIRECT buffer) instead of joined first."""
        self._put(key, parts, sum(len(part) for part in parts), if_absent)

    def _put(
        self, key: str, parts: Sequence[bytes | memoryview], size: int, if_absent: bool
    ) -> None:
        self.stats["puts"] += 1
        if is_packed_key(key):
            if self._writer is None:
                raise ObjectStoreError(f"{key!r} names a place in a segment not reserved here")
            self._wrapped(partial(self._writer.write, key, parts, size))
            self.stats["bytes_put"] += size
            return
        path = self._path(key)
        self._wrapped(
            partial(
                _put_file,
                path,
                key,
                parts,
                size,
                if_absent,
                self.large_write_bytes_per_s if pacing() else None,
                self.large_io_direct,
            )
        )
        self.stats["bytes_put"] += size

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object; a negative start means the last -start bytes."""
        _check_range(start, end)
        self.stats["gets"] += 1
        if is_packed_key(key):
            data = await self._run(partial(self.segments.read, key, start, end))
        else:
            data = await self._run(partial(_read_file, self._path(key), key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    def get_sync(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        _check_range(start, end)
        self.stats["gets"] += 1
        if is_packed_key(key):
            data = self._wrapped(partial(self.segments.read, key, start, end))
        else:
            data = self._wrapped(partial(_read_file, self._path(key), key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """get() as a read-only view: of the file mapped into memory for a range of
        MAP_MIN bytes or more (see the module's rules)."""
        _check_range(start, end)
        self.stats["gets"] += 1
        data = await self._run(partial(self._view_file, key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        _check_range(start, end)
        self.stats["gets"] += 1
        data = self._wrapped(partial(self._view_file, key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    def _view_file(self, key: str, start: int, end: int | None) -> memoryview:
        if is_packed_key(key):  # a copy: a packed object is a flush, small
            return memoryview(self.segments.read(key, start, end))
        fd = _open_object(self._path(key), key)
        try:
            start, stop = _bounds(fd, key, start, end)
            if stop - start >= MAP_MIN and (self.large_io_direct or self.mappings.works):
                _lock_shared(fd, key)
                # A file being deleted loses pieces from its end (_delete_file) until
                # it is closed; with the lock held, none.
                if os.fstat(fd).st_size < stop:
                    raise ObjectNotFoundError(f"no such object: {key!r} (deleted while read)")
                view = _read_direct(fd, key, start, stop) if self.large_io_direct else None
                if view is None and self.mappings.works:
                    view = _map(self.mappings, fd, start, stop)
                if view is not None:
                    return view
            return memoryview(_read_range(fd, key, start, stop))
        finally:
            os.close(fd)  # a mapping keeps a duplicate, and with it the lock

    def open_range_stream(
        self, key: str, start: int, end: int | None = None
    ) -> _LocalRangeStream | PackedRangeStream:
        """The object from `start` on (to `end`, or its end), read in order as wanted
        (blocking)."""
        self.stats["gets"] += 1
        if is_packed_key(key):
            return self._wrapped(partial(self.segments.open_stream, key, start, end, self.stats))
        fd = _open_object(self._path(key), key)
        try:
            _lock_shared(fd, key)
        except BaseException:
            os.close(fd)
            raise
        return _LocalRangeStream(self, fd, start, end)

    async def delete(self, key: str) -> None:
        self.stats["deletes"] += 1
        if is_packed_key(key):
            await self._run(partial(self.segments.delete, key))
            return
        await self._run(partial(_delete_file, self._path(key)))

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        """Packed objects a segment at a time (SegmentFolder.delete_many), files one by
        one; all in one worker thread."""
        self.stats["deletes"] += len(keys)
        return await self._run(partial(self._delete_many_sync, builtins.list(keys)))

    def _delete_many_sync(self, keys: builtins.list[str]) -> dict[str, Exception]:
        packed: builtins.list[str] = []
        files: builtins.list[str] = []
        for key in dict.fromkeys(keys):
            (packed if is_packed_key(key) else files).append(key)
        failed = self.segments.delete_many(packed)
        for key in files:
            try:
                _delete_file(self._path(key))
            except Exception as exc:  # this key only: the next call tries it again
                failed[key] = exc
        return failed

    async def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        self.stats["lists"] += 1
        found = await self._run(partial(self._list_sync, prefix))
        return [info for info in found if info.key > start_after] if start_after else found

    def _list_sync(self, prefix: str) -> builtins.list[ObjectInfo]:
        found = _list_files(self.root, prefix)
        packed = self.segments.list(prefix)
        if packed:
            found.extend(packed)
            found.sort(key=lambda info: info.key)
        return found

    async def list_folders(self, prefix: str) -> builtins.list[str]:
        self.stats["lists"] += 1
        return await self._run(partial(_list_folders, self.root, prefix))

    async def remove_stale_temp_files(self, older_than: float = 3600.0) -> int:
        """Delete temp files left by crashed writers; returns how many were removed.

        Only files older than `older_than` seconds go, so a live writer's temp file
        (in this or another process) is never pulled from under it.
        """
        return await self._run(partial(_remove_stale_temps, self.root, older_than))

    async def aclose(self) -> None:
        if self._writer is not None:
            await self._run(self._writer.close)

    async def _run(self, func: Callable[[], _T]) -> _T:
        return await self._threads.run(self._wrapped, func)

    def _wrapped(self, func: Callable[[], _T]) -> _T:
        """func(), with a failure of the file system raised as ObjectStoreError."""
        try:
            return func()
        except ObjectStoreError:
            raise
        except OSError as exc:
            raise ObjectStoreError(f"{self!r}: {exc}") from exc

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if parts[0] == SEGMENT_FOLDER:
            raise ValueError(f"invalid object key: {key!r} (the segments' folder)")
        for part in parts:
            if part in ("", ".", "..") or part.startswith(TEMP_PREFIX) or "\0" in part:
                raise ValueError(f"invalid object key: {key!r}")
        return os.path.join(self.root, *parts)


def _check_range(start: int, end: int | None) -> None:
    if start < 0 and end is not None:
        raise ValueError("a negative start (read from the end) needs end=None")
    if end is not None and end < start:
        raise ValueError(f"range end {end} is before start {start}")


def _put_file(
    path: str,
    key: str,
    parts: Sequence[bytes | memoryview],
    size: int,
    if_absent: bool,
    large_bytes_per_s: float | None = None,
    large_direct: bool = False,
) -> None:
    folder = os.path.dirname(path)
    _makedirs_durable(folder)
    tmp = os.path.join(folder, TEMP_PREFIX + secrets.token_hex(8))
    large = size > SYNC_PIECE
    fd, direct = _open_new(tmp, direct=large and large_direct)
    try:
        try:
            pace = large_bytes_per_s if large else None
            if direct:
                _write_direct(fd, parts, bytes_per_s=pace)
            else:
                _write_all(fd, parts, sync=large, bytes_per_s=pace)
            os.fsync(fd)
        finally:
            os.close(fd)
        if if_absent:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise ObjectExistsError(f"object already exists: {key!r}") from None
            finally:
                os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        # The temp file may already be gone (linked and unlinked, or renamed).
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder)


def _open_new(path: str, *, direct: bool) -> tuple[int, bool]:
    """A new file open for writing; with `direct`, with O_DIRECT if the file system takes
    it. Returns the descriptor and whether it is direct."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT | os.O_DSYNC, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            try:  # tmpfs refuses O_DIRECT at open, after creating the file
                os.unlink(path)
            except FileNotFoundError:
                pass
    return os.open(path, flags, 0o644), False


def _write_direct(
    fd: int, parts: Sequence[bytes | memoryview], *, bytes_per_s: float | None = None
) -> None:
    """Write the parts in order to the empty file fd opened with O_DIRECT: copied into an
    aligned buffer DIRECT_PIECE at a time, the last piece padded to DIRECT_ALIGN with
    zeros and the file cut back to the parts' size after it; with `bytes_per_s`, no
    faster than that."""
    views = [memoryview(part) for part in parts if len(part)]
    size = sum(len(view) for view in views)
    with mmap.mmap(-1, DIRECT_PIECE) as buffer:  # page-aligned
        aligned = memoryview(buffer)
        try:
            position = 0
            began = time.monotonic()
            views.reverse()  # taken from the end
            while views:
                _keep_pace(position, began, bytes_per_s)
                n = 0
                while views and n < DIRECT_PIECE:
                    view = views.pop()
                    take = min(len(view), DIRECT_PIECE - n)
                    aligned[n : n + take] = view[:take]
                    n += take
                    if take < len(view):
                        views.append(view[take:])
                padded = -(-n // DIRECT_ALIGN) * DIRECT_ALIGN
                if padded > n:
                    aligned[n:padded] = bytes(padded - n)
                done = 0
                while done < padded:
                    written = os.pwrite(fd, aligned[done:padded], position + done)
                    if written <= 0 or written % DIRECT_ALIGN:
                        raise OSError(errno.EIO, f"a direct write wrote {written} bytes")
                    done += written
                position += n
        finally:
            aligned.release()
    if size % DIRECT_ALIGN:
        os.ftruncate(fd, size)


def _write_all(
    fd: int,
    parts: Sequence[bytes | memoryview],
    *,
    sync: bool = False,
    bytes_per_s: float | None = None,
) -> None:
    """Write the parts in order, at most WRITE_PIECE bytes (and IOV_MAX parts) per
    writev; with `sync`, fdatasync each SYNC_PIECE bytes written (the caller fsyncs the
    rest); with `bytes_per_s`, no faster than that (a sleep before each piece that would
    run ahead of it)."""
    views = [memoryview(part) for part in parts if len(part)]
    first = 0  # views[:first] are written
    unsynced = 0
    total = 0
    began = time.monotonic()
    while first < len(views):
        _keep_pace(total, began, bytes_per_s)
        piece: list[memoryview] = []
        room = WRITE_PIECE
        for view in views[first : first + IOV_MAX]:
            piece.append(view[:room])
            room -= len(piece[-1])
            if not room:
                break
        written = os.writev(fd, piece)
        total += written
        unsynced += written
        while written:  # drop what was written
            if written >= len(views[first]):
                written -= len(views[first])
                first += 1
            else:
                views[first] = views[first][written:]
                written = 0
        if sync and unsynced >= SYNC_PIECE and first < len(views):
            os.fdatasync(fd)
            unsynced = 0


def _keep_pace(written: int, began: float, bytes_per_s: float | None) -> None:
    """Sleep until `written` bytes since `began` (time.monotonic) are no faster than
    bytes_per_s (None: never sleep)."""
    if bytes_per_s and written:
        ahead = written / bytes_per_s - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)


def _map(mappings: _Mappings, fd: int, start: int, stop: int) -> memoryview | None:
    """Bytes [start, stop) of the open (and shared-locked) file as a populated mapping,
    counted in `mappings` until it is gone; None for a range under MAP_MIN, past the
    mappings' bound, or where the kernel cannot populate one (then no mapping is tried
    again): the caller reads the range instead."""
    if stop - start < MAP_MIN or not mappings.take():
        return None
    try:
        offset = start - start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, stop - offset, prot=mmap.PROT_READ, offset=offset)
        try:
            mapped.madvise(mmap.MADV_WILLNEED)
            while True:
                try:
                    mapped.madvise(MADV_POPULATE_READ)
                    break
                except InterruptedError:  # a signal came first: what is populated stays
                    continue
        except BaseException:
            mapped.close()
            raise
    except OSError as exc:
        mappings.give()
        if exc.errno == errno.EINVAL:  # a kernel before 5.14
            mappings.works = False
            return None
        raise
    except BaseException:
        mappings.give()
        raise
    weakref.finalize(mapped, mappings.give)
    return memoryview(mapped)[start - offset :]


def _open_object(path: str, key: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ObjectNotFoundError(f"no such object: {key!r}") from None


def _lock_shared(fd: int, key: str) -> None:
    """Hold the file against deletion in pieces (the module's DELETE_PIECE)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # being deleted (_delete_file holds it exclusively)
        raise ObjectNotFoundError(f"no such object: {key!r} (being deleted)") from None


def _read_file(path: str, key: str, start: int, end: int | None) -> bytes:
    fd = _open_object(path, key)
    try:
        return _read_range(fd, key, *_bounds(fd, key, start, end))
    finally:
        os.close(fd)


def _bounds(fd: int, key: str, start: int, end: int | None) -> tuple[int, int]:
    """[start, stop) of the open file that a get of [start, end) reads (see get)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ObjectNotFoundError(f"no such object: {key!r} (a folder)")
    if start < 0:
        start = max(0, st.st_size + start)
    return start, st.st_size if end is None else min(end, st.st_size)


def _read_direct(fd: int, key: str, start: int, stop: int) -> memoryview | None:
    """Bytes [start, stop) of the open file read with O_DIRECT, DIRECT_PIECE at a time,
    into an aligned buffer of their own; None where the file system refuses O_DIRECT."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    first = start - start % DIRECT_ALIGN
    last = -(-stop // DIRECT_ALIGN) * DIRECT_ALIGN
    buffer = memoryview(mmap.mmap(-1, last - first))  # page-aligned
    position = first
    while position < stop:
        at = position - first
        n = os.preadv(fd, [buffer[at : min(at + DIRECT_PIECE, last - first)]], position)
        if n <= 0:  # cut short (the caller's shared lock keeps _delete_file's pieces off)
            raise ObjectNotFoundError(f"no such object: {key!r} (deleted while read)")
        position += n
        if position < stop and n % DIRECT_ALIGN:
            raise OSError(errno.EIO, f"a direct read read {n} bytes")
    return buffer[start - first : stop - first]


def _read_range(fd: int, key: str, start: int, stop: int) -> bytes:
    if start >= stop:
        return b""
    chunks: list[bytes] = []
    position = start
    while position < stop:
        chunk = os.pread(fd, stop - position, position)
        if not chunk:  # freed piece by piece by a delete under way (_delete_file)
            raise ObjectNotFoundError(f"no such object: {key!r} (deleted while read)")
        chunks.append(chunk)
        position += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _LocalRangeStream:
    """An open object file read in order (storage.objectstore.RangeStream); a deleted
    object stays readable through it, as through an open GET."""

    def __init__(self, store: LocalObjectStore, fd: int, position: int, end: int | None) -> None:
        self._store = store
        self._fd = fd
        self._position = position
        self._end = end

    def read(self, n: int) -> bytes | memoryview:
        """The next n bytes: mapped (the module's rules) when n is MAP_MIN or more."""
        if self._end is not None:
            n = min(n, self._end - self._position)
        if n >= MAP_MIN:
            stop = min(self._position + n, os.fstat(self._fd).st_size)
            view = _map(self._store.mappings, self._fd, self._position, stop)
            if view is not None:
                self._position += len(view)
                self._store.stats["bytes_got"] += len(view)
                return view
        chunks: list[bytes] = []
        while n > 0:
            chunk = os.pread(self._fd, n, self._position)
            if not chunk:
                break
            chunks.append(chunk)
            self._position += len(chunk)
            n -= len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._store.stats["bytes_got"] += len(data)
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _delete_file(path: str) -> None:
    # No fsync of the folder: every object deleted is garbage (broker.lifecycle's
    # collection and orphan sweep), and one that a crash brings back is an orphan that
    # the sweep deletes again. An fsync per delete was a journal commit per object (the
    # collector deletes hundreds a second after a compaction backlog), each one a wait
    # for the flushes' own fsyncs.
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if st.st_size <= DELETE_PIECE or not stat.S_ISREG(st.st_mode):
        _unlink(path)
        return
    try:
        fd = os.open(path, os.O_WRONLY)
    except (FileNotFoundError, NotADirectoryError):
        return
    except PermissionError:  # a read-only file: the unlink frees it at once
        _unlink(path)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            size = os.fstat(fd).st_size
        except BlockingIOError:  # a range stream reads it: the unlink leaves it its bytes
            size = 0
        _unlink(path)
        # Nameless now, and locked against any stream that opened it just before: its
        # blocks are freed a piece at a time (DELETE_PIECE, DELETE_PAUSE_S apart).
        while size > DELETE_PIECE:
            size -= DELETE_PIECE
            os.ftruncate(fd, size)
            time.sleep(DELETE_PAUSE_S)
    finally:
        os.close(fd)  # frees what is left


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        pass


def _list_files(root: str, prefix: str) -> list[ObjectInfo]:
    # Start at the deepest folder the prefix names; only names below it can match.
    folder_key = prefix.rpartition("/")[0]
    start = os.path.join(root, *folder_key.split("/")) if folder_key else root
    found: list[ObjectInfo] = []
    _scan(start, folder_key + "/" if folder_key else "", prefix, found)
    found.sort(key=lambda info: info.key)
    return found


def _list_folders(root: str, prefix: str) -> list[str]:
    folder = os.path.join(root, *prefix.rstrip("/").split("/")) if prefix.strip("/") else root
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    names = []
    for entry in entries:
        if folder == root and entry.name == SEGMENT_FOLDER:
            continue
        try:
            if entry.is_dir(follow_symlinks=False) and any(True for _ in os.scandir(entry.path)):
                names.append(entry.name)
        except FileNotFoundError:
            continue  # removed while we looked
    return sorted(names)


def _scan(folder: str, key_prefix: str, prefix: str, found: list[ObjectInfo]) -> None:
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith(TEMP_PREFIX) or (not key_prefix and entry.name == SEGMENT_FOLDER):
            continue
        key = key_prefix + entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                sub = key + "/"
                if sub.startswith(prefix) or prefix.startswith(sub):
                    _scan(entry.path, sub, prefix, found)
            elif key.startswith(prefix):
                st = entry.stat()
                found.append(ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime))
        except FileNotFoundError:
            continue  # deleted while we looked


def _remove_stale_temps(root: str, older_than: float) -> int:
    cutoff = time.time() - older_than
    removed = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if not name.startswith(TEMP_PREFIX):
                continue
            path = os.path.join(folder, name)
            try:
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed


def _makedirs_durable(folder: str) -> None:
    """Create folder and missing parents, fsyncing each parent so the entry survives."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(folder)
    _makedirs_durable(parent)
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass  # a concurrent writer made it; sync anyway, as our put must not rely on theirs
    fsync_dir(parent)
