"""A folder of whole objects read once from the store, for the reads of them after.

An ingest file or a level-1 object holds many partitions' bytes. A consumer catching
up on those partitions reads each one's range of it at its own time (its partitions are
seldom at the same point of their logs), one GET per partition and object, and holding
the object in memory until the last of them comes would take far more than the cache.
Read-ahead instead reads such an object whole, once, into this folder, and every read
of it after (read-ahead's stretches, a Fetch's own read) is a read of the local file:
one GET per object for all of its partitions, bounded by the disk rather than memory.

Rules:
- Objects are immutable and their keys never used again: a file here never goes stale,
  and one whose object was deleted from the store still holds what a reader with an
  older index lookup wants.
- Bounded by bytes: the objects released (no reader is known to want them any more,
  `release`) are deleted first, the first released first; then the least recently read.
  A read of a released object keeps it as any other again. An object larger than an
  eighth of the bound is not kept.
- A file is written under a temporary name and renamed when complete, so a reader never
  sees half of one; the files of a run before are deleted when the agent starts (what
  they hold is not known after a restart).
- Thread-safe: written and read by read-ahead's worker threads and the Fetches'.
- The agent's flushes keep their files here too, released (broker.ingest). Compaction's
  jobs read their inputs' files here (`path_of`); level-2 jobs write the inputs they
  GET whole into this folder under a temporary name (`temporary_path`, from a worker
  process too), which the agent then keeps (`adopt`): the jobs of the other partitions
  of such an object read it from here rather than with a GET each.
- Every file is written out to the disk (`written_out`) before it is kept.
- A whole object comes from the store with one GET, a PIECE at a time where the store
  streams (`write_whole`): its reader holds a piece, never the object.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from storage.objectstore import ObjectStore, RangeStream

logger = logging.getLogger(__name__)

_OWN = re.compile(r"[0-9a-f]{40}(\.[0-9]+\.tmp)?")
PIECE = 1024 * 1024  # what a whole object's read holds at a time, on its way to the disk


def temporary_path(directory: str, object_key: str) -> str:
    """Where a writer (a thread of any process) writes an object before it is kept."""
    writer = f"{os.getpid()}{threading.get_ident()}"
    return f"{os.path.join(directory, _file_name(object_key))}.{writer}.tmp"


def written_out(f: BinaryIO) -> None:
    """The file's bytes on the disk before it is kept. The folder takes the agent's
    flushes and compaction's inputs at the produce rate: left to the kernel, their dirty
    pages went out seconds at a time, and the metadata store's commits on the same disk
    (SQLite's fsync) waited behind them (integration/bench/README.md, 54th pass)."""
    f.flush()
    os.fdatasync(f.fileno())


def write_whole(store: ObjectStore, object_key: str, path: str, size: int | None = None) -> int:
    """GET the whole object into the file at `path` (created), written out; its size. With
    `size`, fewer bytes than that are an error. A failure leaves no file."""
    opener = getattr(store, "open_range_stream", None)
    if opener is None:
        return _write_pieces(path, object_key, (store.get_view_sync(object_key, 0, size),), size)
    stream = opener(object_key, 0, size)
    try:
        return _write_pieces(path, object_key, _pieces_of(stream, size), size)
    finally:
        stream.close()


def _pieces_of(stream: RangeStream, size: int | None) -> Iterator[bytes | memoryview]:
    """The stream's bytes, PIECE at a time, up to `size` (fewer if it ends first)."""
    read = 0
    while size is None or read < size:
        piece = stream.read(PIECE if size is None else min(PIECE, size - read))
        if not piece:
            return
        read += len(piece)
        yield piece


def _write_pieces(
    path: str, object_key: str, pieces: Iterable[bytes | memoryview], size: int | None
) -> int:
    """The pieces, in order, into the file at `path` (created), written out; its size.
    With `size`, any other count is an error. A failure leaves no file."""
    try:
        written = 0
        with open(path, "wb") as f:
            for piece in pieces:
                written += f.write(piece)
            if size is not None and written != size:
                raise OSError(f"{object_key}: {written} bytes read of {size}")
            written_out(f)
        return written
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


def read_spans(path: str, spans: Iterable[tuple[int, int]]) -> list[bytes] | None:
    """The bytes [start, end) of each span of the file; None when the file is gone or
    shorter than a span (not of the object's size: not trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        got = []
        for start, end in spans:
            data = os.pread(fd, end - start, start)
            if len(data) != end - start:
                return None
            got.append(data)
        return got
    finally:
        os.close(fd)


def _file_name(object_key: str) -> str:
    return hashlib.sha1(object_key.encode()).hexdigest()


class DiskCache:
    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, int] = OrderedDict()  # object key -> size, LRU first
        self._released: OrderedDict[str, None] = OrderedDict()  # of _files, first released first
        self._held = 0
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {
            "objects_kept": 0,
            "bytes_kept": 0,
            "reads": 0,
            "bytes_read": 0,
            "objects_evicted": 0,
            "objects_released": 0,
            "released_evicted": 0,  # of objects_evicted
            "write_failures": 0,  # files fill and fill_from could not write (_failed)
        }
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # only files named as this class names them
            if _OWN.fullmatch(name):
                os.unlink(os.path.join(directory, name))

    def __contains__(self, object_key: object) -> bool:
        with self._lock:
            return object_key in self._files

    @property
    def held_bytes(self) -> int:
        return self._held

    def fits(self, size: int) -> bool:
        """Whether an object of this size may be kept."""
        return 0 < size <= self.max_bytes // 8

    def _path(self, object_key: str) -> str:
        return os.path.join(self.directory, _file_name(object_key))

    def path_of(self, object_key: str) -> str | None:
        """The file holding the whole object (read as a read of it: least recently read
        last), or None. It may be deleted before the caller opens it (room wanted)."""
        with self._lock:
            if object_key not in self._files:
                return None
            self._files.move_to_end(object_key)
            self._released.pop(object_key, None)
        return self._path(object_key)

    def read(self, object_key: str, start: int, end: int) -> bytes | None:
        """Bytes [start, end) of the object; None when it is not kept here."""
        with self._lock:
            if object_key not in self._files:
                return None
            self._files.move_to_end(object_key)
            self._released.pop(object_key, None)
        got = read_spans(self._path(object_key), ((start, end),))
        if got is None:  # deleted by another thread since, or short
            return None
        (data,) = got
        with self._lock:
            self.stats["reads"] += 1
            self.stats["bytes_read"] += len(data)
        return data

    def put(self, object_key: str, data: bytes | memoryview) -> None:
        """Keep the whole object (a no-op if it does not fit or is kept already)."""
        self.fill(object_key, len(data), iter((data,)))

    def fill(self, object_key: str, size: int, pieces: Iterable[bytes | memoryview]) -> None:
        """Keep the object whose `size` bytes `pieces` yields in order (read from a
        stream a piece at a time: the agent holds one piece, not the object); a no-op if
        it does not fit or is kept already. A file it cannot write (the disk full, say;
        fewer bytes than `size`) keeps nothing and is counted (`_failed`)."""
        self._write(object_key, size, lambda path: _write_pieces(path, object_key, pieces, size))

    def fill_from(self, store: ObjectStore, object_key: str, size: int) -> None:
        """Keep the object of `size` bytes, read from the store whole (`write_whole`); a
        no-op if it does not fit or is kept already. The store's failures are raised; a
        file it cannot write keeps nothing and is counted, as in `fill`."""
        self._write(object_key, size, lambda path: write_whole(store, object_key, path, size))

    def _write(self, object_key: str, size: int, write: Callable[[str], int]) -> None:
        """fill's and fill_from's: `write` the object into a temporary file (its size
        answered) and keep it; an OSError keeps nothing and is counted (a store's
        failures are ObjectStoreError, not OSError: raised)."""
        if not self.fits(size) or object_key in self:
            return
        temporary = temporary_path(self.directory, object_key)
        try:
            written = write(temporary)
        except OSError as exc:
            self._failed(object_key, exc)
            return
        self.adopt(object_key, temporary, written)

    def _failed(self, object_key: str, exc: OSError) -> None:
        """A file not written: counted, the first logged as a warning (a disk that
        cannot keep files costs GETs, never an answer)."""
        with self._lock:
            self.stats["write_failures"] += 1
            first = self.stats["write_failures"] == 1
        (logger.warning if first else logger.debug)(
            "the disk cache could not keep %s: %s", object_key, exc
        )

    def adopt(self, object_key: str, temporary: str, size: int) -> None:
        """Keep the whole object a writer put in `temporary` (`temporary_path`), of
        `size` bytes; the file is deleted instead if it does not fit, is not of that
        size, or the object is kept already."""
        try:
            if not self.fits(size) or object_key in self or os.stat(temporary).st_size != size:
                os.unlink(temporary)
                return
            os.replace(temporary, self._path(object_key))
        except FileNotFoundError:
            return
        gone: list[str] = []
        with self._lock:
            if object_key in self._files:  # kept by another thread meanwhile
                return
            self._files[object_key] = size
            self._held += size
            self.stats["objects_kept"] += 1
            self.stats["bytes_kept"] += size
            while self._held > self.max_bytes:
                if self._released:
                    old, _ = self._released.popitem(last=False)
                    old_size = self._files.pop(old)
                    self.stats["released_evicted"] += 1
                else:
                    old, old_size = self._files.popitem(last=False)
                self._held -= old_size
                self.stats["objects_evicted"] += 1
                gone.append(old)
        for old in gone:
            self._unlink(old)

    def release(self, object_key: str) -> None:
        """No reader is known to want the object any more: it goes before the objects
        not released when room is wanted (unless read again first)."""
        with self._lock:
            if object_key in self._files and object_key not in self._released:
                self._released[object_key] = None
                self.stats["objects_released"] += 1

    def discard(self, object_key: str) -> None:
        with self._lock:
            size = self._files.pop(object_key, None)
            if size is None:
                return
            self._released.pop(object_key, None)
            self._held -= size
        self._unlink(object_key)

    def _unlink(self, object_key: str) -> None:
        try:
            os.unlink(self._path(object_key))
        except FileNotFoundError:
            pass
