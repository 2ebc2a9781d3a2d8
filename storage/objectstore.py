"""Object stores: where ingest files live.

An `ObjectStore` holds immutable objects under string keys. Writes of new objects use
`if_absent=True` so that a key can never be overwritten by a retry or a second writer.
All methods are async; blocking client libraries run in worker threads.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class ObjectStoreError(Exception):
    """A store failure that its retries did not cure."""


class ObjectExistsError(ObjectStoreError):
    """put(if_absent=True) found the key already present."""


class ObjectNotFoundError(ObjectStoreError):
    """get of a key that does not exist."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: float  # seconds since the epoch


STAT_NAMES = ("puts", "gets", "deletes", "lists", "bytes_put", "bytes_got")

_UNPACED: contextvars.ContextVar[bool] = contextvars.ContextVar("unpaced", default=False)


@contextlib.contextmanager
def unpaced() -> Iterator[None]:
    """Puts made inside (in this thread, or this task) are written as fast as the store
    takes them, whatever pace it keeps for large writes (a local folder's
    `large_write_bytes_per_s`)."""
    token = _UNPACED.set(True)
    try:
        yield
    finally:
        _UNPACED.reset(token)


def pacing() -> bool:
    """Whether a put made here keeps the store's pace (not inside `unpaced()`)."""
    return not _UNPACED.get()


class RangeStream(Protocol):
    """An object's bytes from an offset on (to its end, or to an end given when it was
    opened), read in order as they are wanted (one GET for all of them). Blocking: call
    from a worker thread, one at a time."""

    def read(self, n: int) -> bytes | memoryview:
        """The next n bytes (fewer only at the stream's end); a read-only view where the
        store can hand its bytes out without a copy (get_view)."""
        ...

    def close(self) -> None: ...


def new_stats() -> dict[str, int]:
    """The request counters every store keeps (benchmarks report them)."""
    return dict.fromkeys(STAT_NAMES, 0)


DELETE_BATCH_MAX = 1000  # keys one delete_many request takes at most (S3's DeleteObjects)


class ObjectStore(Protocol):
    def new_key(self, prefix: str, size: int) -> str:
        """A fresh key under prefix for an object of `size` bytes that is to be put once
        (if_absent): storage.ingest.new_object_key(prefix), or, in a local folder with
        segments on, a key that names the object's place in a segment file."""
        ...

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        """Store data durably under key (durable when this returns).

        With if_absent, raises ObjectExistsError if the key already exists, atomically
        with respect to every other writer; without it, the last writer wins.
        """
        ...

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        """The blocking form of put, for a caller that is already in a worker thread."""
        ...

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        """put_sync of the parts' bytes, in order: a store that can write them as they
        are (the local store) does so instead of joining them first. Blocking, for a
        caller in a worker thread."""
        ...

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object (end None = to the end).

        A range past the end is cut short (possibly to b""). A negative start, with
        end None, asks for the last -start bytes, as in data[start:]; one request
        reads an object's tail without knowing its size.
        Raises ObjectNotFoundError if the key does not exist.
        """
        ...

    def get_sync(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The blocking form of get, for a caller that is already in a worker thread."""
        ...

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """get() as a read-only view, for readers that keep or pass on the bytes without
        changing them: a store that can hand out its own copy of them (the local store's
        file, mapped) does so instead of copying them into memory."""
        ...

    def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """The blocking form of get_view."""
        ...

    async def delete(self, key: str) -> None:
        """Remove key; deleting a missing key is not an error."""
        ...

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        """delete() of each key, in as few requests as the store allows; the keys that
        could not be deleted, with why (the others are gone)."""
        ...

    async def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with prefix, in key order; with start_after,
        only those whose key sorts after it (S3's StartAfter: the rest is not read)."""
        ...

    async def list_folders(self, prefix: str) -> builtins.list[str]:
        """The names one level below `prefix` (which ends with "/") that hold objects,
        in order: S3's common prefixes with the delimiter "/", without reading the
        objects under them."""
        ...

    async def aclose(self) -> None: ...


def open_store(
    url: str,
    *,
    s3_endpoint_url: str | None = None,
    s3_region: str | None = None,
    s3_addressing_style: str | None = None,
    blocking_calls: int | None = None,
    large_write_bytes_per_s: float | None = None,
    large_io_direct: bool = False,
    segments: bool = False,
) -> ObjectStore:
    """file:///path/to/folder (local folder) or s3://bucket/prefix. `blocking_calls`: how
    many *_sync calls the caller makes at most at once (S3: connections kept for them).
    `large_write_bytes_per_s`, `large_io_direct`: a local folder's pace for large
    objects, and whether it writes them (and reads large ranges) with O_DIRECT
    (storage.local); `segments`: whether new_key packs small objects into segment files
    (storage.segments)."""
    if url.startswith("file://"):
        from storage.local import LocalObjectStore

        return LocalObjectStore(
            url[len("file://") :],
            large_write_bytes_per_s=large_write_bytes_per_s,
            large_io_direct=large_io_direct,
            segments=segments,
        )
    if url.startswith("s3://"):
        from storage.s3 import S3ObjectStore

        bucket, _, prefix = url[len("s3://") :].partition("/")
        return S3ObjectStore(
            bucket,
            prefix,
            endpoint_url=s3_endpoint_url,
            region=s3_region,
            addressing_style=s3_addressing_style,
            **({} if blocking_calls is None else {"blocking_calls": blocking_calls}),
        )
    raise ObjectStoreError(f"unknown storage URL scheme: {url!r} (expected file:// or s3://)")
