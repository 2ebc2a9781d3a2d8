"""The FoundationDB backend of the metadata KV store (production).

Rules:

* API version. `fdb.api_version(730)` is selected once per process, before anything else
  uses the client, so that FoundationDB 7.3 clusters work; a process that already selected
  another version is refused. The client library libfdb_c is loaded only then: this module
  imports without it, and opening a store without it raises `KVError` saying so. The
  bindings pass their own header version to libfdb_c, which refuses bindings newer than
  itself: next to a 7.3 client library, install `foundationdb==7.3.*` bindings.
* URLs. `fdb://` opens the default cluster file, `fdb:///path/to/fdb.cluster` that file;
  `?prefix=NAME` picks the store's root (default "bucketlog").
* Key layout. A store lives under the root R = tuple (NAME,): KV key k is FDB key R + k.
  Reads, ranges and clears never leave [R, R + b"\\xff"), and keys starting with b"\\xff"
  are refused, as FoundationDB refuses its system keys. Several bucketlog clusters share one
  FoundationDB *and* one root: every metadata key already starts with the tuple
  ("bucketlog", cluster name) (metadata/keys.py), and that is the per-cluster subspace. A
  separate root keeps whole deployments or test runs apart. R + b"\\xff" + b"m" holds the
  commit markers (below), out of every range a KV user can name.
* Retries follow FoundationDB's rules. Every FDBError (raised by an operation, or recorded
  by the transaction view even when the transaction function swallowed it) goes to
  `tr.on_error(e)`, which backs off and resets the transaction if the error is retryable
  and raises it if not; a non-retryable error becomes `KVError`. An exception of the
  function itself propagates unchanged, without retry. A call has one deadline,
  `timeout` seconds (FDB's transaction timeout option, kept across retries since API 610).
* commit_unknown_result (1021). Each `transact` call has one marker key, unique to the call
  (its time and a random id). Every attempt that commits writes declares a read conflict
  on the marker and writes it with the attempt's number: two attempts of one call thus
  conflict, so at most one of them can ever commit, even one still in flight after 1021.
  After a 1021 the next attempt first reads the marker: if an earlier attempt's number is
  there, that attempt committed and its result is returned without running the function
  again; if not, the function runs again (and its commit conflicts with any late landing
  of the old one). Markers are cleared later: each process clears the markers of its
  finished calls inside its next writing transactions (and on close), and once every 10
  minutes a writing transaction also clears every marker older than an hour (those of
  processes that died before clearing theirs; an hour is far beyond any call's deadline
  and any clock skew between agents).
* FoundationDB's limits are checked before anything is sent: values up to 100,000 bytes,
  keys up to 10,000 bytes (root included), commits up to 10,000,000 bytes
  (`get_approximate_size` before commit). Large commits are refused, never split: split,
  they would not be atomic. One attempt must end within 5 s; after that its reads fail
  with transaction_too_old (1007), which is retried until the call's deadline.
* `transact`/`read` run the function in a worker thread (`anyio.to_thread.run_sync`) with
  a `CapacityLimiter`. A cancelled `await` waits for the thread, so the transaction always
  ends; as after a 1021, a cancelled caller cannot know whether it committed.
* The client's network thread does not survive fork(): a store opened before fork()
  refuses to run in the child.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import anyio.to_thread

from metadata import tuple_layer as kt
from metadata.kv import KVError, encode_i64

if TYPE_CHECKING:
    from metadata.kv import KV, OptimisticCounts, ReadTransaction, Transaction

T = TypeVar("T")

API_VERSION = 730
DEFAULT_PREFIX = "bucketlog"

# FoundationDB's limits (https://apple.github.io/foundationdb/known-limitations.html).
VALUE_SIZE_LIMIT = 100_000
KEY_SIZE_LIMIT = 10_000
TRANSACTION_SIZE_LIMIT = 10_000_000
TRANSACTION_TIME_LIMIT = 5.0  # seconds; enforced by the cluster (error 1007)

# FoundationDB error codes handled by name.
TRANSACTION_TOO_OLD = 1007
NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_TIMED_OUT = 1031
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103

MARKER_GRACE_MS = 3_600_000
SWEEP_INTERVAL = 600.0  # seconds
MARKERS_PER_COMMIT = 64  # finished calls' markers cleared by one writing transaction

LIBFDB_C_MISSING = (
    "the FoundationDB client library libfdb_c is not installed on this machine (or not on "
    "the library path); install the foundationdb-clients package of FoundationDB 7.3 to "
    "use fdb:// metadata URLs"
)

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

_api_lock = threading.Lock()


def select_api_version() -> Any:
    """Select FDB API version 730 once per process; return the `fdb` module, ready to use."""
    import fdb  # the bindings ship no type information (Any to mypy)

    with _api_lock:
        if fdb.is_api_version_selected():
            selected = int(fdb.get_api_version())
            if selected != API_VERSION:
                raise KVError(
                    f"this process already selected FoundationDB API version {selected}; "
                    f"bucketlog needs {API_VERSION}"
                )
            return fdb
        try:
            fdb.api_version(API_VERSION)
        except RuntimeError as exc:
            # libfdb_c refuses bindings whose header version is newer than itself.
            raise KVError(
                f"libfdb_c cannot serve API version {API_VERSION} to the foundationdb "
                f"bindings {fdb.__version__}: {exc}. Install the bindings of libfdb_c's "
                "version (for a 7.3 client library: pip install 'foundationdb==7.3.*')"
            ) from exc
        except Exception as exc:  # fdb.impl raises a bare Exception when the library is absent
            raise KVError(f"{LIBFDB_C_MISSING} ({exc})") from exc
        return fdb


def parse_fdb_url(url: str) -> tuple[str | None, str]:
    """(cluster file or None for the default one, root prefix) of an fdb:// URL."""
    if not url.startswith("fdb://"):
        raise KVError(f"not a FoundationDB URL: {url!r}")
    path, _, query = url[len("fdb://") :].partition("?")
    cluster_file = urllib.parse.unquote(path) or None
    prefix = DEFAULT_PREFIX
    if query:
        try:
            params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=True)
        except ValueError as exc:
            raise KVError(f"bad query in FoundationDB URL {url!r}: {exc}") from exc
        unknown = sorted(set(params) - {"prefix"})
        if unknown:
            raise KVError(f"unknown option(s) {unknown} in FoundationDB URL {url!r}")
        values = params.get("prefix", [])
        if len(values) != 1 or not values[0] or "\x00" in values[0]:
            raise KVError(f"FoundationDB URL {url!r}: prefix must be one non-empty name")
        prefix = values[0]
    return cluster_file, prefix


def _check_key(key: object) -> None:
    if type(key) is not bytes:
        raise TypeError(f"keys must be bytes, not {type(key).__name__}")


class _ReadView:
    """A `ReadTransaction` over one FDB transaction, inside the store's root."""

    __slots__ = ("_tr", "_root", "_error_type", "_open", "error")

    def __init__(self, tr: Any, root: bytes, error_type: type[BaseException]) -> None:
        self._tr = tr
        self._root = root
        self._error_type = error_type
        self._open = True
        # The first FDBError of any operation: the runner hands it to on_error even if the
        # transaction function swallowed it.
        self.error: BaseException | None = None

    def _call(self, op: Callable[[], T]) -> T:
        if not self._open:
            raise KVError("transaction used after its function returned")
        try:
            return op()
        except self._error_type as exc:
            if self.error is None:
                self.error = exc
            raise

    def _key(self, key: bytes) -> bytes:
        _check_key(key)
        if key.startswith(b"\xff"):
            raise KVError(f"keys starting with 0xff are reserved: {key[:32]!r}")
        full = self._root + key
        if len(full) > KEY_SIZE_LIMIT:
            raise KVError(
                f"key of {len(key)} bytes is over FoundationDB's key limit "
                f"({KEY_SIZE_LIMIT} bytes with the {len(self._root)}-byte root)"
            )
        return full

    def _bound(self, key: bytes) -> bytes:
        # Range bounds past the user key space stop at its end: R + 0xff.
        _check_key(key)
        return self._root + min(key, b"\xff")

    def get(self, key: bytes) -> bytes | None:
        full = self._key(key)

        def op() -> bytes | None:
            value = self._tr.get(full).wait()
            return None if value.value is None else bytes(value.value)

        return self._call(op)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of each key, in order (None: missing): the reads in flight together."""
        fulls = [self._key(key) for key in keys]

        def op() -> list[bytes | None]:
            futures = [self._tr.get(full) for full in fulls]
            values = [future.wait() for future in futures]
            return [None if v.value is None else bytes(v.value) for v in values]

        return self._call(op)

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with begin <= key < end, in key order (descending if reverse); limit 0 = all."""
        b, e = self._bound(begin), self._bound(end)
        if limit < 0:
            raise ValueError("limit must be >= 0 (0 means no limit)")
        if b >= e:
            return []
        cut = len(self._root)

        def op() -> list[tuple[bytes, bytes]]:
            rows = self._tr.get_range(b, e, limit=limit, reverse=reverse).to_list()
            return [(bytes(kv.key)[cut:], bytes(kv.value)) for kv in rows]

        return self._call(op)

    def get_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        """`get_range` of each range in turn."""
        return [self.get_range(begin, end) for begin, end in ranges]


class _WriteView(_ReadView):
    """A read-write `Transaction`: its writes are visible to its own later reads."""

    __slots__ = ("wrote",)

    def __init__(self, tr: Any, root: bytes, error_type: type[BaseException]) -> None:
        super().__init__(tr, root, error_type)
        self.wrote = False

    def set(self, key: bytes, value: bytes) -> None:
        full = self._key(key)
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"values must be bytes, not {type(value).__name__}")
        data = bytes(value)
        if len(data) > VALUE_SIZE_LIMIT:
            raise KVError(
                f"value of {len(data)} bytes for key {key[:64]!r} is over FoundationDB's "
                f"limit of {VALUE_SIZE_LIMIT} bytes"
            )
        self._call(lambda: self._tr.set(full, data))
        self.wrote = True

    def clear(self, key: bytes) -> None:
        full = self._key(key)
        self._call(lambda: self._tr.clear(full))
        self.wrote = True

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key with begin <= key < end."""
        b, e = self._bound(begin), self._bound(end)
        if b < e:
            self._call(lambda: self._tr.clear_range(b, e))
            self.wrote = True

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for key, value in items:
            self.set(key, value)

    def clear_many(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self.clear(key)

    def clear_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> None:
        for begin, end in ranges:
            self.clear_range(begin, end)

    def add(self, key: bytes, delta: int) -> None:
        """FDB atomic ADD: value += delta as little-endian i64, missing = 0, wrapping."""
        if not _I64_MIN <= delta <= _I64_MAX:
            raise ValueError(f"add: delta {delta} is outside the signed 64-bit range")
        full = self._key(key)
        self._call(lambda: self._tr.add(full, encode_i64(delta)))
        self.wrote = True


@dataclass
class _Call(Generic[T]):
    """One `transact` call across its attempts."""

    marker: bytes
    attempt: int = 0
    # Results of attempts whose commit ended in commit_unknown_result, by attempt number.
    unknown: dict[int, T] = field(default_factory=dict)
    # (attempt, result) while that attempt's commit is in flight.
    committing: tuple[int, T] | None = None
    last_retryable: BaseException | None = None
    # Housekeeping riding on the current attempt: finished calls' markers it clears, and
    # whether it sweeps stale markers.
    clears: list[bytes] = field(default_factory=list)
    sweeps: bool = False


class FDBKV:
    """The `KV` store on a FoundationDB cluster, under one root prefix.

    `cluster_file` None means FoundationDB's default cluster file. `timeout` bounds each
    call, retries included. `max_threads` bounds the worker threads of `transact`/`read`.
    `database` and `error_type` take an already open `fdb` Database and `fdb.FDBError`
    (tests pass a stand-in for both; then nothing loads libfdb_c).
    """

    def __init__(
        self,
        cluster_file: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 30.0,
        max_threads: int = 32,
        database: Any = None,
        error_type: type[BaseException] | None = None,
    ) -> None:
        if not prefix or "\x00" in prefix:
            raise ValueError(f"prefix must be a non-empty name without NUL, got {prefix!r}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if max_threads < 1:
            raise ValueError("max_threads must be >= 1")
        if database is None:
            fdb = select_api_version()
            try:
                database = fdb.open(cluster_file)
            except fdb.FDBError as exc:
                where = cluster_file or "the default cluster file"
                raise KVError(f"cannot open FoundationDB through {where}: {exc}") from exc
            error_type = fdb.FDBError
        if error_type is None:
            raise ValueError("a given database needs its error_type")
        self._db = database
        self._error_type: type[BaseException] = error_type
        self._cluster_file = cluster_file
        self._prefix = prefix
        self._root = kt.pack((prefix,))
        self._markers = self._root + b"\xffm"
        self._timeout_ms = max(1, int(timeout * 1000))
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()
        self._to_clear: dict[bytes, None] = {}  # markers of finished calls, oldest first
        self._last_sweep = float("-inf")

    @classmethod
    def from_url(cls, url: str) -> FDBKV:
        cluster_file, prefix = parse_fdb_url(url)
        return cls(cluster_file, prefix=prefix)

    def __repr__(self) -> str:
        return f"FDBKV({self._cluster_file or 'default cluster file'}, prefix={self._prefix!r})"

    @property
    def root(self) -> bytes:
        """The FDB key prefix of this store's keys."""
        return self._root

    # -- running transactions ----------------------------------------------------------

    def _begin(self) -> Any:
        if self._closed:
            raise KVError("the FoundationDB KV store is closed")
        if os.getpid() != self._pid:
            raise KVError("FDBKV was opened before fork(): open it in this process")
        tr = self._db.create_transaction()
        tr.options.set_timeout(self._timeout_ms)
        return tr

    def _run_fn(self, fn: Callable[[Any], T], view: _ReadView) -> T:
        try:
            result = fn(view)
        except Exception as exc:
            view._open = False
            if view.error is not None and view.error is not exc:
                # The function failed because the store did: retry by FDB's rules.
                raise view.error from exc
            raise
        except BaseException:
            view._open = False
            raise
        view._open = False
        if view.error is not None:
            # The function swallowed a failed operation; its view may be incomplete.
            raise view.error
        return result

    def _retry_or_raise(self, tr: Any, exc: BaseException, call: _Call[Any] | None) -> None:
        """Back off and reset tr if exc is retryable (FDB's on_error); else raise KVError."""
        try:
            tr.on_error(exc).wait()
        except self._error_type as fatal:
            raise self._fatal(fatal, call) from fatal
        if call is not None:
            call.last_retryable = exc

    def _fatal(self, exc: BaseException, call: _Call[Any] | None) -> KVError:
        code = int(getattr(exc, "code", 0))
        text = f"FoundationDB error {code}: {getattr(exc, 'description', exc)}"
        if code == TRANSACTION_TIMED_OUT:
            text += f" (the call did not finish within {self._timeout_ms / 1000:g} s"
            last = call.last_retryable if call is not None else None
            if last is not None:
                last_code = int(getattr(last, "code", 0))
                text += f"; last retried error: {last_code}"
                if last_code == TRANSACTION_TOO_OLD:
                    text += ", an attempt ran past FoundationDB's 5 s transaction limit"
            text += ")"
        elif code == TRANSACTION_TOO_LARGE:
            text += f" (a commit is limited to {TRANSACTION_SIZE_LIMIT:,} bytes)"
        if call is not None and call.unknown:
            text += "; an earlier attempt ended in commit_unknown_result and may have committed"
        return KVError(text)

    def _attempt_write(self, tr: Any, fn: Callable[[Transaction], T], call: _Call[T]) -> T:
        if call.unknown:
            landed = self._landed_attempt(tr, call.marker)
            if landed is not None:
                if landed not in call.unknown:
                    raise KVError(f"commit marker names attempt {landed}, which never committed")
                return call.unknown[landed]
        view = _WriteView(tr, self._root, self._error_type)
        result = self._run_fn(fn, view)
        if not view.wrote and not call.unknown:
            return result  # read only: nothing to commit
        tr.add_read_conflict_key(call.marker)
        tr.set(call.marker, str(call.attempt).encode())
        self._housekeeping(tr, call)
        size = int(tr.get_approximate_size().wait())
        if size > TRANSACTION_SIZE_LIMIT:
            raise KVError(
                f"transaction of about {size:,} bytes is over FoundationDB's commit limit of "
                f"{TRANSACTION_SIZE_LIMIT:,} bytes; nothing was sent (split the work into "
                "smaller transactions)"
            )
        call.committing = (call.attempt, result)
        tr.commit().wait()
        return result

    def _landed_attempt(self, tr: Any, marker: bytes) -> int | None:
        """The attempt number stored in the call's marker, if an attempt committed."""
        value = tr.get(marker).wait()
        return None if value.value is None else int(bytes(value.value))

    def _housekeeping(self, tr: Any, call: _Call[Any]) -> None:
        """Clear markers of finished calls (and, now and then, stale ones) in tr."""
        with self._lock:
            call.clears = list(self._to_clear)[:MARKERS_PER_COMMIT]
            call.sweeps = time.monotonic() - self._last_sweep >= SWEEP_INTERVAL
        for marker in call.clears:
            tr.clear(marker)
        if call.sweeps:
            cutoff = max(0, int(time.time() * 1000) - MARKER_GRACE_MS)
            tr.clear_range(self._markers, self._markers + cutoff.to_bytes(8, "big"))

    def _finished(self, call: _Call[Any], *, committed: bool) -> None:
        """Note what this call's commit cleaned, and that its own marker is now due."""
        with self._lock:
            if committed:
                for marker in call.clears:
                    self._to_clear.pop(marker, None)
                if call.sweeps:
                    self._last_sweep = time.monotonic()
            if committed or call.unknown:
                self._to_clear[call.marker] = None

    def _new_marker(self) -> bytes:
        now_ms = int(time.time() * 1000)
        return self._markers + now_ms.to_bytes(8, "big") + uuid.uuid4().bytes

    # -- the KV interface --------------------------------------------------------------

    def transact_sync(self, fn: Callable[[Transaction], T]) -> T:
        """Run fn in a read-write transaction, retrying it by FDB's rules; return its result."""
        tr = self._begin()
        call: _Call[T] = _Call(self._new_marker())
        while True:
            call.attempt += 1
            call.committing = None
            call.clears, call.sweeps = [], False
            try:
                result = self._attempt_write(tr, fn, call)
            except self._error_type as exc:
                if int(getattr(exc, "code", 0)) == COMMIT_UNKNOWN_RESULT and call.committing:
                    attempt, pending = call.committing
                    call.unknown[attempt] = pending
                self._retry_or_raise(tr, exc, call)
                continue
            self._finished(call, committed=call.committing is not None)
            return result

    def read_sync(self, fn: Callable[[ReadTransaction], T]) -> T:
        """Blocking form of `read`: fn sees one consistent snapshot (one read version)."""
        tr = self._begin()
        call: _Call[T] = _Call(b"")
        while True:
            try:
                return self._run_fn(fn, _ReadView(tr, self._root, self._error_type))
            except self._error_type as exc:
                self._retry_or_raise(tr, exc, call)

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        """Run fn in a read-write transaction in a worker thread; return its result."""
        return await anyio.to_thread.run_sync(
            self.transact_sync, fn, abandon_on_cancel=False, limiter=self._limiter
        )

    async def transact_optimistic(
        self, fn: Callable[[Transaction], T], counts: OptimisticCounts | None = None
    ) -> T:
        """`transact(fn)`: a FoundationDB commit already checks what fn read, and no
        writer lock is held meanwhile (counts is left as it is)."""
        return await self.transact(fn)

    async def read(self, fn: Callable[[ReadTransaction], T], *, quick: bool = False) -> T:
        """Run fn in a read-only transaction (one snapshot) in a worker thread.

        `quick` is ignored: every FoundationDB read is a network round trip."""
        return await anyio.to_thread.run_sync(
            self.read_sync, fn, abandon_on_cancel=False, limiter=self._limiter
        )

    def close(self) -> None:
        """Clear this process's leftover commit markers (best effort), then refuse calls."""
        if self._closed:
            return
        with self._lock:
            leftover = list(self._to_clear)
        if leftover and os.getpid() == self._pid:
            try:
                self._clear_markers(leftover)
            except KVError:
                pass  # the hourly sweep of any writing agent removes them
        self._closed = True

    def _clear_markers(self, markers: list[bytes]) -> None:
        # Not through transact_sync: a writing call would leave a marker of its own.
        tr = self._begin()
        while True:
            try:
                for marker in markers:
                    tr.clear(marker)
                tr.commit().wait()
                break
            except self._error_type as exc:
                self._retry_or_raise(tr, exc, None)
        with self._lock:
            for marker in markers:
                self._to_clear.pop(marker, None)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close, limiter=self._limiter)


if TYPE_CHECKING:
    # mypy checks here that FDBKV implements the KV protocol.
    _check: KV = FDBKV()
