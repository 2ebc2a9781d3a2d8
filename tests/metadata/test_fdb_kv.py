"""The FoundationDB backend's own logic, on a stand-in for the `fdb` client API.

No FoundationDB can run on this machine (libfdb_c and fdbserver are not installable from
the registries here), so these tests use a test double: `FakeDatabase` mimics the parts
of fdb's Python API the backend calls (create_transaction, get/get_range/set/clear/
clear_range/add, add_read_conflict_key, get_approximate_size, commit, on_error, futures
with wait(), FDBError codes) with FoundationDB's optimistic concurrency: a read version
per transaction, read-your-writes, and a commit refused (1020) when a key it read was
written after its read version. Commits can be scripted to end in commit_unknown_result
having landed, having been lost, or landing later. The double is only for the logic FDB
cannot be made to show on demand (1021, timeouts, limits); the proof that the backend
works on FoundationDB is the KV contract suite (test_kv_contract.py), whose FDB run
starts a real fdbserver on the first machine that has one.

URL parsing, the API-version guard and the "libfdb_c is missing" error run for real.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from metadata import tuple_layer as kt
from metadata.fdb_kv import (
    API_VERSION,
    FDBKV,
    KEY_SIZE_LIMIT,
    MARKER_GRACE_MS,
    TRANSACTION_SIZE_LIMIT,
    VALUE_SIZE_LIMIT,
    parse_fdb_url,
    select_api_version,
)
from metadata.kv import KVError, Transaction, decode_i64, encode_i64, open_kv
from tests.support import fdb_server

# -- the test double ----------------------------------------------------------------------

DESCRIPTIONS = {
    1007: "Transaction is too old to perform reads or be committed",
    1020: "Transaction not committed due to conflict with another transaction",
    1021: "Transaction may or may not have committed",
    1031: "Operation aborted because the transaction timed out",
    2101: "Transaction exceeds byte limit",
    1500: "Platform error",
}
RETRYABLE = {1007, 1020, 1021}


class FakeFDBError(Exception):
    """Like fdb.FDBError: an error code and its description."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
        self.description = DESCRIPTIONS.get(code, "error")


class FakeFuture:
    def __init__(self, value: Any = None, error: int | None = None) -> None:
        self._value = value
        self._error = error

    def wait(self) -> Any:
        if self._error is not None:
            raise FakeFDBError(self._error)
        return self._value


class FakeValue:
    """Like fdb's Value future: wait() returns itself; .value is bytes or None."""

    def __init__(self, value: bytes | None, error: int | None = None) -> None:
        self.value = value
        self._error = error

    def wait(self) -> FakeValue:
        if self._error is not None:
            raise FakeFDBError(self._error)
        return self

    def present(self) -> bool:
        return self.value is not None


class FakeKeyValue:
    def __init__(self, key: bytes, value: bytes) -> None:
        self.key = key
        self.value = value


class FakeRange:
    def __init__(self, rows: list[FakeKeyValue]) -> None:
        self._rows = rows

    def to_list(self) -> list[FakeKeyValue]:
        return list(self._rows)


class FakeOptions:
    def __init__(self) -> None:
        self.timeout_ms: int | None = None

    def set_timeout(self, ms: int) -> None:
        self.timeout_ms = ms


def _overlaps(a: tuple[bytes, bytes], b: tuple[bytes, bytes]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _apply(data: dict[bytes, bytes], mutations: list[tuple[Any, ...]]) -> dict[bytes, bytes]:
    out = dict(data)
    for m in mutations:
        if m[0] == "set":
            out[m[1]] = m[2]
        elif m[0] == "clear":
            out.pop(m[1], None)
        elif m[0] == "clear_range":
            for k in [k for k in out if m[1] <= k < m[2]]:
                del out[k]
        elif m[0] == "add":  # FDB ADD: little-endian, existing value fitted to param's length
            param: bytes = m[2]
            width = len(param)
            old = out.get(m[1], b"").ljust(width, b"\x00")[:width]
            total = int.from_bytes(old, "little") + int.from_bytes(param, "little")
            out[m[1]] = (total % (1 << (8 * width))).to_bytes(width, "little")
    return out


class FakeDatabase:
    """Versions, conflict detection and scripted commit outcomes, in memory.

    `outcomes` is consumed one per commit: "ok", "landed" (applied, answers 1021), "lost"
    (not applied, answers 1021), "later" (answers 1021, applied by land_in_flight()),
    "land-first" (lands the in-flight commits, then commits normally), or an error code.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.snapshots: dict[int, dict[bytes, bytes]] = {0: {}}
        self.history: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        self.outcomes: list[str | int] = []
        self.read_errors: list[int] = []  # raised by the next gets, one each
        self.in_flight: list[FakeTransaction] = []
        self.commit_calls = 0

    @property
    def data(self) -> dict[bytes, bytes]:
        return self.snapshots[self.version]

    def create_transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    def try_commit(self, tr: FakeTransaction) -> bool:
        with self.lock:
            for version, written in self.history:
                if version > tr.read_version and any(
                    _overlaps(w, r) for w in written for r in tr.read_ranges
                ):
                    return False
            if tr.mutations:
                applied = _apply(self.data, tr.mutations)
                self.version += 1
                self.snapshots[self.version] = applied
                self.history.append((self.version, list(tr.write_ranges)))
            return True

    def land_in_flight(self) -> list[bool]:
        landed = [self.try_commit(tr) for tr in self.in_flight]
        self.in_flight.clear()
        return landed


class FakeTransaction:
    def __init__(self, db: FakeDatabase) -> None:
        self.db = db
        self.options = FakeOptions()
        self.reset()

    def reset(self) -> None:
        self.read_version = -1
        self.mutations: list[tuple[Any, ...]] = []
        self.read_ranges: list[tuple[bytes, bytes]] = []
        self.write_ranges: list[tuple[bytes, bytes]] = []

    def _state(self) -> dict[bytes, bytes]:
        if self.read_version < 0:
            self.read_version = self.db.version
        return _apply(self.db.snapshots[self.read_version], self.mutations)

    def get(self, key: bytes) -> FakeValue:
        if self.db.read_errors:
            return FakeValue(None, error=self.db.read_errors.pop(0))
        self.read_ranges.append((key, key + b"\x00"))
        return FakeValue(self._state().get(key))

    def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> FakeRange:
        self.read_ranges.append((begin, end))
        rows = sorted((k, v) for k, v in self._state().items() if begin <= k < end)
        if reverse:
            rows.reverse()
        if limit:
            rows = rows[:limit]
        return FakeRange([FakeKeyValue(k, v) for k, v in rows])

    def _write(self, mutation: tuple[Any, ...], begin: bytes, end: bytes) -> None:
        assert all(type(part) is bytes for part in mutation[1:])
        self.mutations.append(mutation)
        self.write_ranges.append((begin, end))

    def set(self, key: bytes, value: bytes) -> None:
        self._write(("set", key, value), key, key + b"\x00")

    def clear(self, key: bytes) -> None:
        self._write(("clear", key), key, key + b"\x00")

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._write(("clear_range", begin, end), begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        self._write(("add", key, param), key, key + b"\x00")

    def add_read_conflict_key(self, key: bytes) -> None:
        self.read_ranges.append((key, key + b"\x00"))

    def get_approximate_size(self) -> FakeFuture:
        size = sum(sum(len(p) for p in m[1:]) for m in self.mutations)
        size += sum(len(b) + len(e) for b, e in self.read_ranges + self.write_ranges)
        return FakeFuture(size)

    def commit(self) -> FakeFuture:
        self.db.commit_calls += 1
        self._state()  # a commit has a read version even without reads
        outcome = self.db.outcomes.pop(0) if self.db.outcomes else "ok"
        if isinstance(outcome, int):
            return FakeFuture(error=outcome)
        if outcome == "land-first":
            self.db.land_in_flight()
            outcome = "ok"
        if outcome == "ok":
            return FakeFuture() if self.db.try_commit(self) else FakeFuture(error=1020)
        if outcome == "landed":
            self.db.try_commit(self)
        elif outcome == "later":
            parked = FakeTransaction(self.db)
            parked.read_version = self.read_version
            parked.mutations = list(self.mutations)
            parked.read_ranges = list(self.read_ranges)
            parked.write_ranges = list(self.write_ranges)
            self.db.in_flight.append(parked)
        return FakeFuture(error=1021)

    def on_error(self, error: FakeFDBError) -> FakeFuture:
        if error.code in RETRYABLE:
            self.reset()
            return FakeFuture()
        return FakeFuture(error=error.code)


# -- fixtures and helpers -----------------------------------------------------------------

ROOT = kt.pack(("t",))


@pytest.fixture
def db() -> FakeDatabase:
    return FakeDatabase()


@pytest.fixture
def kv(db: FakeDatabase) -> Iterator[FDBKV]:
    store = FDBKV(prefix="t", database=db, error_type=FakeFDBError, timeout=5)
    yield store
    store.close()


def user_keys(db: FakeDatabase) -> dict[bytes, bytes]:
    return {
        k[len(ROOT) :]: v
        for k, v in db.data.items()
        if k.startswith(ROOT) and not k.startswith(ROOT + b"\xff")
    }


def markers(db: FakeDatabase) -> list[bytes]:
    return [k for k in db.data if k.startswith(ROOT + b"\xffm")]


class Counting:
    """A transaction function that adds 1 to b"n" blindly and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, tr: Transaction) -> int:
        self.runs += 1
        tr.add(b"n", 1)
        return self.runs


# -- URLs, API version, missing client library (no double) --------------------------------


def test_parse_fdb_url() -> None:
    assert parse_fdb_url("fdb://") == (None, "bucketlog")
    assert parse_fdb_url("fdb:///etc/foundationdb/fdb.cluster") == (
        "/etc/foundationdb/fdb.cluster",
        "bucketlog",
    )
    assert parse_fdb_url("fdb:///var/fdb/fdb.cluster?prefix=prod") == (
        "/var/fdb/fdb.cluster",
        "prod",
    )
    assert parse_fdb_url("fdb://?prefix=a%20b") == (None, "a b")
    assert parse_fdb_url("fdb:///tmp/my%20dir/fdb.cluster") == (
        "/tmp/my dir/fdb.cluster",
        "bucketlog",
    )
    for bad in (
        "fdb://?prefix=",
        "fdb://?prefix=a&prefix=b",
        "fdb://?cluster=x",
        "fdb://?prefix",
        "sqlite:///x.db",
    ):
        with pytest.raises(KVError):
            parse_fdb_url(bad)


@pytest.mark.skipif(fdb_server.libfdb_c_loads(), reason="libfdb_c is installed here")
def test_opening_without_libfdb_c_says_so() -> None:
    for url in ("fdb://", "fdb:///etc/foundationdb/fdb.cluster"):
        with pytest.raises(KVError, match="libfdb_c is not installed"):
            open_kv(url)


def test_api_version_is_selected_once_and_a_different_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fdb  # type: ignore[import-untyped]

    def must_not_be_called(version: int) -> None:
        raise AssertionError("api_version called twice")

    # As if this process had already selected a version (fdb keeps it in `_version`).
    monkeypatch.setattr(fdb, "api_version", must_not_be_called)
    monkeypatch.setattr(fdb, "_version", API_VERSION, raising=False)
    assert select_api_version() is fdb
    monkeypatch.setattr(fdb, "_version", 710, raising=False)
    with pytest.raises(KVError, match="already selected FoundationDB API version 710"):
        select_api_version()


def test_bad_arguments() -> None:
    db = FakeDatabase()
    with pytest.raises(ValueError):
        FDBKV(database=db)  # no error type
    with pytest.raises(ValueError):
        FDBKV(prefix="", database=db, error_type=FakeFDBError)
    with pytest.raises(ValueError):
        FDBKV(prefix="a\x00b", database=db, error_type=FakeFDBError)


# -- the adapter: key layout, reads and writes --------------------------------------------


def test_keys_live_under_the_root_and_markers_stay_out_of_sight(
    kv: FDBKV, db: FakeDatabase
) -> None:
    assert kv.root == ROOT

    def fill(tr: Transaction) -> None:
        for k in (b"a", b"b", b"c\x00", b"\xfe\xff"):
            tr.set(k, k.upper())

    kv.transact_sync(fill)
    stored = sorted(k for k in db.data if not k.startswith(ROOT + b"\xff"))
    assert stored == [ROOT + k for k in (b"a", b"b", b"c\x00", b"\xfe\xff")]
    assert len(markers(db)) == 1  # the call's commit marker, outside [ROOT, ROOT + 0xff)
    everything = kv.read_sync(lambda tr: tr.get_range(b"", b"\xff"))
    assert [k for k, _ in everything] == [b"a", b"b", b"c\x00", b"\xfe\xff"]
    # Bounds past the user key space stop at its end; clearing it all leaves the markers.
    assert kv.read_sync(lambda tr: tr.get_range(b"b", b"\xff\xff")) == everything[1:]
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff\xff"))
    assert kv.read_sync(lambda tr: tr.get_range(b"", b"\xff")) == []
    assert markers(db)


def test_reads_writes_ranges_and_add(kv: FDBKV) -> None:
    def fn(tr: Transaction) -> None:
        for k in (b"a", b"b", b"c", b"d"):
            tr.set(k, k)
        tr.clear(b"b")
        assert tr.get(b"b") is None and tr.get(b"a") == b"a"
        assert tr.get_range(b"a", b"e", limit=2, reverse=True) == [(b"d", b"d"), (b"c", b"c")]
        assert tr.get_range(b"c", b"a") == []
        tr.clear_range(b"c", b"d")
        tr.add(b"n", 5)
        tr.add(b"n", -7)
        assert decode_i64(tr.get(b"n")) == -2

    kv.transact_sync(fn)
    assert kv.read_sync(lambda tr: tr.get_range(b"", b"\xff")) == [
        (b"a", b"a"),
        (b"d", b"d"),
        (b"n", encode_i64(-2)),
    ]
    kv.transact_sync(lambda tr: tr.set(b"top", encode_i64((1 << 63) - 1)))
    kv.transact_sync(lambda tr: tr.add(b"top", 1))  # wraps like i64
    assert decode_i64(kv.read_sync(lambda tr: tr.get(b"top"))) == -(1 << 63)
    with pytest.raises(ValueError):
        kv.transact_sync(lambda tr: tr.add(b"n", 1 << 63))


def test_batched_calls_through_the_views(kv: FDBKV) -> None:
    def fn(tr: Transaction) -> None:
        tr.set_many([(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"a", b"4")])
        assert tr.get_many([b"c", b"x", b"a"]) == [b"3", None, b"4"]
        tr.clear_many([b"b", b"x"])
        tr.clear_ranges([(b"c", b"d"), (b"z", b"y")])

    kv.transact_sync(fn)
    assert kv.read_sync(lambda tr: tr.get_range(b"", b"\xff")) == [(b"a", b"4")]
    assert kv.read_sync(lambda tr: tr.get_many([b"a", b"b"])) == [b"4", None]


def test_keys_and_values_are_checked(kv: FDBKV) -> None:
    with pytest.raises(TypeError):
        kv.transact_sync(lambda tr: tr.set("text", b"v"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kv.transact_sync(lambda tr: tr.set(b"k", "text"))  # type: ignore[arg-type]
    with pytest.raises(KVError, match="reserved"):
        kv.transact_sync(lambda tr: tr.set(b"\xffsystem", b"v"))
    with pytest.raises(ValueError):
        kv.read_sync(lambda tr: tr.get_range(b"a", b"b", limit=-1))
    leaked = kv.transact_sync(lambda tr: tr)
    with pytest.raises(KVError, match="after its function returned"):
        leaked.get(b"k")


def test_read_transactions_cannot_write(kv: FDBKV) -> None:
    with pytest.raises(AttributeError):
        kv.read_sync(lambda tr: tr.set(b"k", b"v"))  # type: ignore[attr-defined]


async def test_async_transact_and_read(kv: FDBKV, db: FakeDatabase) -> None:
    assert await kv.transact(lambda tr: tr.set(b"k", b"v")) is None
    assert await kv.read(lambda tr: tr.get(b"k")) == b"v"
    with pytest.raises(LookupError):
        await kv.read(lambda tr: (_ for _ in ()).throw(LookupError("nope")))


# -- retries by FoundationDB's rules ------------------------------------------------------


def test_conflict_is_retried(kv: FDBKV, db: FakeDatabase) -> None:
    db.outcomes = [1020]
    fn = Counting()
    assert kv.transact_sync(fn) == 2
    assert fn.runs == 2
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_non_retryable_error_becomes_kverror(kv: FDBKV, db: FakeDatabase) -> None:
    db.outcomes = [1500]
    fn = Counting()
    with pytest.raises(KVError, match="FoundationDB error 1500"):
        kv.transact_sync(fn)
    assert fn.runs == 1
    assert kv.read_sync(lambda tr: tr.get(b"n")) is None


def test_deadline_after_too_old_attempts_names_the_5_second_limit(
    kv: FDBKV, db: FakeDatabase
) -> None:
    db.outcomes = [1007, 1007, 1031]
    with pytest.raises(KVError, match="1031.*within 5 s.*1007.*5 s transaction limit"):
        kv.transact_sync(Counting())


def test_the_call_deadline_is_set_on_the_transaction(db: FakeDatabase) -> None:
    seen: list[FakeTransaction] = []
    create = db.create_transaction

    def recording() -> FakeTransaction:
        seen.append(create())
        return seen[-1]

    db.create_transaction = recording  # type: ignore[method-assign]
    store = FDBKV(prefix="t", database=db, error_type=FakeFDBError, timeout=2.5)
    store.transact_sync(lambda tr: tr.set(b"k", b"v"))
    assert seen[0].options.timeout_ms == 2500


def test_function_errors_propagate_unchanged_without_retry(kv: FDBKV, db: FakeDatabase) -> None:
    error = RuntimeError("boom")
    runs = 0

    def fn(tr: Transaction) -> None:
        nonlocal runs
        runs += 1
        tr.set(b"k", b"v")
        raise error

    with pytest.raises(RuntimeError) as caught:
        kv.transact_sync(fn)
    assert caught.value is error and runs == 1
    assert db.commit_calls == 0


def test_a_swallowed_store_error_is_retried_and_never_committed(
    kv: FDBKV, db: FakeDatabase
) -> None:
    db.read_errors = [1007]
    seen: list[bytes | None] = []

    def fn(tr: Transaction) -> None:
        try:
            seen.append(tr.get(b"k"))
        except Exception:
            seen.append(b"failed")
        tr.add(b"n", 1)

    kv.transact_sync(fn)
    assert seen == [b"failed", None]
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1
    assert db.commit_calls == 1  # the attempt that saw the failure did not commit


def test_read_retries_and_sees_one_snapshot(kv: FDBKV, db: FakeDatabase) -> None:
    kv.transact_sync(lambda tr: tr.set(b"k", b"1"))
    db.read_errors = [1007]
    assert kv.read_sync(lambda tr: tr.get(b"k")) == b"1"

    def reader(tr: Any) -> tuple[bytes | None, bytes | None]:
        first = tr.get(b"k")
        kv.transact_sync(lambda w: w.set(b"k", b"2"))  # commits in the middle of the read
        return first, tr.get(b"k")

    assert kv.read_sync(reader) == (b"1", b"1")


# -- commit_unknown_result ----------------------------------------------------------------


def test_unknown_result_that_committed_is_not_applied_twice(kv: FDBKV, db: FakeDatabase) -> None:
    db.outcomes = ["landed"]
    fn = Counting()
    assert kv.transact_sync(fn) == 1  # the first attempt's result
    assert fn.runs == 1  # the marker showed it committed: not run again
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_unknown_result_that_was_lost_is_run_again(kv: FDBKV, db: FakeDatabase) -> None:
    db.outcomes = ["lost"]
    fn = Counting()
    assert kv.transact_sync(fn) == 2
    assert fn.runs == 2
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_unknown_result_landing_before_the_retry_commits(kv: FDBKV, db: FakeDatabase) -> None:
    # Attempt 1 is still in flight when attempt 2 checks its marker (absent), and lands
    # before attempt 2 commits: attempt 2 conflicts on the marker; attempt 3 finds it.
    db.outcomes = ["later", "land-first"]
    fn = Counting()
    assert kv.transact_sync(fn) == 1
    assert fn.runs == 2
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_unknown_result_landing_after_the_retry_committed_is_refused(
    kv: FDBKV, db: FakeDatabase
) -> None:
    # A blind add: only the marker's conflict keeps the late first attempt out.
    db.outcomes = ["later"]
    fn = Counting()
    assert kv.transact_sync(fn) == 2
    assert db.land_in_flight() == [False]
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_unknown_result_twice_then_success(kv: FDBKV, db: FakeDatabase) -> None:
    db.outcomes = ["lost", "lost"]
    fn = Counting()
    assert kv.transact_sync(fn) == 3
    assert kv.read_sync(lambda tr: decode_i64(tr.get(b"n"))) == 1


def test_unknown_result_then_a_fatal_error_says_the_outcome_is_unknown(
    kv: FDBKV, db: FakeDatabase
) -> None:
    db.outcomes = ["later", 1500]
    with pytest.raises(KVError, match="may have committed"):
        kv.transact_sync(Counting())


def test_read_only_call_writes_no_marker(kv: FDBKV, db: FakeDatabase) -> None:
    assert kv.transact_sync(lambda tr: tr.get(b"k")) is None
    assert db.commit_calls == 0 and markers(db) == []


# -- commit markers are cleared later -----------------------------------------------------


def test_markers_of_finished_calls_are_cleared_by_later_commits_and_close(
    kv: FDBKV, db: FakeDatabase
) -> None:
    for i in range(20):
        kv.transact_sync(lambda tr, i=i: tr.set(b"k%d" % i, b"v"))
        assert len(markers(db)) == 1  # only the latest call's marker is left
    db.outcomes = ["landed"]
    kv.transact_sync(Counting())
    assert len(markers(db)) == 1
    kv.close()
    assert markers(db) == []
    with pytest.raises(KVError, match="closed"):
        kv.transact_sync(lambda tr: tr.set(b"k", b"v"))


def test_stale_markers_of_dead_processes_are_swept(db: FakeDatabase) -> None:
    now_ms = int(time.time() * 1000)
    base = ROOT + b"\xffm"
    stale = base + (now_ms - MARKER_GRACE_MS - 60_000).to_bytes(8, "big") + b"x" * 16
    recent = base + (now_ms - 1000).to_bytes(8, "big") + b"y" * 16
    db.snapshots[0] = {stale: b"1", recent: b"1"}
    kv = FDBKV(prefix="t", database=db, error_type=FakeFDBError)
    kv.transact_sync(lambda tr: tr.set(b"k", b"v"))
    left = markers(db)
    assert stale not in left and recent in left and len(left) == 2


# -- FoundationDB's limits ----------------------------------------------------------------


def test_value_limit(kv: FDBKV, db: FakeDatabase) -> None:
    kv.transact_sync(lambda tr: tr.set(b"big", b"x" * VALUE_SIZE_LIMIT))
    with pytest.raises(KVError, match="over FoundationDB's limit of 100000 bytes"):
        kv.transact_sync(lambda tr: tr.set(b"bigger", b"x" * (VALUE_SIZE_LIMIT + 1)))
    assert kv.read_sync(lambda tr: tr.get(b"bigger")) is None


def test_key_limit_counts_the_root(kv: FDBKV) -> None:
    fits = b"k" * (KEY_SIZE_LIMIT - len(ROOT))
    kv.transact_sync(lambda tr: tr.set(fits, b"v"))
    with pytest.raises(KVError, match="key limit"):
        kv.transact_sync(lambda tr: tr.set(fits + b"k", b"v"))


def test_commits_over_10_mb_are_refused_before_sending(kv: FDBKV, db: FakeDatabase) -> None:
    def huge(tr: Transaction) -> None:
        for i in range(TRANSACTION_SIZE_LIMIT // VALUE_SIZE_LIMIT + 1):
            tr.set(b"chunk%04d" % i, b"x" * VALUE_SIZE_LIMIT)

    with pytest.raises(KVError, match="over FoundationDB's commit limit.*nothing was sent"):
        kv.transact_sync(huge)
    assert db.commit_calls == 0


def test_user_keys_helper_sees_only_user_keys(kv: FDBKV, db: FakeDatabase) -> None:
    kv.transact_sync(lambda tr: tr.set(b"a", b"1"))
    assert user_keys(db) == {b"a": b"1"}


def test_concurrent_increments_from_threads(kv: FDBKV) -> None:
    def incr(tr: Transaction) -> None:
        tr.set(b"c", encode_i64(decode_i64(tr.get(b"c")) + 1))

    def worker() -> None:
        for _ in range(50):
            kv.transact_sync(incr)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert anyio.run(kv.read, lambda tr: decode_i64(tr.get(b"c"))) == 200
