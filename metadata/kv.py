"""The ordered, transactional key-value store the metadata layers are written against.

Shaped like FoundationDB so that the same layer code runs on every backend:

* keys and values are bytes; keys sort bytewise (tuple-packed keys sort by their tuples);
* a transaction function receives a `Transaction`, is *pure* (no I/O of its own, no id
  generation, no clocks read) and may run more than once: the backend retries it on
  conflict;
* transaction functions are synchronous and run in a worker thread; callers in the event
  loop use `await kv.transact(fn)` / `await kv.read(fn)`;
* `add` is FoundationDB's atomic ADD: the value is a little-endian signed 64-bit integer,
  a missing key counts as zero;
* `get_many`, `set_many`, `clear_many` and `clear_ranges` do what the same calls one key
  (or range) at a time do, in order, in one request where the backend can: SQLite runs
  one statement for up to `MANY` keys (each statement gives up the GIL and waits to take
  it back, a wait that the event loop's thread makes long while it runs), FoundationDB
  has the reads in flight together.

Backends: `metadata.sqlite_kv` (embedded default) and `metadata.fdb_kv` (FoundationDB),
both held to one contract (tests/metadata/test_kv_contract.py); `open_kv` picks one by URL.
`faulty+<URL>` wraps either in `metadata.injected_kv` (injected outages and commit
latency, for tests and benchmarks).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_I64 = struct.Struct("<q")


def encode_i64(value: int) -> bytes:
    """The value layout used by `Transaction.add`."""
    return _I64.pack(value)


def decode_i64(value: bytes | None) -> int:
    if value is None:
        return 0
    return int(_I64.unpack(value.ljust(8, b"\x00")[:8])[0])


MANY = 256  # keys (or ranges) of one batched SQLite statement, at most


class ReadTransaction(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of each key, in the keys' order (None: no such key)."""
        ...

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with begin <= key < end, in key order (descending if reverse); limit 0 = all."""
        ...

    def get_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        """`get_range` of each (begin, end), whole, in the ranges' order: for ranges that
        hold few pairs together (a compaction job's entries), read at once."""
        ...


class Transaction(ReadTransaction, Protocol):
    def set(self, key: bytes, value: bytes) -> None: ...

    def clear(self, key: bytes) -> None: ...

    def clear_range(self, begin: bytes, end: bytes) -> None: ...

    def add(self, key: bytes, delta: int) -> None: ...

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """`set` of each (key, value) in turn: of a key given twice, the last value stays."""
        ...

    def clear_many(self, keys: Sequence[bytes]) -> None: ...

    def clear_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> None:
        """`clear_range` of each (begin, end)."""
        ...


class KV(Protocol):
    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        """Run fn in a read-write transaction, retrying it on conflict; return its result."""
        ...

    async def read(self, fn: Callable[[ReadTransaction], T], *, quick: bool = False) -> T:
        """Run fn in a read-only transaction (a consistent snapshot).

        quick=True promises that fn does only a few point reads and short ranges, so a
        backend whose reads are local may run it on the calling thread instead of a
        worker; a backend whose reads cross the network ignores it.
        """
        ...

    def transact_sync(self, fn: Callable[[Transaction], T]) -> T:
        """Blocking form of transact, for threads and start-up code."""
        ...

    async def transact_optimistic(
        self, fn: Callable[[Transaction], T], counts: OptimisticCounts | None = None
    ) -> T:
        """What `transact(fn)` gives, for a background transaction that reads much: a
        backend with one writer at a time (SQLite) works fn out on a snapshot and holds
        its writer lock only to check fn's reads and apply its writes
        (`metadata.optimistic`); one whose commit checks reads anyway (FoundationDB)
        runs `transact`. fn decides from its arguments and reads only. counts, if
        given, counts how the snapshot way went (untouched where there is none)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class OptimisticCounts:
    """How `KV.transact_optimistic` calls went: fn's writes applied as worked out on a
    snapshot, or fn run again under the lock because what it read had changed on every
    snapshot, or because it read a key it had written itself."""

    applied: int = 0
    changed: int = 0
    overlapped: int = 0
    retried: int = 0  # worked out again on a new snapshot after a change


class KVError(Exception):
    """A metadata store failure that retrying the transaction did not cure."""


class Threads(Protocol):
    """Where a backend runs its blocking calls: `await threads.run(fn, *args)` returns
    fn(*args) run in a worker thread, and a cancelled caller still waits for it to end
    (the agent's are `storage.threads.ThreadPool`s)."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


ThreadsFactory = Callable[[int, str], Threads]  # (at most so many at once, a name)


def open_kv(url: str, *, threads: ThreadsFactory | None = None) -> KV:
    """Open a backend from a URL: sqlite:///abs/path.db, or fdb:// / fdb:///path/to/fdb.cluster;
    faulty+ before either adds injected faults (metadata.injected_kv). `threads` makes
    the worker threads of the SQLite backend (by default anyio's)."""
    if url.startswith("faulty+"):
        from metadata.injected_kv import open_injected

        return open_injected(url, partial(open_kv, threads=threads))
    if url.startswith("sqlite://"):
        from metadata.sqlite_kv import SQLiteKV

        # sqlite:///abs/path.db -> /abs/path.db; sqlite://rel/path.db -> rel/path.db
        return SQLiteKV(url[len("sqlite://") :], threads=threads)
    if url.startswith("fdb://"):
        from metadata.fdb_kv import FDBKV

        # fdb:// -> the default cluster file; fdb:///path/to/fdb.cluster[?prefix=NAME]
        return FDBKV.from_url(url)
    raise KVError(
        f"unknown metadata URL scheme: {url!r} (expected sqlite://, fdb:// or faulty+ before either)"
    )
