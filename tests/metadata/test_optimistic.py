"""A transaction worked out on a snapshot (metadata.optimistic), on every KV backend."""

from __future__ import annotations

from metadata.kv import KV, OptimisticCounts, Transaction
from metadata.optimistic import SNAPSHOT_TRIES, transact_optimistic
from tests.metadata.conftest import Backend


def _outcomes(counts: OptimisticCounts) -> tuple[int, int, int]:
    return counts.applied, counts.changed, counts.overlapped


async def test_writes_are_applied_when_the_reads_still_hold(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.set_many([(b"a/1", b"x"), (b"a/2", b"y"), (b"c", b"3")]))
    runs = []

    def fn(tr: Transaction) -> int:
        runs.append(1)
        rows = tr.get_range(b"a/", b"a0")
        count = int(tr.get(b"c") or b"0")
        tr.set(b"b/total", str(len(rows) + count).encode())
        tr.clear(b"a/1")
        tr.add(b"n", 2)
        return len(rows)

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == 2
    assert runs == [1]  # on the snapshot only
    assert _outcomes(counts) == (1, 0, 0)
    got = await kv.read(lambda tr: tr.get_range(b"", b"\xff"))
    assert dict(got) == {
        b"a/2": b"y",
        b"b/total": b"5",
        b"c": b"3",
        b"n": (2).to_bytes(8, "little"),
    }


async def test_a_change_after_the_snapshot_works_fn_out_on_a_new_one(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.set(b"k", b"1"))
    seen = []

    def fn(tr: Transaction) -> bytes | None:
        value = tr.get(b"k")
        seen.append(value)
        if len(seen) == 1:  # another writer commits between the snapshot and the check
            kv.transact_sync(lambda other: other.set(b"k", b"2"))
        tr.set(b"copy", value or b"")
        return value

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == b"2"
    assert seen == [b"1", b"2"]
    assert (*_outcomes(counts), counts.retried) == (1, 0, 0, 1)
    assert await kv.read(lambda tr: tr.get(b"copy")) == b"2"  # not the first snapshot's b"1"


async def test_a_change_after_every_snapshot_runs_fn_again_under_the_lock(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.set(b"k", b"0"))
    seen = []

    def fn(tr: Transaction) -> bytes | None:
        value = tr.get(b"k")
        seen.append(value)
        if len(seen) <= SNAPSHOT_TRIES:  # on each snapshot, a commit before its check
            kv.transact_sync(lambda other: other.set(b"k", b"%d" % len(seen)))
        tr.set(b"copy", value or b"")
        return value

    counts = OptimisticCounts()
    last = b"%d" % SNAPSHOT_TRIES
    assert await transact_optimistic(kv, fn, counts) == last
    assert seen == [b"%d" % i for i in range(SNAPSHOT_TRIES + 1)]
    assert (*_outcomes(counts), counts.retried) == (0, 1, 0, SNAPSHOT_TRIES - 1)
    assert await kv.read(lambda tr: tr.get(b"copy")) == last


async def test_a_range_that_gained_a_key_is_a_change(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.set(b"r/1", b"a"))
    calls = []

    def fn(tr: Transaction) -> int:
        calls.append(1)
        rows = tr.get_ranges([(b"r/", b"r0")])[0]
        if len(calls) == 1:
            kv.transact_sync(lambda other: other.set(b"r/2", b"b"))
        tr.set(b"count", str(len(rows)).encode())
        return len(rows)

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == 2
    assert (*_outcomes(counts), counts.retried) == (1, 0, 0, 1)
    assert await kv.read(lambda tr: tr.get(b"count")) == b"2"


async def test_a_read_of_its_own_write_runs_fn_under_the_lock(kv: KV) -> None:
    runs = []

    def fn(tr: Transaction) -> bytes | None:
        runs.append(1)
        tr.clear_range(b"q/", b"q0")
        tr.set(b"q/1", b"v")
        return tr.get(b"q/1")  # the snapshot cannot know this

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == b"v"
    assert len(runs) == 2
    assert _outcomes(counts) == (0, 0, 1)
    assert await kv.read(lambda tr: tr.get(b"q/1")) == b"v"


async def test_reads_beside_its_writes_are_fine(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.set_many([(b"m/1", b"a"), (b"z", b"b")]))

    def fn(tr: Transaction) -> bytes | None:
        tr.set(b"m/2", b"new")
        tr.clear_ranges([(b"n/", b"n0")])
        return tr.get(b"z")  # outside everything written: still the snapshot's answer

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == b"b"
    assert _outcomes(counts) == (1, 0, 0)
    assert await kv.read(lambda tr: tr.get(b"m/2")) == b"new"


async def test_an_error_in_fn_writes_nothing(kv: KV) -> None:
    def fn(tr: Transaction) -> None:
        tr.set(b"e", b"1")
        raise ValueError("no")

    counts = OptimisticCounts()
    try:
        await transact_optimistic(kv, fn, counts)
    except ValueError as exc:
        assert str(exc) == "no"
    else:
        raise AssertionError("the error did not propagate")
    assert _outcomes(counts) == (0, 0, 0)
    assert await kv.read(lambda tr: tr.get(b"e")) is None


async def test_fn_that_changes_the_list_it_read_is_still_checked_against_the_store(
    kv: KV,
) -> None:
    kv.transact_sync(lambda tr: tr.set_many([(b"l/1", b"a"), (b"l/2", b"b")]))

    def fn(tr: Transaction) -> int:
        rows = tr.get_range(b"l/", b"l0")
        rows.pop()  # the recorder kept its own copy of the answer
        tr.set(b"left", str(len(rows)).encode())
        return len(rows)

    counts = OptimisticCounts()
    assert await transact_optimistic(kv, fn, counts) == 1
    assert _outcomes(counts) == (1, 0, 0)


async def test_the_stores_own_call_takes_the_snapshot_way_where_there_is_one_writer(
    backend: Backend, kv: KV
) -> None:
    """`KV.transact_optimistic`: SQLite (plain or wrapped in fault injection) works fn out
    on a snapshot; FoundationDB, whose commit checks reads anyway, runs it as `transact`."""
    kv.transact_sync(lambda tr: tr.set(b"k", b"1"))
    runs = []

    def fn(tr: Transaction) -> bytes | None:
        runs.append(1)
        value = tr.get(b"k")
        tr.set(b"copy", value or b"")
        return value

    counts = OptimisticCounts()
    assert await kv.transact_optimistic(fn, counts) == b"1"
    assert await kv.read(lambda tr: tr.get(b"copy")) == b"1"
    if backend.name.endswith("sqlite"):
        assert _outcomes(counts) == (1, 0, 0)
    else:
        assert _outcomes(counts) == (0, 0, 0)
    assert runs == [1]
