"""A local folder's small objects packed into segment files: a flush without a new file.

On this project's machine (ext4 without a journal, on a virtual disk) a put of 450 KB as
a new file, written, fsync'd, linked to its name and the folder fsync'd, cost the writing
thread 389-447 µs of system CPU and 106-124 of user CPU, and the same bytes written at the
next offset of a file that already exists, then fdatasync'd, 280-323 and 0-17; right
after 3,000 deletes in the same folder 776-849 against 305-308, as the file system skips
the recently freed inodes one by one to make a file (integration/bench/put_cost.py,
results/2026-11-29-put-cost.jsonl). An agent makes a put per flush, about 2,300 per GB
on one partition.

Rules:
- Only a key from SegmentWriter.reserve is packed. It names the object's place:
  "<prefix><ULID>~<segment>~<offset>", so that any process reads it from the key alone;
  is_packed_key tells such keys from the others (which stay files).
- A segment file lives in SEGMENT_FOLDER under the store's root. Page 0 is its head
  (SEGMENT_MAGIC and a random nonce). From PAGE on, records, each at a PAGE boundary: a
  head page (RECORD_MAGIC, a digest of the fields keyed with the nonce, the data's size,
  the time written, the key), then the data. A record is written with one pwritev and one
  fdatasync before its put returns.
- A read checks the record's head against its key before and after it reads: a record
  deleted meanwhile is not found, never read as the zeros its pages became.
- delete punches the record's pages out of the file (its blocks are freed at once). A
  range stream holds a read lock (an open file description lock) on its record's head,
  and a record so held is left for the next delete (the orphan sweep finds it again).
- The writer holds an exclusive flock on each segment it may still write to; a segment
  is created under a temp name, locked and only then renamed into the folder. A segment
  that nobody holds and that has no record left is unlinked: by the delete of its last
  record, by its writer when done with it, or by a list that finds it so. A segment
  whose own head is unreadable is never unlinked.
- list reads the heads of every segment's records (holes skipped with SEEK_DATA). A head
  counts only if its digest, keyed with the segment's nonce, matches, so no object's data
  (a client's records) can pass for a head. Of a segment no writer holds, a folder keeps
  the key prefixes it found: such a segment gains no record, so a list of a prefix none
  of them may start with (a readiness probe's, the journal's) passes it by unread.
- The writer makes a segment's file at the first write into it, in the writing thread:
  reserving a place (on the event loop) does no I/O.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from storage.files import TEMP_PREFIX, fsync_dir
from storage.ingest import new_object_key
from storage.objectstore import (
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStoreError,
)

SEGMENT_FOLDER = ".segments"
PAGE = 4096
SEGMENT_MAGIC = b"BLSEGM01"
RECORD_MAGIC = b"BLRECD01"
NONCE_BYTES = 16
# A record's head: magic, digest, data size, time written (ns), key length; then the key.
_HEAD = struct.Struct(">8s8sQQH")
DIGEST_BYTES = 8
HEAD_READ = 1024  # bytes read to find a head (its key included)
MAX_KEY_BYTES = HEAD_READ - _HEAD.size
# A segment is closed to new records past this size; objects larger than PACK_MAX stay
# files (compaction's outputs, written apart).
SEGMENT_BYTES = 64 << 20
PACK_MAX = 16 << 20
IOV_MAX = 1024
# A segment holding no more than this after a delete is looked at for records left (its
# head page, and the file system's own blocks of a file full of holes).
NEARLY_EMPTY = 16 * PAGE
MAX_NONCES = 4096  # segments whose nonce a folder remembers

_PACKED = re.compile(
    r"^(?P<prefix>(?:[^/~]+/)*)[0-9A-Z]{26}~(?P<segment>[0-9a-f]{32})~(?P<offset>[0-9]+)$"
)

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
# struct flock on Linux (64-bit): l_type, l_whence (short), l_start, l_len (off_t), l_pid
_FLOCK = struct.Struct("hhxxxxqqixxxx")


def is_packed_key(key: str) -> bool:
    return _PACKED.match(key) is not None


def _place(key: str) -> tuple[str, int]:
    match = _PACKED.match(key)
    if match is None:
        raise ValueError(f"not a packed key: {key!r}")
    return match["segment"], int(match["offset"])


def _round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _record_span(size: int) -> int:
    """Bytes from a record's head to where the next record may start."""
    return PAGE + _round_up(size)


def _head_digest(nonce: bytes, size: int, written_ns: int, key: bytes) -> bytes:
    """The head's fields hashed with the segment's nonce as the key (BLAKE2b): no one who
    has not read the segment's own head can make bytes that pass for a record's."""
    fields = struct.pack(">QQ", size, written_ns) + key
    return hashlib.blake2b(fields, digest_size=DIGEST_BYTES, key=nonce).digest()


def _encode_head(nonce: bytes, key: str, size: int, written_ns: int) -> bytes:
    raw = key.encode()
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"key too long to pack: {key!r}")
    digest = _head_digest(nonce, size, written_ns, raw)
    head = _HEAD.pack(RECORD_MAGIC, digest, size, written_ns, len(raw)) + raw
    return head + bytes(PAGE - len(head))


def _decode_head(nonce: bytes, data: bytes) -> tuple[str, int, int] | None:
    """(key, size, written_ns) of a valid head, else None."""
    if len(data) < _HEAD.size or data[:8] != RECORD_MAGIC:
        return None
    _magic, digest, size, written_ns, key_len = _HEAD.unpack_from(data)
    raw = data[_HEAD.size : _HEAD.size + key_len]
    if len(raw) != key_len or digest != _head_digest(nonce, size, written_ns, raw):
        return None
    try:
        return raw.decode(), size, written_ns
    except UnicodeDecodeError:
        return None


def _read_nonce(fd: int) -> bytes | None:
    head = os.pread(fd, len(SEGMENT_MAGIC) + NONCE_BYTES, 0)
    if len(head) != len(SEGMENT_MAGIC) + NONCE_BYTES or head[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
        return None
    return head[len(SEGMENT_MAGIC) :]


def _ofd_lock(fd: int, kind: int, start: int, length: int) -> bool:
    """An open file description lock (F_RDLCK, F_WRLCK or F_UNLCK) on [start, start +
    length), not waiting: whether it was taken."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _punch(fd: int, start: int, length: int) -> bool:
    """Free the blocks of [start, start + length) (read as zeros after); False where the
    file system cannot."""
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err))


@dataclass(slots=True)
class _Run:
    """Adjacent records of a segment deleted together: [start, end) and their heads."""

    start: int
    end: int
    heads: list[int] = field(default_factory=list)


@dataclass(eq=False)
class _Segment:
    name: str
    nonce: bytes
    fd: int = -1  # made at the first write
    end: int = PAGE  # where the next record goes
    writing: int = 0  # reserved records not yet written (or failed)
    retired: bool = False
    opening: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class SegmentFolder:
    """The segments of one store root: reads, deletes and lists of packed keys, for any
    process; SegmentWriter adds the writing."""

    root: str
    folder: str = field(init=False)
    _nonces: dict[str, bytes] = field(default_factory=dict, init=False)
    # The key prefixes once found in each segment no writer holds any more: such a
    # segment only loses records, so a list of another prefix passes it by unread.
    _closed_prefixes: dict[str, frozenset[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.folder = os.path.join(self.root, SEGMENT_FOLDER)

    def path(self, segment: str) -> str:
        return os.path.join(self.folder, segment)

    def _open(self, key: str, flags: int = os.O_RDONLY) -> tuple[int, int, bytes]:
        """(fd, offset, nonce) of the segment holding key."""
        segment, offset = _place(key)
        try:
            fd = os.open(self.path(segment), flags)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"no such object: {key!r}") from None
        nonce = self._nonces.get(segment)
        if nonce is None:
            nonce = _read_nonce(fd)
            if nonce is None:
                os.close(fd)
                raise ObjectStoreError(f"segment {segment} of {key!r} has no valid head")
            if len(self._nonces) >= MAX_NONCES:
                self._nonces.clear()
            self._nonces[segment] = nonce
        return fd, offset, nonce

    @staticmethod
    def _size(fd: int, offset: int, nonce: bytes, key: str) -> int:
        """The data size of key's record, checking that the record is there."""
        found = _decode_head(nonce, os.pread(fd, HEAD_READ, offset))
        if found is None or found[0] != key:
            raise ObjectNotFoundError(f"no such object: {key!r}")
        return found[1]

    def read(self, key: str, start: int, end: int | None) -> bytes:
        fd, offset, nonce = self._open(key)
        try:
            size = self._size(fd, offset, nonce, key)
            if start < 0:
                start = max(0, size + start)
            stop = size if end is None else min(end, size)
            if start >= stop:
                return b""
            data = _pread_all(fd, stop - start, offset + PAGE + start, key)
            self._size(fd, offset, nonce, key)  # not deleted while read
            return data
        finally:
            os.close(fd)

    def open_stream(
        self, key: str, start: int, end: int | None, stats: dict[str, int] | None = None
    ) -> PackedRangeStream:
        fd, offset, nonce = self._open(key)
        try:
            if not _ofd_lock(fd, fcntl.F_RDLCK, offset, PAGE):
                raise ObjectNotFoundError(f"no such object: {key!r} (being deleted)")
            size = self._size(fd, offset, nonce, key)  # checked once held
        except BaseException:
            os.close(fd)
            raise
        if start < 0:
            start = max(0, size + start)
        stop = size if end is None else min(end, size)
        return PackedRangeStream(fd, key, offset + PAGE, start, max(start, stop), stats)

    def delete(self, key: str) -> None:
        segment, offset = _place(key)
        self._delete_in(segment, [(offset, key)])

    def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        """delete() of each key, one segment at a time: each segment opened once, and one
        hole punched for each run of adjacent records (on ext4 a punch of 200 adjacent
        320 KiB records took 7.5 ms of CPU, one punch each 17.2). The keys that could not
        be deleted, with why; the others are gone, or left to the orphan sweep as
        delete() leaves one that a range stream holds."""
        by_segment: dict[str, set[tuple[int, str]]] = {}
        for key in keys:
            segment, offset = _place(key)
            by_segment.setdefault(segment, set()).add((offset, key))
        failed: dict[str, Exception] = {}
        for segment, placed in by_segment.items():
            try:
                self._delete_in(segment, sorted(placed))
            except Exception as exc:  # this segment's keys only: the next call tries again
                failed.update((key, exc) for _offset, key in placed)
        return failed

    def _delete_in(self, segment: str, placed: list[tuple[int, str]]) -> None:
        """Delete the records at `placed` ((offset, key), in offset order) of one segment."""
        try:
            fd, _offset, nonce = self._open(placed[0][1], os.O_RDWR)
        except ObjectNotFoundError:
            return  # the segment is gone, and every record it held
        try:
            runs: list[_Run] = []
            for offset, key in placed:
                found = _decode_head(nonce, os.pread(fd, HEAD_READ, offset))
                if found is None or found[0] != key:
                    continue  # deleted already
                if not _ofd_lock(fd, fcntl.F_WRLCK, offset, PAGE):
                    continue  # a range stream reads it: left for the orphan sweep
                if not runs or runs[-1].end != offset:
                    runs.append(_Run(offset, offset))
                runs[-1].end = offset + _record_span(found[1])
                runs[-1].heads.append(offset)
            for run in runs:
                if not _punch(fd, run.start, run.end - run.start):
                    for head in run.heads:  # unfound now; their space goes with the file
                        os.pwrite(fd, bytes(PAGE), head)
            emptied = os.fstat(fd).st_blocks * 512 <= NEARLY_EMPTY
        finally:
            os.close(fd)  # releases the locks
        if emptied:
            self.remove_if_empty(segment)

    def remove_if_empty(self, segment: str) -> bool:
        """Unlink the segment if no writer holds it and it has no record left."""
        path = self.path(segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its writer may still add to it
            nonce = _read_nonce(fd)
            if nonce is None or any(True for _ in _records(fd, nonce)):
                return False
            self._nonces.pop(segment, None)
            self._closed_prefixes.pop(segment, None)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            return True
        finally:
            os.close(fd)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """The packed objects whose key starts with prefix; unlinks the empty segments
        nobody holds on the way."""
        try:
            names = [n for n in os.listdir(self.folder) if not n.startswith(TEMP_PREFIX)]
        except FileNotFoundError:
            return []
        if len(self._closed_prefixes) >= MAX_NONCES:
            self._closed_prefixes.clear()
        found: list[ObjectInfo] = []
        for name in names:
            known = self._closed_prefixes.get(name)
            if known is not None and not any(_may_hold(p, prefix) for p in known):
                continue
            try:
                fd = os.open(self.path(name), os.O_RDONLY)
            except FileNotFoundError:
                self._closed_prefixes.pop(name, None)
                continue
            try:
                closed = known is not None or _unheld(fd)
                nonce = _read_nonce(fd)
                records = [] if nonce is None else list(_records(fd, nonce))
            finally:
                os.close(fd)  # releases the shared lock _unheld took
            if not records:
                self.remove_if_empty(name)
            elif closed and known is None:
                self._closed_prefixes[name] = frozenset(_key_prefix(r[0]) for r in records)
            for key, size, written_ns in records:
                if key.startswith(prefix):
                    found.append(ObjectInfo(key=key, size=size, last_modified=written_ns / 1e9))
        return found


def _unheld(fd: int) -> bool:
    """Whether no writer holds the segment (a shared flock, kept until fd is closed)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _key_prefix(key: str) -> str:
    """The prefix a packed key was reserved with: what comes before its ULID."""
    found = _PACKED.match(key)
    assert found is not None  # a record's key, checked by its digest
    return found["prefix"]


def _may_hold(key_prefix: str, prefix: str) -> bool:
    """Whether a key reserved with key_prefix may start with prefix."""
    if len(prefix) <= len(key_prefix):
        return key_prefix.startswith(prefix)
    return prefix.startswith(key_prefix)


def _records(fd: int, nonce: bytes) -> Iterator[tuple[str, int, int]]:
    """(key, size, written_ns) of each valid record of the segment, in order."""
    position = PAGE
    end = os.fstat(fd).st_size
    while position < end:
        try:
            position = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from here
                return
            raise
        position -= position % PAGE
        found = _decode_head(nonce, os.pread(fd, HEAD_READ, position))
        if found is None:
            position += PAGE  # a torn write's pages, or a deleted record's that stayed
            continue
        yield found
        position += _record_span(found[1])


def _pread_all(fd: int, n: int, position: int, key: str) -> bytes:
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, position)
        if not chunk:
            raise ObjectNotFoundError(f"no such object: {key!r} (cut short)")
        chunks.append(chunk)
        position += len(chunk)
        n -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class PackedRangeStream:
    """A packed object read in order (storage.objectstore.RangeStream); its record is
    held against deletes until closed."""

    def __init__(
        self,
        fd: int,
        key: str,
        base: int,
        position: int,
        stop: int,
        stats: dict[str, int] | None = None,
    ) -> None:
        self._fd = fd
        self._key = key
        self._base = base
        self._position = position
        self._stop = stop
        self._stats = stats

    def read(self, n: int) -> bytes:
        n = min(n, self._stop - self._position)
        if n <= 0:
            return b""
        data = _pread_all(self._fd, n, self._base + self._position, self._key)
        self._position += len(data)
        if self._stats is not None:
            self._stats["bytes_got"] += len(data)
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SegmentWriter:
    """Reserves keys and writes their objects into this process's open segment."""

    def __init__(self, segments: SegmentFolder, segment_bytes: int | None = None) -> None:
        self._segments = segments
        self._segment_bytes = segment_bytes or SEGMENT_BYTES
        self._lock = threading.Lock()
        self._current: _Segment | None = None
        self._reserved: dict[str, tuple[_Segment, int, int]] = {}

    def reserve(self, prefix: str, size: int) -> str | None:
        """A packed key for an object of `size` bytes, its place taken (no I/O); None if
        the object is too large to pack."""
        if size > PACK_MAX:
            return None
        span = _record_span(size)
        with self._lock:
            segment = self._current
            if segment is None or (segment.end > PAGE and segment.end + span > self._segment_bytes):
                if segment is not None:
                    self._retire(segment)
                segment = _Segment(secrets.token_hex(16), secrets.token_bytes(NONCE_BYTES))
                self._current = segment
            offset = segment.end
            segment.end += span
            segment.writing += 1
            key = f"{new_object_key(prefix)}~{segment.name}~{offset}"
            self._reserved[key] = (segment, offset, size)
        return key

    def write(self, key: str, parts: Sequence[bytes | memoryview], size: int) -> None:
        """Write a reserved key's object: durable when this returns."""
        with self._lock:
            reserved = self._reserved.pop(key, None)
        if reserved is None:
            try:
                self._segments.read(key, 0, 0)
            except ObjectNotFoundError:
                raise ObjectStoreError(f"packed key not reserved here: {key!r}") from None
            raise ObjectExistsError(f"object already exists: {key!r}")
        segment, offset, reserved_size = reserved
        try:
            if size != reserved_size:
                raise ObjectStoreError(
                    f"{key!r}: {size} bytes put in a place reserved for {reserved_size}"
                )
            fd = self._opened(segment)
            head = _encode_head(segment.nonce, key, size, time.time_ns())
            if len(parts) >= IOV_MAX:
                parts = [b"".join(parts)]
            buffers = [head, *(part for part in parts if len(part))]
            written = os.pwritev(fd, buffers, offset)
            if written != PAGE + size:  # short: write the rest a buffer at a time
                _pwrite_rest(fd, buffers, offset, written)
            os.fdatasync(fd)
        finally:
            with self._lock:
                segment.writing -= 1
                done = segment.retired and not segment.writing
            if done:
                self._close(segment)

    def close(self) -> None:
        with self._lock:
            segment, self._current = self._current, None
            if segment is not None:
                self._retire(segment)

    def _retire(self, segment: _Segment) -> None:
        """No more places in it; closed now if nothing is being written to it (called
        with the writer's lock held)."""
        segment.retired = True
        if not segment.writing:
            self._close(segment)

    def _close(self, segment: _Segment) -> None:
        with segment.opening:
            fd, segment.fd = segment.fd, -1
        if fd < 0:
            return
        try:
            emptied = os.fstat(fd).st_blocks * 512 <= NEARLY_EMPTY
        finally:
            os.close(fd)  # releases its flock
        if emptied:
            self._segments.remove_if_empty(segment.name)

    def _opened(self, segment: _Segment) -> int:
        """The segment's descriptor, its file made at the first write. A segment whose
        file cannot be made takes no more places."""
        try:
            with segment.opening:
                if segment.fd < 0:
                    segment.fd = self._create(segment)
                return segment.fd
        except BaseException:
            with self._lock:
                if self._current is segment:
                    self._current = None
                    segment.retired = True
            raise

    def _create(self, segment: _Segment) -> int:
        folder = self._segments.folder
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)
            fsync_dir(os.path.dirname(folder))
        temp = os.path.join(folder, TEMP_PREFIX + segment.name)
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # before any other process can see it
            head = SEGMENT_MAGIC + segment.nonce
            os.pwrite(fd, head + bytes(PAGE - len(head)), 0)
            os.fsync(fd)
            os.rename(temp, self._segments.path(segment.name))
            fsync_dir(folder)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            raise
        return fd


def _pwrite_rest(fd: int, buffers: Sequence[bytes | memoryview], offset: int, written: int) -> None:
    position = offset
    for buffer in buffers:
        view = memoryview(buffer)
        if written >= len(view):
            written -= len(view)
            position += len(view)
            continue
        view = view[written:]
        position += written
        written = 0
        while len(view):
            n = os.pwrite(fd, view, position)
            view = view[n:]
            position += n
