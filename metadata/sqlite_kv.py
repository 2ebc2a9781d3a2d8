"""The SQLite backend of the metadata KV store (the embedded default).

Rules:

* One table, `kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID`: keys sort
  bytewise (SQLite compares BLOBs with memcmp, shorter first on a common prefix), exactly
  like FoundationDB keys. Keys must be `bytes`; a `str` would be stored as TEXT and sort
  apart from every BLOB, so it is refused.
* WAL mode, so readers never block the writer and several processes on one host (several
  broker agents) can share the file. `synchronous=FULL`: every read-write commit fsyncs the
  WAL before it returns, because the broker acknowledges produces after the commit and an
  acknowledged record must survive power loss.
* Read-write transactions start with `BEGIN IMMEDIATE`, which takes SQLite's single write
  lock up front: at most one read-write transaction runs at a time across all threads and
  processes, so they are serializable and never conflict half-way. Inside one process the
  writers queue on a Python lock first (shared by every `SQLiteKV` on the same file) rather
  than polling SQLite's lock in its busy handler.
* Read transactions start with a deferred `BEGIN`: the first read pins one WAL snapshot,
  and every later read of the same transaction sees that snapshot while writers commit.
* The whole transaction function is retried when SQLite reports SQLITE_BUSY or
  SQLITE_LOCKED (even if the function swallowed the error), with jittered exponential
  backoff, until `retry_deadline` seconds have passed; then `KVError` is raised. An
  exception raised by the function itself rolls the transaction back and propagates
  unchanged, with no retry. Other SQLite failures become `KVError`.
* Connections come from a small pool; each is used by one thread at a time
  (`check_same_thread=False` only lets it move between threads). All PRAGMAs are set once
  per connection, never per transaction; sqlite3 caches the prepared statements. A store
  opened before `fork()` refuses to run in the child: open it again there.
* Across processes the writers queue next on a lock file beside the database
  (`<path>-writer-lock`, an `flock` taken after the in-process lock and given back after
  COMMIT or ROLLBACK): a writer that finds it taken tries again every millisecond at
  most, up to `retry_deadline`. Left to SQLite, a writer waits for another process's
  lock in its busy handler (`sqliteDefaultBusyCallback`), which sleeps 1, 2, 5, 10, 15,
  20, 25, 25, 25, 50, 50, then 100 ms between its tries: by that schedule a commit that
  meets another process's transaction of 10 ms gets the lock after 18 ms, one of 60 ms
  after 78 (the waits measured both ways: integration/bench/process_lock.py, in
  integration/bench/README.md, twenty-ninth pass). The lock file orders the writers
  only; SQLite's lock is still what excludes them (a process that does not take the
  file, such as the sqlite3 shell, is waited for in the busy handler as before).
* `transact`/`read` run the function in one of as many worker threads as the pool has
  connections: anyio's, or those of the `threads` factory given (the agent gives
  `storage.threads.ThreadPool`, which hands a call over for less CPU).
  `read(fn, quick=True)` first tries fn once on the calling thread, on a connection of
  its own (outside the pool, opened once in a worker thread) whose busy wait is off (a
  WAL reader rarely meets a lock); only if that is not possible now (the connection is
  in use by another thread, or SQLite is busy) does it go to a worker thread. A
  cancelled `await` does not abandon the thread: the transaction always finishes
  (commit or rollback) and its connection goes back to the pool clean. As with
  FoundationDB's `commit_unknown_result`, a cancelled caller cannot know whether the
  transaction committed.
* Checkpoints (copying the WAL's pages into the database file) run on a thread of the
  store's own, a PASSIVE checkpoint every `checkpoint_interval` seconds on a connection
  of its own, outside the writer lock: left to SQLite, the commit that takes the WAL past
  1,000 pages runs the checkpoint inside its COMMIT with the lock held, and every commit
  queued behind it waits; on ext4 the checkpoint's fsync of the database file is part
  of that wait (integration/bench/README.md, twenty-seventh pass). A passive checkpoint
  never waits for a reader or a writer; the WAL restarts from its beginning at the first
  commit after one that finished. The commits still checkpoint themselves past
  `_WAL_BACKSTOP_PAGES` (ten times SQLite's default), which bounds the WAL if the
  thread cannot keep up. `checkpoint_interval=None` leaves checkpoints to SQLite.
* `add` is FoundationDB's atomic ADD on 8-byte little-endian signed integers: a missing
  key counts as 0, a shorter stored value is zero-extended and a longer one truncated to 8
  bytes, and the sum wraps modulo 2**64 (two's complement), like FDB's i64 add. SQLite
  gives no extra concurrency for it (the write lock is held anyway); it is a read and a
  write, done once per key per transaction: the deltas are summed until the key is read
  or written or the transaction commits. A deletion step (forget_deleted of 100 objects,
  two tallies each) went from 8.0-9.6 to 5.9-6.4 ms of CPU, a retention step of 1,000
  entries from 76-96 to 72-82 ms (integration/bench/tally_steps.py, six pairs).
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.to_thread

from metadata.kv import MANY, KVError, Threads, ThreadsFactory, decode_i64, encode_i64
from metadata.optimistic import transact_optimistic

if TYPE_CHECKING:
    from metadata.kv import KV, OptimisticCounts, ReadTransaction, Transaction

logger = logging.getLogger(__name__)

T = TypeVar("T")
TxT = TypeVar("TxT", bound="_ReadTx")

_SCHEMA = "CREATE TABLE IF NOT EXISTS kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
_GET = "SELECT value FROM kv WHERE key = ?"
# An upsert updates the row in place; INSERT OR REPLACE would delete and re-insert it.
_SET = (
    "INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
_CLEAR = "DELETE FROM kv WHERE key = ?"
_CLEAR_RANGE = "DELETE FROM kv WHERE key >= ? AND key < ?"
# Batched forms, for up to MANY keys (ranges) at once; {} is the list of placeholders.
_GET_MANY = "SELECT key, value FROM kv WHERE key IN ({})"
_SET_MANY = (
    "INSERT INTO kv(key, value) VALUES {} ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
_CLEAR_MANY = "DELETE FROM kv WHERE key IN ({})"
_CLEAR_RANGES = "DELETE FROM kv WHERE {}"
_RANGES = "SELECT key, value FROM kv WHERE {}"
_RANGE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
_RANGE_REVERSE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?"
# The rows of a query of (key, value) as one row of two texts, the keys' and the values'
# hex, comma-separated, in the same order (NULL, NULL for none). A cursor gives up the
# GIL for every row it steps to and waits to take it back, a wait a busy event loop on
# another thread makes long: one row is one wait, however many pairs it holds.
_AS_ONE_ROW = "SELECT group_concat(hex(key)), group_concat(hex(value)) FROM ({})"
# Pairs read as one row at most (a page of a longer range is another statement). The
# row holds twice the page's bytes as text, under SQLite's limit of 1 GB for a string
# while values stay within FoundationDB's 100,000 bytes, as the layers keep them.
_PAGE = 1024
# Pages in the WAL past which a commit checkpoints it itself (SQLite's wal_autocheckpoint)
# when a checkpoint thread runs: ten times SQLite's default of 1,000 (about 40 MB with
# 4 KB pages), reached only when the thread falls behind.
_WAL_BACKSTOP_PAGES = 10_000


def _parts(items: Sequence[T]) -> list[Sequence[T]]:
    """Items in slices of `MANY`, one batched statement each."""
    return [items[at : at + MANY] for at in range(0, len(items), MANY)]


def _nonempty(ranges: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The ranges that hold any key (begin < end), their bounds checked."""
    wanted = []
    for begin, end in ranges:
        _check_key(begin)
        _check_key(end)
        if begin < end:
            wanted.append((begin, end))
    return wanted


def _ranges_statement(
    template: str, part: Sequence[tuple[bytes, bytes]]
) -> tuple[str, tuple[bytes, ...]]:
    """`template` with its {} the condition "key in any of these ranges", and the bounds."""
    condition = " OR ".join(["(key >= ? AND key < ?)"] * len(part))
    return template.format(condition), tuple(bound for pair in part for bound in pair)


_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

# Primary result codes (the low byte of an extended code) that mean "another connection
# holds a lock right now": the transaction can be retried from the start.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

# Backoff between retries: starts at 1 ms, doubles, capped so that a waiter notices a free
# lock soon after it is released; half of each delay is random so that competing
# processes do not retry in lock-step.
_BACKOFF_FIRST = 0.001
_BACKOFF_CAP = 0.05


class _Retry(KVError):
    """SQLite said BUSY/LOCKED: roll back and run the whole transaction function again."""


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    # Only reached if the driver gave no code; these are SQLite's messages for the two.
    message = str(exc)
    return "database is locked" in message or "database table is locked" in message


def _wrap(exc: sqlite3.Error) -> KVError:
    if _is_busy(exc):
        return _Retry(f"SQLite busy: {exc}")
    return KVError(f"SQLite error: {exc}")


def _check_key(key: object) -> None:
    if type(key) is not bytes:
        raise TypeError(f"keys must be bytes, not {type(key).__name__}")


# One writer lock per database file per process, shared by every SQLiteKV opened on it,
# so that in-process writers queue here instead of in SQLite's sleeping busy handler.
_WRITE_LOCKS: dict[str, threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock_for(path: str) -> threading.Lock:
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(path)
        if lock is None:
            lock = _WRITE_LOCKS[path] = threading.Lock()
        return lock


_PROCESS_LOCK_PAUSE = 0.001  # the longest pause between two tries of the lock file


class _ProcessLock:
    """A store's hold on its database's lock file, the writers' queue across processes
    (`flock`; every store has a descriptor of its own, and the in-process lock taken
    first makes sure that only one of a process's stores waits for it at a time)."""

    def __init__(self, path: str) -> None:
        self._guard = threading.Lock()  # the descriptor is not closed under a flock call
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire(self, deadline: float) -> None:
        """Take the lock file, or raise KVError at the deadline."""
        pause = _PROCESS_LOCK_PAUSE / 8
        while not self._try():
            if time.monotonic() + pause > deadline:
                raise KVError("timed out waiting for another process's SQLite writer lock")
            time.sleep(pause)
            pause = min(pause * 2, _PROCESS_LOCK_PAUSE)

    def _try(self) -> bool:
        with self._guard:
            if self._fd is None:  # closed: SQLite's own lock still excludes the others
                return True
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    def release(self) -> None:
        with self._guard:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # a transaction still running keeps SQLite's lock until it ends

    def __del__(self) -> None:  # a store dropped unclosed does not keep its descriptor
        self.close()


class _ReadTx:
    """A `ReadTransaction` bound to one SQLite transaction on one connection."""

    __slots__ = ("_conn", "_open", "_error")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._open = True
        # The first SQLite error seen by any operation. Remembered so that the runner
        # retries (BUSY) or fails even if the transaction function swallowed the exception.
        self._error: sqlite3.Error | None = None

    def _execute(self, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
        if not self._open:
            raise KVError("transaction used after its function returned")
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            if self._error is None:
                self._error = exc
            raise _wrap(exc) from exc

    def get(self, key: bytes) -> bytes | None:
        _check_key(key)
        row = self._execute(_GET, (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of each key, in order (None: missing): one statement per `MANY`."""
        found: dict[bytes, bytes] = {}
        unique = list(dict.fromkeys(keys))
        for key in unique:
            _check_key(key)
        for part in _parts(unique):
            found.update(self._pairs(_GET_MANY.format(",".join("?" * len(part))), tuple(part)))
        return [found.get(key) for key in keys]

    def _pairs(self, sql: str, params: tuple[object, ...]) -> list[tuple[bytes, bytes]]:
        """The (key, value) rows of `sql`, read as one row (`_AS_ONE_ROW`), in no
        particular order."""
        keys_hex, values_hex = self._execute(_AS_ONE_ROW.format(sql), params).fetchone()
        if keys_hex is None:
            return []
        return list(
            zip(
                map(bytes.fromhex, keys_hex.split(",")),
                map(bytes.fromhex, values_hex.split(",")),
                strict=True,
            )
        )

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with begin <= key < end, in key order (descending if reverse); limit 0 = all."""
        _check_key(begin)
        _check_key(end)
        if limit < 0:
            raise ValueError("limit must be >= 0 (0 means no limit)")
        if begin >= end:
            return []
        sql = _RANGE_REVERSE if reverse else _RANGE
        if limit == 1:  # one row either way: the plain query costs less
            # Keys and values are stored as BLOBs, which sqlite3 answers as bytes.
            rows: list[tuple[bytes, bytes]] = self._execute(sql, (begin, end, 1)).fetchall()
            return rows
        rows = []
        while True:
            want = _PAGE if limit == 0 else min(_PAGE, limit - len(rows))
            page = self._pairs(sql, (begin, end, want))
            page.sort(reverse=reverse)  # keys are unique: the pairs sort by key
            rows += page
            if len(page) < want or len(rows) == limit:
                return rows
            if reverse:
                end = page[-1][0]
            else:
                begin = page[-1][0] + b"\x00"

    def get_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        """The pairs of each range, read with one statement per `MANY` ranges as one row
        (`_AS_ONE_ROW`): a statement per range would give up the GIL and wait to take it
        back once per range. The whole answer is one row, so the ranges must hold few
        pairs together (SQLite's limit for a string is 1 GB)."""
        found: dict[bytes, bytes] = {}
        for part in _parts(_nonempty(ranges)):
            found.update(self._pairs(*_ranges_statement(_RANGES, part)))
        pairs = sorted(found.items())
        keys = [key for key, _value in pairs]
        return [
            pairs[bisect.bisect_left(keys, begin) : bisect.bisect_left(keys, end)]
            if begin < end
            else []
            for begin, end in ranges
        ]


class _Tx(_ReadTx):
    """A read-write `Transaction`: its writes are visible to its own later reads.

    An `add` is kept as a delta per key until something reads or writes that key, or
    the transaction commits: then one read and one write apply the deltas summed (the
    same value as applying each in turn, since the sum wraps modulo 2**64 either way).
    A transaction that counts the same tallies many times (a group of flushes, a step of
    retention or of deletions) writes each once."""

    __slots__ = ("_adds",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self._adds: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._adds:
            self._apply_many((key,))
        return super().get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._apply_many(keys)
        return super().get_many(keys)

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        self._apply_many(self._pending_in(begin, end))
        return super().get_range(begin, end, limit=limit, reverse=reverse)

    def get_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        self._apply_many([key for begin, end in ranges for key in self._pending_in(begin, end)])
        return super().get_ranges(ranges)

    def set(self, key: bytes, value: bytes) -> None:
        _check_key(key)
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"values must be bytes, not {type(value).__name__}")
        self._adds.pop(key, None)  # the value set replaces whatever was added
        self._execute(_SET, (key, value))

    def clear(self, key: bytes) -> None:
        _check_key(key)
        self._adds.pop(key, None)
        self._execute(_CLEAR, (key,))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key with begin <= key < end."""
        _check_key(begin)
        _check_key(end)
        if begin < end:
            for key in self._pending_in(begin, end):
                del self._adds[key]
            self._execute(_CLEAR_RANGE, (begin, end))

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """One statement per `MANY` pairs; of a key given twice, the last value stays."""
        last: dict[bytes, bytes] = {}
        for key, value in items:
            _check_key(key)
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"values must be bytes, not {type(value).__name__}")
            self._adds.pop(key, None)
            last[key] = value
        for part in _parts(list(last.items())):
            sql = _SET_MANY.format(",".join(["(?, ?)"] * len(part)))
            self._execute(sql, tuple(item for pair in part for item in pair))

    def clear_many(self, keys: Sequence[bytes]) -> None:
        unique = list(dict.fromkeys(keys))
        for key in unique:
            _check_key(key)
            self._adds.pop(key, None)
        for part in _parts(unique):
            self._execute(_CLEAR_MANY.format(",".join("?" * len(part))), tuple(part))

    def clear_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> None:
        """One statement per `MANY` ranges."""
        wanted = _nonempty(ranges)
        for begin, end in wanted:
            for key in self._pending_in(begin, end):
                del self._adds[key]
        for part in _parts(wanted):
            self._execute(*_ranges_statement(_CLEAR_RANGES, part))

    def add(self, key: bytes, delta: int) -> None:
        """FDB atomic ADD: value += delta as little-endian i64, missing = 0, wrapping."""
        _check_key(key)
        if not _I64_MIN <= delta <= _I64_MAX:
            raise ValueError(f"add: delta {delta} is outside the signed 64-bit range")
        if not self._open:
            raise KVError("transaction used after its function returned")
        self._adds[key] = self._adds.get(key, 0) + delta

    def _pending_in(self, begin: bytes, end: bytes) -> list[bytes]:
        """The keys with deltas not yet written, begin <= key < end."""
        return [k for k in self._adds if begin <= k < end]

    def _apply_many(self, keys: Sequence[bytes]) -> None:
        """Write the deltas of those of the keys that have one: read together, written
        together."""
        if not self._adds:  # the common case: no pass over the keys
            return
        pending = [(key, self._adds.pop(key)) for key in dict.fromkeys(keys) if key in self._adds]
        if not pending:
            return
        values = super().get_many([key for key, _delta in pending])
        self.set_many(
            [
                (key, _added(value, delta))
                for (key, delta), value in zip(pending, values, strict=True)
            ]
        )

    def _before_commit(self) -> None:
        """Write the deltas no read or write has applied yet."""
        self._apply_many(list(self._adds))


def _added(value: bytes | None, delta: int) -> bytes:
    """The value after an atomic ADD of delta: wrapped into [-2**63, 2**63) like a
    two's-complement 64-bit add."""
    total = decode_i64(value) + delta
    return encode_i64(((total - _I64_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _I64_MIN)


class _Pool:
    """At most `size` connections, each lent to one thread at a time (LIFO: warm first)."""

    def __init__(self, factory: Callable[[], sqlite3.Connection], size: int) -> None:
        self._factory = factory
        self._size = size
        self._idle: list[sqlite3.Connection] = []
        self._created = 0
        self._closed = False
        self._cond = threading.Condition(threading.Lock())
        # SQLite connections must not cross fork(): the child would share their file
        # descriptors and lock bookkeeping with the parent.
        self._pid = os.getpid()

    def acquire(self, deadline: float) -> sqlite3.Connection:
        with self._cond:
            while True:
                if self._closed:
                    raise KVError("the SQLite KV store is closed")
                if os.getpid() != self._pid:
                    raise KVError("SQLiteKV was opened before fork(): open it in this process")
                if self._idle:
                    return self._idle.pop()
                if self._created < self._size:
                    self._created += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KVError("no SQLite connection became free before the deadline")
                self._cond.wait(remaining)
        # Connect outside the pool lock: opening may wait on another process's lock.
        try:
            return self._factory()
        except BaseException:
            with self._cond:
                self._created -= 1
                self._cond.notify()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int:
        """The process the pool was opened in."""
        return self._pid

    def release(self, conn: sqlite3.Connection, *, broken: bool = False) -> None:
        with self._cond:
            keep = not (broken or self._closed)
            if keep:
                self._idle.append(conn)
            else:
                self._created -= 1
            self._cond.notify()
        if not keep:
            conn.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._created -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


class _Checkpoints:
    """The store's checkpoint thread: started with its first connection, ended by close
    or, for a store dropped without it, once the store is collected (it holds the store
    weakly)."""

    def __init__(self, store: SQLiteKV, interval: float) -> None:
        self._store = weakref.ref(store)
        self._path = store.path
        self._interval = interval
        self._closed = threading.Event()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._guard:
            if self._thread is not None or self._closed.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        while not self._closed.wait(self._interval):
            store = self._store()
            if store is None:
                break
            try:
                if conn is None:
                    # timeout=0: SQLite's busy wait off, as a passive checkpoint never waits.
                    conn = sqlite3.connect(self._path, timeout=0, isolation_level=None)
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                store.stats["checkpoints"] += 1
            except sqlite3.Error as exc:
                # Busy (another process checkpoints) or a failing disk, which the commits
                # report themselves: try again next time, on a new connection.
                logger.debug("SQLite checkpoint of %s failed: %s", self._path, exc)
                if conn is not None:
                    conn.close()
                    conn = None
            del store  # not held while waiting: a store dropped unclosed can be collected
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        with self._guard:
            thread = self._thread
        if thread is not None:
            thread.join()


class _AnyioThreads:
    """Worker threads of anyio, at most `size` calls at once."""

    def __init__(self, size: int, name: str) -> None:
        self._limiter = anyio.CapacityLimiter(size)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(
            fn, *args, abandon_on_cancel=False, limiter=self._limiter
        )


class SQLiteKV:
    """The `KV` store in one SQLite file, shared safely by threads and processes.

    `path` is a file path (parent folders are created). `pool_size` bounds the connections
    and the worker threads used by `transact`/`read` (quick reads on the calling thread
    have one more connection of their own); it is small on purpose: SQLite has one
    writer and Python one GIL, so more threads add contention, not throughput, and a few
    are enough for reads to overlap a commit's fsync. `busy_timeout` is how long SQLite
    itself waits for another process's lock in one attempt; `retry_deadline` is how long a
    transaction keeps being retried before `KVError`. `checkpoint_interval` is the time in
    seconds between two checkpoints of the store's own thread (None: SQLite's automatic
    checkpoints inside commits).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pool_size: int = 4,
        busy_timeout: float = 5.0,
        retry_deadline: float = 30.0,
        threads: ThreadsFactory | None = None,
        checkpoint_interval: float | None = 0.2,
    ) -> None:
        path = os.fspath(path)
        if not path or path == ":memory:" or path.startswith("file:"):
            # Each pooled connection would get its own private in-memory database.
            raise ValueError(f"SQLiteKV needs a file path, got {path!r}")
        if pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        if checkpoint_interval is not None and not checkpoint_interval > 0:
            raise ValueError("checkpoint_interval must be > 0 seconds, or None")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._busy_timeout = busy_timeout
        self._retry_deadline = retry_deadline
        self._write_lock = _write_lock_for(os.path.realpath(path))
        self._process_lock = _ProcessLock(path + "-writer-lock")
        self._pool = _Pool(self._connect, pool_size)
        # The connection of quick reads, outside the pool: opened once (in a worker
        # thread) with SQLite's busy wait off for good, used by one thread at a time.
        self._quick: sqlite3.Connection | None = None
        self._quick_lock = threading.Lock()
        self._threads: Threads = (threads or _AnyioThreads)(pool_size, "sqlite")
        self._schema_ready = False
        self._schema_guard = threading.Lock()
        # Counters for benchmarks; plain ints updated under the GIL. `quick_reads` counts
        # the reads (also in `reads`) that ran on the calling thread.
        self.stats: dict[str, int] = {
            "commits": 0,
            "reads": 0,
            "quick_reads": 0,
            "retries": 0,
            "checkpoints": 0,
        }
        self._checkpoints = (
            None if checkpoint_interval is None else _Checkpoints(self, checkpoint_interval)
        )

    @property
    def path(self) -> str:
        return self._path

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: the driver never opens transactions by itself; we issue
        # BEGIN/COMMIT/ROLLBACK explicitly.
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=32,
        )
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise KVError(f"SQLite refused WAL mode for {self._path!r} (got {mode!r})")
            conn.execute("PRAGMA synchronous=FULL")
            if self._checkpoints is not None:
                conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_BACKSTOP_PAGES}")
            # Shrink the WAL back after a large transaction instead of keeping its peak size.
            conn.execute("PRAGMA journal_size_limit=67108864")
            with self._schema_guard:
                if not self._schema_ready:
                    conn.execute(_SCHEMA)
                    self._schema_ready = True
        except BaseException:
            conn.close()
            raise
        if self._checkpoints is not None:
            self._checkpoints.start()
        return conn

    # -- running transactions ----------------------------------------------------------

    def _run(self, fn: Callable[[TxT], T], make_tx: Callable[[sqlite3.Connection], TxT]) -> T:
        deadline = time.monotonic() + self._retry_deadline
        delay = _BACKOFF_FIRST
        while True:
            try:
                return self._attempt(fn, make_tx, deadline)
            except _Retry as exc:
                self.stats["retries"] += 1
                pause = delay / 2 + random.uniform(0.0, delay / 2)
                if time.monotonic() + pause > deadline:
                    raise KVError(
                        f"SQLite stayed busy for {self._retry_deadline:g} s: {exc}"
                    ) from exc.__cause__
                time.sleep(pause)
                delay = min(delay * 2, _BACKOFF_CAP)

    def _attempt(
        self,
        fn: Callable[[TxT], T],
        make_tx: Callable[[sqlite3.Connection], TxT],
        deadline: float,
    ) -> T:
        write = make_tx is _Tx
        try:
            conn = self._pool.acquire(deadline)
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc
        broken = [False]
        locked = False
        try:
            if write:
                if not self._write_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise KVError("timed out waiting for this process's SQLite writer lock")
                try:
                    self._process_lock.acquire(deadline)
                except BaseException:
                    self._write_lock.release()
                    raise
                locked = True  # both held: given back in reverse order below
            return self._once(conn, fn, make_tx, broken)
        finally:
            if locked:
                self._process_lock.release()
                self._write_lock.release()
            self._pool.release(conn, broken=broken[0])

    def _once(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[TxT], T],
        make_tx: Callable[[sqlite3.Connection], TxT],
        broken: list[bool],
    ) -> T:
        """BEGIN, fn, COMMIT on conn; on failure roll back (broken[0] = it could not)."""
        write = make_tx is _Tx
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            broken[0] = not self._rollback(conn)
            raise _wrap(exc) from exc
        tr = make_tx(conn)
        try:
            result = fn(tr)
            if isinstance(tr, _Tx):
                tr._before_commit()
        except BaseException as exc:
            tr._open = False
            broken[0] = not self._rollback(conn)
            if isinstance(exc, Exception) and tr._error is not None and _is_busy(tr._error):
                # The function failed because SQLite was busy under it: run it again.
                # (Interrupts and cancellations still propagate.)
                raise _Retry(f"SQLite busy: {tr._error}") from tr._error
            raise
        tr._open = False
        if tr._error is not None:
            # The function swallowed a failed operation; its view may be incomplete,
            # so do not commit what it wrote.
            broken[0] = not self._rollback(conn)
            raise _wrap(tr._error) from tr._error
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # A failed COMMIT leaves the transaction open (BUSY) or already undone.
            broken[0] = not self._rollback(conn)
            raise _wrap(exc) from exc
        self.stats["commits" if write else "reads"] += 1
        return result

    def _open_quick(self) -> None:
        """Open the quick reads' connection (busy wait off); not if the store is closed."""
        if self._quick is not None or self._pool.closed or os.getpid() != self._pool.pid:
            return  # (after fork() the worker thread's attempt refuses the read)
        try:
            conn = self._connect()
        except (sqlite3.Error, KVError):
            return  # quick reads go to a worker thread, whose attempt says what is wrong
        try:
            # SQLite's busy handler would sleep on the calling thread: fail at once instead.
            conn.execute("PRAGMA busy_timeout=0")
        except sqlite3.Error:
            conn.close()
            return  # as above
        with self._quick_lock:
            keep = self._quick is None and not self._pool.closed
            if keep:
                self._quick = conn
        if not keep:
            conn.close()

    def _read_here(self, fn: Callable[[ReadTransaction], T]) -> tuple[bool, T | None]:
        """One read attempt on the calling thread that never waits: (False, None) when the
        quick connection is missing or in use or SQLite is busy, so the caller goes to a
        worker thread."""
        if not self._quick_lock.acquire(blocking=False):
            return False, None
        try:
            conn = self._quick
            if conn is None or os.getpid() != self._pool.pid:
                return False, None
            broken = [False]
            try:
                result = self._once(conn, fn, _ReadTx, broken)
            except _Retry:
                self.stats["retries"] += 1
                return False, None
            except sqlite3.Error as exc:  # stepping a cursor fn read from (not wrapped)
                broken[0] = True
                raise _wrap(exc) from exc
            finally:
                if broken[0]:
                    self._quick = None
                    conn.close()
            self.stats["quick_reads"] += 1
            return True, result
        finally:
            self._quick_lock.release()

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> bool:
        """Roll back if a transaction is open; False if the connection is unusable."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            return False
        return not conn.in_transaction

    # -- the KV interface --------------------------------------------------------------

    def transact_sync(self, fn: Callable[[Transaction], T]) -> T:
        """Run fn in a read-write transaction, retrying it when busy; return its result."""
        return self._run(fn, _Tx)

    def read_sync(self, fn: Callable[[ReadTransaction], T]) -> T:
        """Blocking form of `read`: fn sees one consistent snapshot."""
        return self._run(fn, _ReadTx)

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        """Run fn in a read-write transaction in a worker thread; return its result."""
        # abandon_on_cancel=False: a cancelled caller still waits for the thread, so the
        # transaction ends (commit or rollback) and its connection goes back clean.
        return await self._threads.run(self.transact_sync, fn)

    async def transact_optimistic(
        self, fn: Callable[[Transaction], T], counts: OptimisticCounts | None = None
    ) -> T:
        """fn worked out on a snapshot, the writer lock held only to check its reads and
        apply its writes (`metadata.optimistic`)."""
        return await transact_optimistic(self, fn, counts)

    async def read(self, fn: Callable[[ReadTransaction], T], *, quick: bool = False) -> T:
        """Run fn in a read-only transaction (one snapshot) in a worker thread.

        quick=True (fn does a few point reads and short ranges): try it first on the
        calling thread, which skips two thread switches; if no connection is idle or
        SQLite is busy, it runs in a worker thread as usual.
        """
        if quick:
            if self._quick is None:
                # Once per store, in anyio's own threads: not behind busy pool workers.
                await anyio.to_thread.run_sync(self._open_quick)
            done, result = self._read_here(fn)
            if done:
                return cast(T, result)
        return await self._threads.run(self.read_sync, fn)

    def close(self) -> None:
        """Close idle connections now and busy ones when their transaction ends."""
        self._pool.close()
        self._process_lock.close()
        if self._checkpoints is not None:
            self._checkpoints.close()
        with self._quick_lock:  # a quick read in progress ends first
            conn, self._quick = self._quick, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        # Closing the last connection checkpoints the WAL (file I/O): keep it off the loop.
        await anyio.to_thread.run_sync(self.close)


if TYPE_CHECKING:
    # mypy checks here that SQLiteKV implements the KV protocol.
    _check: KV = SQLiteKV("")
