"""Compaction in the metadata store on every KV backend: plans and their claims, and the
re-pointing commit that replaces exactly the planned entries or nothing at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from metadata import cluster, compaction, keys, lifecycle, log, producers, topics, txns
from metadata.compaction import L1, L2, JobEntry, Limits, Plan
from metadata.kv import KV, OptimisticCounts
from metadata.optimistic import transact_optimistic
from metadata.sqlite_kv import SQLiteKV
from tests.metadata.test_lifecycle import (
    DELAY,
    SUB,
    _append,
    _due,
    _entries,
    _object,
    _queued_l0,
    _retain,
    _reverse,
    _state,
    _topic,
)

NOW = 10_000
LEASE = 5_000
NEVER = 10**12  # a level-2 wait that never passes here
HEADER = 8  # where an output's first chunk starts (storage.ingest's header)


def _plan_l1(kv: KV, node: int = 1, now: int = NOW, min_age: int = 0, **limits) -> Plan | None:
    return kv.transact_sync(
        lambda tr: compaction.plan_l1(tr, SUB, node, now, min_age, Limits(**limits), LEASE)
    )


def _plan_l2(
    kv: KV, node: int = 1, now: int = NOW, spans=None, wait: int = NEVER, **limits
) -> Plan | None:
    return kv.transact_sync(
        lambda tr: compaction.plan_l2(
            tr, SUB, node, now, Limits(**limits), LEASE, spans, max_wait_ms=wait
        )
    )


def _outputs(plan: Plan, key: str, entry_bytes: int = 1 << 20) -> list[JobEntry]:
    """The output's entries, its chunks written back to back after the header."""
    starts, position = [], HEADER
    for _t, _p, entries in plan.partitions():
        starts.append(position)
        position += sum(e.length for e in entries)
    return compaction.output_entries(plan, key, starts, entry_bytes)


def _commit(
    kv: KV, plan: Plan, key: str, size: int = 1000, node: int = 1, now: int = NOW, **kw
) -> compaction.JobResult:
    outputs = _outputs(plan, key, **kw)
    return kv.transact_sync(
        lambda tr: compaction.commit_job(tr, SUB, plan, node, key, size, outputs, now, DELAY)
    )


def _full_entries(kv: KV, topic: topics.Topic, p: int = 0) -> list[log.ChunkEntry]:
    return kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, p, 0))


def _tallies(kv: KV) -> dict[str, int]:
    return kv.transact_sync(lambda tr: lifecycle.read_tallies(tr, SUB))


def _claims(kv: KV) -> dict[str, tuple]:
    rows = kv.transact_sync(lambda tr: tr.get_range(*SUB.range(keys.L0_OBJECT)))
    return {str(SUB.unpack(k)[2]): keys.unpack_value(v) for k, v in rows}


def _l1_rows(kv: KV) -> dict[int, tuple]:
    rows = kv.transact_sync(lambda tr: tr.get_range(*SUB.range(keys.L1_PARTITION)))
    return {int(SUB.unpack(k)[2]): keys.unpack_value(v) for k, v in rows}


def _set_l1_row(kv: KV, topic_id: bytes, partition: int, row: tuple) -> None:
    """Writes a partition's level-1 row as `_l1_rows` reads it."""
    key = SUB.key(keys.L1_PARTITION, topic_id, partition)
    kv.transact_sync(lambda tr: tr.set(key, keys.pack_value(row)))


def test_a_level_one_job_replaces_exactly_the_planned_entries(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 15)]})  # p0 0-1, p1 0
    _append(kv, topic, "b", {0: [(3, 20)]})  # p0 2-4
    _append(kv, topic, "c", {1: [(2, 30)], 0: [(1, 5)]})  # p1 1-2, p0 5
    states = [_state(kv, topic, p) for p in (0, 1)]
    before = _tallies(kv)

    plan = _plan_l1(kv)
    assert plan is not None and plan.level == L1
    assert plan.input_keys == ["a", "b", "c"]
    assert [
        (p, [(e.object_key, e.base_offset) for e in es]) for _t, p, es in plan.partitions()
    ] == [
        (0, [("a", 0), ("b", 2), ("c", 5)]),
        (1, [("a", 0), ("c", 1)]),
    ]
    assert _commit(kv, plan, "L1", size=530) == compaction.JobResult(True)

    # One entry per partition in the output, the bytes back to back in offset order.
    (p0,) = _full_entries(kv, topic, 0)
    (p1,) = _full_entries(kv, topic, 1)
    assert p0 == log.ChunkEntry("L1", HEADER, 300, 0, 5, 3, 20)
    assert p1 == log.ChunkEntry("L1", HEADER + 300, 200, 0, 2, 2, 30)
    assert _reverse(kv, "L1") == [(0, 0, 5), (1, 0, 2)]
    # Offsets, log start and bytes of each partition as they were.
    assert [_state(kv, topic, p) for p in (0, 1)] == states
    # Every input has no entry left: dead, queued one delete delay on, off the L0 queue.
    for key, size in (("a", 202), ("b", 101), ("c", 202)):
        assert _object(kv, key) == lifecycle.ObjectRecord(size, 0, 1, NOW, 0)
        assert _reverse(kv, key) == []
    assert _due(kv, NOW + DELAY) == [(NOW + DELAY, k) for k in ("a", "b", "c")]
    assert _queued_l0(kv) == []
    assert _object(kv, "L1") == lifecycle.ObjectRecord(530, 2, NOW, None, L1)
    assert _tallies(kv) == {
        "objects": before["objects"] + 1,
        "object_bytes": before["object_bytes"] + 530,
        "chunk_entries": 2,
    }
    # Both partitions now wait for level 2: (bytes, objects, first offset, unclaimed).
    assert _l1_rows(kv) == {0: (300, 1, 0, -1, 0, NOW), 1: (200, 1, 0, -1, 0, NOW)}


def test_output_entries_hold_runs_of_consecutive_offsets_up_to_the_entry_size(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]})  # 0
    _append(kv, topic, "b", {0: [(1, 10)]})  # 1
    _append(kv, topic, "c", {0: [(1, 10)]})  # 2
    plan = _plan_l1(kv)
    # b is not in the plan: a's and c's entries are not consecutive.
    gapped = Plan(L1, tuple(e for e in plan.entries if e.entry.object_key != "b"))
    assert [
        (e.entry.start, e.entry.length, e.entry.base_offset, e.entry.last_offset)
        for e in _outputs(gapped, "x")
    ] == [(8, 100, 0, 0), (108, 100, 2, 2)]
    # At most 250 bytes an entry: 100 + 100, then 100.
    assert [
        (e.entry.start, e.entry.length, e.entry.base_offset, e.entry.last_offset)
        for e in _outputs(plan, "x", entry_bytes=250)
    ] == [(8, 200, 0, 1), (208, 100, 2, 2)]


def test_a_plan_takes_old_unclaimed_objects_within_its_limits(kv):
    topic = _topic(kv, partitions=1)
    for key in "abcde":
        _append(kv, topic, key, {0: [(1, 10)]})  # created at 1
    assert _plan_l1(kv, now=1000, min_age=2000) is None  # too young
    first = _plan_l1(kv, node=1, max_inputs=2)
    assert first.input_keys == ["a", "b"] and first.queued == ((1, "a"), (1, "b"))
    assert _claims(kv)["a"] == (1, NOW + LEASE)
    # Another agent's plan passes over the claimed objects.
    assert _plan_l1(kv, node=2, now=NOW + 1000, max_inputs=2).input_keys == ["c", "d"]
    assert _plan_l1(kv, node=3, max_inputs=2) is None  # e alone gains nothing
    # The first agent died: once its claims expire, its inputs are planned again.
    assert _plan_l1(kv, node=3, now=NOW + LEASE, max_inputs=3).input_keys == ["a", "b", "e"]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, first, 1))  # not its claim now
    assert _claims(kv)["a"] == (3, NOW + 2 * LEASE)


def test_a_job_that_can_still_grow_waits_up_to_twice_the_minimum_age(kv):
    """Objects that reach the minimum age a few at a time wait for the others, so that a
    level-1 object holds long runs; a full job, or one whose oldest object is twice the
    minimum age, goes at once."""
    topic = _topic(kv, partitions=1)
    for key in "abc":
        _append(kv, topic, key, {0: [(1, 10)]})  # created at 1
    min_age = 1000
    assert _plan_l1(kv, now=1 + 2 * min_age - 1, min_age=min_age) is None  # may grow
    full = _plan_l1(kv, now=1 + min_age, min_age=min_age, max_inputs=3)
    assert full is not None and full.input_keys == ["a", "b", "c"]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, full, 1))
    by_bytes = _plan_l1(kv, now=1 + min_age, min_age=min_age, max_bytes=250)
    assert by_bytes is not None and by_bytes.input_keys == ["a", "b"]  # c would not fit
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, by_bytes, 1))
    plan = _plan_l1(kv, now=1 + 2 * min_age, min_age=min_age)
    assert plan is not None and plan.input_keys == ["a", "b", "c"]


def test_a_selection_claims_nothing_once_another_plan_took_one_of_its_objects(kv):
    """The agent reads what to take in a read transaction and claims it in a second one:
    an object claimed in between makes the claim give up whole."""
    topic = _topic(kv, partitions=1)
    for key in "abc":
        _append(kv, topic, key, {0: [(1, 10)]})
    limits = Limits(max_inputs=3)
    selection = kv.transact_sync(lambda tr: compaction.select_l1(tr, SUB, NOW, 0, limits))
    assert [key for _c, key, _e in selection.chosen] == ["a", "b", "c"]
    assert _claims(kv)["a"] == ()  # reading claims nothing
    other = _plan_l1(kv, node=2, max_inputs=2)  # another agent plans a and b meanwhile
    assert other.input_keys == ["a", "b"]
    assert (
        kv.transact_sync(lambda tr: compaction.claim_l1(tr, SUB, selection, 1, NOW, LEASE)) is None
    )
    assert _claims(kv) == {"a": (2, NOW + LEASE), "b": (2, NOW + LEASE), "c": ()}
    # With nothing taken in between, the claim is the plan a single transaction makes.
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, other, 2))
    selection = kv.transact_sync(lambda tr: compaction.select_l1(tr, SUB, NOW, 0, limits))
    plan = kv.transact_sync(lambda tr: compaction.claim_l1(tr, SUB, selection, 1, NOW, LEASE))
    assert plan is not None and plan.input_keys == ["a", "b", "c"]
    assert _claims(kv)["c"] == (1, NOW + LEASE)


def test_limits_of_bytes_and_entries(kv):
    topic = _topic(kv, partitions=3)
    _append(kv, topic, "big", {0: [(1, 10)] * 3})  # 300 bytes, 3 entries
    _append(kv, topic, "a", {1: [(1, 10)]})
    _append(kv, topic, "b", {1: [(1, 10)], 2: [(1, 10)]})
    _append(kv, topic, "c", {2: [(1, 10)]})
    # "big" alone passes 250 bytes: it leaves the queue, never to be compacted. Then the
    # oldest that fit together: a and c (b's 200 bytes would make 300).
    plan = _plan_l1(kv, max_bytes=250)
    assert plan.input_keys == ["a", "c"]
    assert "big" not in _queued_l0(kv)
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    # Three entries at most: a and b (1 + 2), then c does not fit.
    assert _plan_l1(kv, max_entries=3).input_keys == ["a", "b"]


def test_a_level_one_plan_carries_each_entry_as_stored(kv):
    """A level-1 plan reads its entries from the reverse index; what it carries for the
    commit to compare must be the CHUNK values byte for byte, or every job is refused."""
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 10)]})
    _append(kv, topic, "b\x00c", {0: [(3, 20)], 1: [(1, 2**40)]})
    plan = _plan_l1(kv)
    stored = dict(kv.transact_sync(lambda tr: tr.get_range(*SUB.range(keys.CHUNK))))
    assert len(plan.entries) == 4
    for e in plan.entries:
        key = SUB.key(keys.CHUNK, e.topic_id, e.partition, e.entry.last_offset)
        assert e.value == stored[key] == log.entry_value(e.entry)
    assert _commit(kv, plan, "L1").committed


def _counted(tr, fn):
    """fn(tr) and the SQLite statements it ran (the tallies' writes included)."""
    count = [0]
    tr._conn.set_trace_callback(lambda _sql: count.__setitem__(0, count[0] + 1))
    try:
        result = fn(tr)
        tr._before_commit()  # the tallies, as the commit writes them
    finally:
        tr._conn.set_trace_callback(None)
    return result, count[0]


def _statements_of_a_level_one_job(
    tmp_path: Path, files: int, partitions: int = 4, per_file: int = 4
) -> tuple[int, int]:
    """SQLite statements of a level-1 job's claim and of its commit, over `files` ingest
    files of `per_file` partitions each (the next ones of the topic's `partitions` in
    turn)."""
    kv = SQLiteKV(tmp_path / f"{files}-{partitions}-{per_file}.db")
    try:
        topic = _topic(kv, partitions=partitions)
        for i in range(files):
            chosen = [(i * per_file + j) % partitions for j in range(per_file)]
            _append(kv, topic, f"f{i:03d}", {p: [(1, 10)] for p in chosen})
        limits = Limits()
        selection = kv.read_sync(lambda tr: compaction.select_l1(tr, SUB, NOW, 0, limits))
        plan, claimed = kv.transact_sync(
            lambda tr: _counted(
                tr, lambda tr: compaction.claim_l1(tr, SUB, selection, 1, NOW, LEASE)
            )
        )
        assert len(plan.input_keys) == files
        assert len(plan.partitions()) == min(partitions, files * per_file)
        prepared = compaction.prepare_commit(SUB, plan, "L1", 1000, _outputs(plan, "L1"))
        result, committed = kv.transact_sync(
            lambda tr: _counted(
                tr, lambda tr: compaction.commit_prepared(tr, SUB, prepared, 1, NOW, DELAY)
            )
        )
        assert result.committed
        return claimed, committed
    finally:
        kv.close()


def test_a_level_one_jobs_statements_grow_with_neither_its_inputs_nor_its_partitions(tmp_path):
    """Each SQLite statement gives up the GIL and waits to take it back (long, beside a
    busy event loop): the claim and the commit read and write their inputs' queue rows,
    records and reverse index, and the commit compares its partitions' entries, a batch
    at a time, not one statement each."""
    few = _statements_of_a_level_one_job(tmp_path, 4)
    assert _statements_of_a_level_one_job(tmp_path, 32) == few
    # As a soak's flushes do: two partitions of 64 in each file.
    assert _statements_of_a_level_one_job(tmp_path, 32, partitions=64, per_file=2) == few


def test_a_commit_leaves_the_entries_between_its_inputs_alone(kv):
    topic = _topic(kv, partitions=1)
    for key in "abc":
        _append(kv, topic, key, {0: [(1, 10)]})  # offsets 0, 1, 2
    full = _plan_l1(kv)
    # A plan of a and c (b's entry lies between them: claimed by another job, say).
    plan = Plan(L1, tuple(e for e in full.entries if e.entry.object_key != "b"))
    assert _commit(kv, plan, "x", size=208).committed
    assert _entries(kv, topic) == [("x", 0, 0), ("b", 1, 1), ("x", 2, 2)]
    assert _reverse(kv, "b") == [(0, 1, 1)] and _reverse(kv, "a") == _reverse(kv, "c") == []
    assert _reverse(kv, "x") == [(0, 0, 0), (0, 2, 2)]
    assert _object(kv, "b").live_entries == 1


def test_an_ingest_file_holding_a_deleted_topics_entries_waits_for_them_to_go(kv):
    gone, kept = _topic(kv, "gone", partitions=1), _topic(kv, "kept", partitions=1)
    for key in "ab":  # both topics in each
        batches = [
            log.PendingBatch(gone.topic_id, 0, 0, 100, 0, 10, -1, -1, -1),
            log.PendingBatch(kept.topic_id, 0, 101, 100, 0, 10, -1, -1, -1),
        ]
        kv.transact_sync(lambda tr, k=key, b=batches: log.commit_ingest(tr, SUB, k, 201, 1, b))
    _append(kv, kept, "c", {0: [(1, 10)]})
    kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "gone", NOW))
    assert _plan_l1(kv) is None  # a and b would be refused; c alone gains nothing
    kv.transact_sync(lambda tr: lifecycle.reap_deleted_topic(tr, SUB, gone.topic_id, 1, NOW, DELAY))
    assert _plan_l1(kv).input_keys == ["a", "b", "c"]


def _change_retention(kv, topic):
    _retain(kv, topic, now=NOW, retention_ms=NOW - 15, retention_bytes=-1)  # a's p0 entry


def _change_delete_records(kv, topic):
    kv.transact_sync(
        lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, 2, NOW, DELAY)
    )


def _change_topic_deleted(kv, topic):
    kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "t", NOW))


def _change_other_job(kv, topic):
    # The claim ran out (a slow agent); another agent planned and committed the same.
    other = _plan_l1(kv, node=2, now=NOW + LEASE)
    assert other is not None
    assert _commit(kv, other, "other", node=2, now=NOW + LEASE).committed


@pytest.mark.parametrize(
    "change",
    [_change_retention, _change_delete_records, _change_topic_deleted, _change_other_job],
    ids=["retention", "delete_records", "topic_deleted", "other_job"],
)
def test_the_commit_changes_nothing_when_an_input_entry_changed(kv, change):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 10)]})
    _append(kv, topic, "b", {0: [(3, 20)], 1: [(1, 20)]})
    plan = _plan_l1(kv)
    assert plan.input_keys == ["a", "b"]
    change(kv, topic)
    index = {p: _full_entries(kv, topic, p) for p in (0, 1)}
    records = {k: _object(kv, k) for k in ("a", "b", "other")}
    before = _tallies(kv)

    result = _commit(kv, plan, "L1", size=700, now=NOW + LEASE + 1)
    assert not result.committed and result.reason
    assert {p: _full_entries(kv, topic, p) for p in (0, 1)} == index
    assert {k: _object(kv, k) for k in ("a", "b", "other")} == records
    assert _reverse(kv, "L1") == []
    # The output is dead and due for deletion at once; counted until it is deleted.
    at = NOW + LEASE + 1
    assert _object(kv, "L1") == lifecycle.ObjectRecord(700, 0, at, at, L1)
    assert (at, "L1") in _due(kv, at)
    assert _tallies(kv) == {
        "objects": before["objects"] + 1,
        "object_bytes": before["object_bytes"] + 700,
        "chunk_entries": before["chunk_entries"],
    }
    # The claims are given up: what is left may be planned again.
    assert all(claim == () for claim in _claims(kv).values())


def _two_level_one_objects(kv: KV) -> topics.Topic:
    """p0 offsets 0-3 in level-1 objects x (0-1) and y (2-3); p1 offset 0 in x."""
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(1, 10)], 1: [(1, 10)]})
    _append(kv, topic, "b", {0: [(1, 20)]})
    assert _commit(kv, _plan_l1(kv), "x").committed
    _append(kv, topic, "c", {0: [(1, 30)]})
    _append(kv, topic, "d", {0: [(1, 40)]})
    assert _commit(kv, _plan_l1(kv), "y").committed
    return topic


def test_a_level_two_job_gathers_one_partitions_level_one_entries(kv):
    topic = _two_level_one_objects(kv)
    assert _l1_rows(kv) == {0: (400, 2, 0, -1, 0, NOW), 1: (100, 1, 0, -1, 0, NOW)}
    assert _plan_l2(kv, l2_max_inputs=3) is None  # neither 3 objects nor max_bytes yet
    plan = _plan_l2(kv, l2_max_inputs=2)
    assert plan.level == L2 and plan.level_one_rows == ((topic.topic_id, 0, NOW),)
    assert plan.input_keys == ["x", "y"]
    assert _l1_rows(kv)[0][3:5] == (1, NOW + LEASE)  # claimed
    assert _plan_l2(kv, node=2, l2_max_inputs=2) is None  # p1 waits for more

    assert _commit(kv, plan, "z", size=408).committed
    assert _full_entries(kv, topic, 0) == [log.ChunkEntry("z", HEADER, 400, 0, 3, 4, 40)]
    assert _entries(kv, topic, 1) == [("x", 0, 0)]
    # x still holds p1's entry; y held only p0's and is queued for deletion.
    assert _object(kv, "x") == lifecycle.ObjectRecord(1000, 1, NOW, None, L1)
    assert _object(kv, "y") == lifecycle.ObjectRecord(1000, 0, NOW, NOW, L1)
    assert _object(kv, "z") == lifecycle.ObjectRecord(408, 1, NOW, None, L2)
    assert _reverse(kv, "x") == [(1, 0, 0)]
    assert _l1_rows(kv) == {1: (100, 1, 0, -1, 0, NOW)}
    assert _state(kv, topic, 0) == log.PartitionState(4, 0, 400)


async def _jobs_of_two_levels(kv: KV, counts: OptimisticCounts | None) -> list[tuple]:
    """The level-1 and level-2 jobs of the test above, each commit worked out on a
    snapshot (counted in counts) or, counts None, run as a plain transaction; every key
    and value of the store at the end."""
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff"))

    async def commit(plan: Plan, key: str, size: int) -> None:
        prepared = compaction.prepare_commit(SUB, plan, key, size, _outputs(plan, key))

        def fn(tr):
            return compaction.commit_prepared(tr, SUB, prepared, 1, NOW, DELAY)

        if counts is None:
            result = await kv.transact(fn)
        else:
            result = await transact_optimistic(kv, fn, counts)
        assert result.committed

    topic = kv.transact_sync(  # the same id both times: the stores are compared
        lambda tr: topics.create_topic(tr, SUB, "t", b"\x01" * 16, 2, {}, 0)
    )
    _append(kv, topic, "a", {0: [(1, 10)], 1: [(1, 10)]})
    _append(kv, topic, "b", {0: [(1, 20)]})
    await commit(_plan_l1(kv), "x", 1000)
    _append(kv, topic, "c", {0: [(1, 30)]})
    _append(kv, topic, "d", {0: [(1, 40)]})
    await commit(_plan_l1(kv), "y", 1000)
    assert _claims(kv) == {}  # every input left the queue
    await commit(_plan_l2(kv, l2_max_inputs=2), "z", 408)
    assert _full_entries(kv, topic, 0) == [log.ChunkEntry("z", HEADER, 400, 0, 3, 4, 40)]
    return await kv.read(lambda tr: tr.get_range(b"", b"\xff"))


async def test_a_jobs_commit_worked_out_on_a_snapshot_is_applied_as_worked_out(kv):
    """A commit's reads of a key come before its writes to it (a level-1 commit gives its
    inputs' queue rows up before unreferencing clears them): worked out on a snapshot,
    it is applied as it was, not run again under the lock, and leaves every key and
    value as the plain transaction does."""
    plain = await _jobs_of_two_levels(kv, None)
    counts = OptimisticCounts()
    assert await _jobs_of_two_levels(kv, counts) == plain
    assert (counts.applied, counts.changed, counts.overlapped) == (3, 0, 0)


def _partitions_in_two_level_one_objects(kv: KV, partitions: int) -> topics.Topic:
    """Every partition has 200 bytes in level-1 object x (offsets 0-1) and 200 in y (2-3)."""
    topic = _topic(kv, partitions=partitions)
    for name in ("x", "y"):
        for half in "ab":
            _append(kv, topic, f"{name}{half}", {p: [(1, 10)] for p in range(partitions)})
        assert _commit(kv, _plan_l1(kv), name).committed
    return topic


def test_the_next_due_partitions_of_a_topic_join_a_level_two_job_while_it_fits(kv):
    topic = _partitions_in_two_level_one_objects(kv, 4)
    tid = topic.topic_id
    # Four partitions of 400 bytes: 1,000 bytes take the first two whole, not half of p2.
    plan = _plan_l2(kv, l2_max_inputs=2, max_bytes=1000)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 0), (tid, 1)]
    assert [p for _t, p, _e in plan.partitions()] == [0, 1]
    assert plan.input_keys == ["x", "y"] and plan.input_bytes == 800
    assert all(_l1_rows(kv)[p][3:5] == (1, NOW + LEASE) for p in (0, 1))
    assert _l1_rows(kv)[2][3] == -1  # not claimed
    second = _plan_l2(kv, node=2, l2_max_inputs=2, max_bytes=1000)
    assert [r[:2] for r in second.level_one_rows] == [(tid, 2), (tid, 3)]
    assert _commit(kv, plan, "z", size=808).committed
    assert _commit(kv, second, "w", size=808, node=2).committed
    # One object of two partitions each: their runs one after the other.
    assert _full_entries(kv, topic, 0) == [log.ChunkEntry("z", HEADER, 400, 0, 3, 4, 10)]
    assert _full_entries(kv, topic, 1) == [log.ChunkEntry("z", HEADER + 400, 400, 0, 3, 4, 10)]
    assert _entries(kv, topic, 3) == [("w", 0, 3)]
    assert _l1_rows(kv) == {}
    assert _object(kv, "x").dead_since_ms == NOW and _object(kv, "y").dead_since_ms == NOW
    assert _object(kv, "z") == lifecycle.ObjectRecord(808, 2, NOW, None, L2)
    # Where each partition's run ends (a read-ahead stream of one run stops there).
    ends = kv.transact_sync(
        lambda tr: [log.partition_end_in_object(tr, SUB, "z", tid, p) for p in range(3)]
    )
    assert ends == [HEADER + 400, HEADER + 800, None]


def test_a_level_two_plan_reads_its_objects_records_together_and_once(kv):
    """The plan runs under SQLite's writer lock: a read per entry's object, for every
    partition that joins, gave up the GIL and waited to take it back each time."""
    _partitions_in_two_level_one_objects(kv, 8)
    object_reads: list[list[bytes]] = []

    class Counting(_Noting):
        def get(self, key):
            if key.startswith(SUB.key(keys.OBJECT)):
                object_reads.append([key])
            return self._tr.get(key)

        def get_many(self, wanted):
            if any(key.startswith(SUB.key(keys.OBJECT)) for key in wanted):
                object_reads.append(list(wanted))
            return self._tr.get_many(wanted)

    plan = kv.transact_sync(
        lambda tr: compaction.plan_l2(
            Counting(tr, []), SUB, 1, NOW, Limits(l2_max_inputs=2), LEASE, max_wait_ms=NEVER
        )
    )
    assert [p for _t, p, _e in plan.partitions()] == list(range(8))
    assert object_reads == [[SUB.key(keys.OBJECT, "x"), SUB.key(keys.OBJECT, "y")]]


def test_a_partition_joins_a_level_two_job_only_next_to_it_and_half_due(kv):
    topic = _partitions_in_two_level_one_objects(kv, 3)
    tid = topic.topic_id
    # p1 is claimed by another job: p2 does not join p0's, which would not be one range.
    other = _plan_l2(kv, node=2, l2_max_inputs=2, max_bytes=400)
    assert [r[:2] for r in other.level_one_rows] == [(tid, 0)]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, other, 2))
    _set_l1_row(kv, tid, 1, (400, 2, 0, 9, NOW + LEASE, NOW))
    plan = _plan_l2(kv, l2_max_inputs=2)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 0)]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    _set_l1_row(kv, tid, 1, (400, 2, 0, -1, 0, NOW))
    # Due by the wait alone: a partition whose level-1 data has waited less than half of
    # it does not join; one that has waited half of it does (and falls due with them).
    _set_l1_row(kv, tid, 2, (400, 2, 0, -1, 0, NOW + 51))
    plan = _plan_l2(kv, now=NOW + 100, wait=100)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 0), (tid, 1)]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    _set_l1_row(kv, tid, 2, (400, 2, 0, -1, 0, NOW + 50))
    plan = _plan_l2(kv, now=NOW + 100, wait=100)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 0), (tid, 1), (tid, 2)]


def test_half_due_partitions_before_a_due_one_join_its_level_two_job_too(kv):
    """A job starts at the first due partition of a plan's rows and takes the half-due
    ones before it as well as after it: left out, p0 would fall due a pass later and
    find p1 and p2 taken, a job of its one run."""
    topic = _partitions_in_two_level_one_objects(kv, 4)
    tid = topic.topic_id

    # p0 and p1 have waited half of the wait, p2 all of it, p3 less than half.
    for partition, oldest_ms in ((0, NOW + 50), (1, NOW + 50), (2, NOW), (3, NOW + 51)):
        _set_l1_row(kv, tid, partition, (400, 2, 0, -1, 0, oldest_ms))
    plan = _plan_l2(kv, now=NOW + 100, wait=100)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 0), (tid, 1), (tid, 2)]
    assert [p for _t, p, _e in plan.partitions()] == [0, 1, 2]
    assert all(_l1_rows(kv)[p][3:5] == (1, NOW + 100 + LEASE) for p in (0, 1, 2))
    assert _l1_rows(kv)[3][3] == -1  # not claimed
    assert _commit(kv, plan, "z", size=1208, now=NOW + 100).committed
    for partition in (0, 1, 2):  # their runs one after the other, in partition order
        assert _full_entries(kv, topic, partition) == [
            log.ChunkEntry("z", HEADER + 400 * partition, 400, 0, 3, 4, 10)
        ]
    assert _entries(kv, topic, 3) == [("x", 0, 1), ("y", 2, 3)]

    # Before a due partition the group stops at one that has waited less than half.
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff"))
    topic = _partitions_in_two_level_one_objects(kv, 3)
    tid = topic.topic_id
    for partition, oldest_ms in ((0, NOW + 50), (1, NOW + 51), (2, NOW)):
        _set_l1_row(kv, tid, partition, (400, 2, 0, -1, 0, oldest_ms))
    plan = _plan_l2(kv, now=NOW + 100, wait=100)
    assert [r[:2] for r in plan.level_one_rows] == [(tid, 2)]


async def test_a_row_the_plan_rewrote_ends_the_backward_joins_without_reading_it_again(kv):
    """p0's row says two level-1 objects but its entries are in x alone: the plan
    rewrites the row (one object, waiting for more) and starts the job at p1. p0 is not
    joined, and the plan, worked out on a snapshot, never reads its own write back
    (which would run it again under the writer lock)."""
    topic = _topic(kv, partitions=2)
    tid = topic.topic_id
    for name, partitions in (("x", (0, 1)), ("y", (1,))):
        for half in "ab":
            _append(kv, topic, f"{name}{half}", {p: [(1, 10)] for p in partitions})
        assert _commit(kv, _plan_l1(kv), name).committed
    _set_l1_row(kv, tid, 0, (400, 2, 0, -1, 0, NOW))
    counts = OptimisticCounts()

    def plan(tr):
        return compaction.plan_l2(tr, SUB, 1, NOW, Limits(l2_max_inputs=2), LEASE, max_wait_ms=0)

    found = await transact_optimistic(kv, plan, counts)
    assert [r[:2] for r in found.level_one_rows] == [(tid, 1)]
    assert (counts.applied, counts.changed, counts.overlapped) == (1, 0, 0)
    assert _l1_rows(kv)[0] == (200, 1, 0, -1, 0, NOW)


def test_partitions_take_turns_at_level_two_however_many_there_are(kv, monkeypatch):
    """A plan looks at the rows after the partition planned last, then from the first:
    with one partition a job, the first ones never take every job, and rows beyond what
    one plan reads (SCAN) are reached."""
    monkeypatch.setattr(compaction, "SCAN", 2)
    topic = _partitions_in_two_level_one_objects(kv, 4)
    tid = topic.topic_id
    limits = Limits(max_bytes=400, l2_max_inputs=2)  # one partition a job

    def plan_after(after: tuple[bytes, int] | None) -> int:
        plan = kv.transact_sync(
            lambda tr: compaction.plan_l2(
                tr, SUB, 1, NOW, limits, LEASE, max_wait_ms=NEVER, after=after
            )
        )
        kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
        ((_t, partition, _c),) = plan.level_one_rows
        return partition

    planned = [plan_after(None)]
    for _ in range(5):
        planned.append(plan_after((tid, planned[-1])))
    assert planned == [0, 1, 2, 3, 0, 1]


def test_a_level_two_job_is_refused_when_retention_took_an_entry(kv):
    topic = _two_level_one_objects(kv)
    plan = _plan_l2(kv, l2_max_inputs=2)
    _change_delete_records(kv, topic)  # p0's entry in x (0-1) goes
    assert not _commit(kv, plan, "z", size=408).committed
    assert _entries(kv, topic, 0) == [("y", 2, 3)]
    assert _object(kv, "z").live_entries == 0
    assert _l1_rows(kv)[0][3] == -1  # unclaimed
    # Planned again: y's entry alone is what is left, and it waits for more.
    assert _plan_l2(kv, l2_max_inputs=1) is None
    assert _l1_rows(kv)[0] == (200, 1, 2, -1, 0, NOW)


def test_a_level_two_run_covers_at_most_the_topics_span(kv):
    topic = _two_level_one_objects(kv)
    # p0's entries: one in x (max timestamp 20), one in y (40).
    plan = _plan_l2(kv, l2_max_inputs=2, spans={topic.topic_id: 20})
    assert plan is not None and plan.input_keys == ["x", "y"]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    # A shorter span cuts the run to x's entry alone, which is passed over for good.
    assert _plan_l2(kv, l2_max_inputs=2, spans={topic.topic_id: 19}) is None
    assert _l1_rows(kv)[0] == (200, 1, 2, -1, 0, NOW)


def test_a_claim_keeps_what_the_plan_passed_over_out_of_the_row(kv):
    """p0's level-1 entries: x (timestamp 10) alone, cut off by the span, then y and z: the
    plan passes x over and claims y and z, and the row it claims no longer counts x's
    bytes and object (nor does it once the job is done)."""
    topic = _topic(kv, partitions=1)
    for name, ts in (("x", 10), ("y", 100_000), ("z", 100_000)):
        for half in "12":
            _append(kv, topic, f"{name}{half}", {0: [(1, ts)]})
        plan = _plan_l1(kv)
        assert plan is not None and _commit(kv, plan, name).committed
    assert _l1_rows(kv)[0][:3] == (600, 3, 0)
    plan = _plan_l2(kv, wait=0, spans={topic.topic_id: 1_000})
    assert plan is not None and plan.input_keys == ["y", "z"]
    assert _l1_rows(kv)[0] == (400, 2, 2, 1, NOW + LEASE, NOW)
    assert _commit(kv, plan, "w").committed
    assert _l1_rows(kv) == {}
    assert _entries(kv, topic, 0) == [("x", 0, 1), ("w", 2, 5)]


def _level_one_objects(kv: KV, count: int, created=lambda i: NOW) -> topics.Topic:
    """`count` level-1 objects l00, l01, ... of one partition, each merged at created(i)
    from two ingest files of a 100-byte batch: 200 bytes and one entry each."""
    topic = _topic(kv, partitions=1)
    for i in range(count):
        _append(kv, topic, f"i{i}a", {0: [(1, 10 + i)]})
        _append(kv, topic, f"i{i}b", {0: [(1, 10 + i)]})
        plan = _plan_l1(kv, now=created(i))
        assert plan is not None and _commit(kv, plan, f"l{i:02}", now=created(i)).committed
    return topic


class _Noting:
    """A transaction that notes in `read` the keys (and range beginnings) read through it."""

    def __init__(self, tr, read: list[bytes]) -> None:
        self._tr, self._read = tr, read

    def get(self, key):
        self._read.append(key)
        return self._tr.get(key)

    def get_range(self, begin, end, **kw):
        self._read.append(begin)
        return self._tr.get_range(begin, end, **kw)

    def __getattr__(self, name):
        return getattr(self._tr, name)


def test_few_small_level_one_objects_reach_level_two_once_the_oldest_has_waited(kv):
    topic = _two_level_one_objects(kv)  # p0 in x and y, p1 in x alone, written at NOW
    wait = 60_000
    # Far from max_bytes and from 256 objects: only the wait starts a job.
    assert _plan_l2(kv, now=NOW + wait - 1, wait=wait) is None
    plan = _plan_l2(kv, now=NOW + wait, wait=wait)
    assert plan is not None and [r[:2] for r in plan.level_one_rows] == [(topic.topic_id, 0)]
    assert plan.input_keys == ["x", "y"]
    assert _commit(kv, plan, "z", now=NOW + wait).committed
    assert _entries(kv, topic, 0) == [("z", 0, 3)]
    # p1's data is in one object: however long it waits, there is nothing to merge, and
    # a plan does not even read its entries.
    read: list[bytes] = []
    plan = kv.transact_sync(
        lambda tr: compaction.plan_l2(
            _Noting(tr, read), SUB, 1, NOW + 100 * wait, Limits(), LEASE, max_wait_ms=wait
        )
    )
    assert plan is None and read
    assert not [k for k in read if k.startswith(SUB.key(keys.CHUNK))]
    assert _l1_rows(kv) == {1: (100, 1, 0, -1, 0, NOW)}


def test_a_topic_with_a_shorter_retention_span_waits_that_span_only(kv):
    topic = _two_level_one_objects(kv)
    spans = {topic.topic_id: 20_000}
    assert _plan_l2(kv, now=NOW + 19_999, spans=spans, wait=60_000) is None
    plan = _plan_l2(kv, now=NOW + 20_000, spans=spans, wait=60_000)
    assert plan is not None and plan.input_keys == ["x", "y"]


def test_after_a_job_takes_the_head_what_is_left_waits_from_its_own_arrival(kv):
    topic = _level_one_objects(kv, 4, created=lambda i: NOW + 100 * i)
    assert _l1_rows(kv) == {0: (800, 4, 0, -1, 0, NOW)}  # the oldest is l00's
    assert _plan_l2(kv, now=NOW + 999, wait=1000, max_entries=2) is None
    plan = _plan_l2(kv, now=NOW + 1000, wait=1000, max_entries=2)
    assert plan.input_keys == ["l00", "l01"]
    assert _commit(kv, plan, "z1", now=NOW + 1000).committed
    # What is left (l02, l03) came after l01, written at NOW + 100.
    assert _l1_rows(kv) == {0: (400, 2, 4, -1, 0, NOW + 100)}
    assert _plan_l2(kv, now=NOW + 1099, wait=1000, max_entries=2) is None
    plan = _plan_l2(kv, now=NOW + 1100, wait=1000, max_entries=2)
    assert plan.input_keys == ["l02", "l03"]
    assert _commit(kv, plan, "z2", now=NOW + 1100).committed
    assert _entries(kv, topic, 0) == [("z1", 0, 3), ("z2", 4, 7)]
    assert _l1_rows(kv) == {}


def test_what_a_job_leaves_of_promoted_files_waits_from_the_plan_not_their_writing(kv):
    """Ingest files are written long before they come to level 1. What a level-2 job that
    took all of a partition's level 1 leaves (files promoted while it ran) waits from the
    plan, so that the next run gathers a whole wait's data instead of being due at once
    with what a few seconds brought."""
    topic = _topic(kv, partitions=1)
    wait = 30_000
    for key, ts in (("a", 10), ("b", 20)):
        _append(kv, topic, key, {0: [(1, ts)]}, length=300)  # written at 1
    assert _plan_l1(kv, now=NOW, promote_bytes=250) is None  # both promoted, no job
    assert _l1_rows(kv)[0][5] == NOW
    planned = NOW + wait
    plan = _plan_l2(kv, now=planned, wait=wait)
    assert plan is not None and plan.input_keys == ["a", "b"]
    assert plan.level_one_rows == ((topic.topic_id, 0, planned),)
    # While the job runs, two more files (written at 1 too) come to level 1.
    for key, ts in (("c", 30), ("d", 40)):
        _append(kv, topic, key, {0: [(1, ts)]}, length=300)
    assert _plan_l1(kv, now=planned + 1_000, promote_bytes=250) is None
    assert _commit(kv, plan, "z", now=planned + 2_000).committed
    assert _l1_rows(kv) == {0: (600, 2, 2, -1, 0, planned)}
    assert _plan_l2(kv, now=planned + wait - 1, wait=wait) is None
    later = _plan_l2(kv, now=planned + wait, wait=wait)
    assert later is not None and later.input_keys == ["c", "d"]


def test_what_a_run_cut_by_its_span_leaves_waits_from_its_last_files_promotion(kv):
    """A run the topic's span cuts leaves level-1 data that came with the run's last object
    or after it: it waits from when that object was promoted, not from when it was written
    (long before), which would make it due at once and the next run a few seconds long."""
    topic = _topic(kv, partitions=1)
    wait = span = 30_000
    spans = {topic.topic_id: span}
    # Four ingest files, all written at 1, promoted at three times; c's records are more
    # than the span newer than a's, so a run from a stops before c.
    for key, ts, promoted in (
        ("a", 0, NOW),
        ("b", 20_000, NOW + 20_000),
        ("c", 40_000, NOW + 25_000),
        ("d", 45_000, NOW + 25_000),
    ):
        _append(kv, topic, key, {0: [(1, ts)]}, length=300)
        assert _plan_l1(kv, now=promoted, promote_bytes=250) is None
        assert _object(kv, key).created_ms == promoted
    planned = NOW + wait
    plan = _plan_l2(kv, now=planned, spans=spans, wait=wait)
    assert plan is not None and plan.input_keys == ["a", "b"]
    assert plan.level_one_rows == ((topic.topic_id, 0, NOW + 20_000),)
    assert _commit(kv, plan, "z", now=planned + 1_000).committed
    assert _l1_rows(kv) == {0: (600, 2, 2, -1, 0, NOW + 20_000)}
    assert _plan_l2(kv, now=NOW + 20_000 + wait - 1, spans=spans, wait=wait) is None
    later = _plan_l2(kv, now=NOW + 20_000 + wait, spans=spans, wait=wait)
    assert later is not None and later.input_keys == ["c", "d"]


def test_forty_level_one_objects_make_one_level_two_job_not_one_of_32(kv):
    topic = _level_one_objects(kv, 40)
    # 40 objects are not 256, and level 1's cap of 32 inputs does not start level 2.
    assert _plan_l2(kv, max_inputs=32) is None
    plan = _plan_l2(kv, now=NOW + 60_000, wait=60_000, max_inputs=32)
    assert plan.input_keys == [f"l{i:02}" for i in range(40)]
    assert len(plan.entries) == 40 and plan.input_bytes == 40 * 200
    assert _commit(kv, plan, "z", now=NOW + 60_000).committed
    assert _entries(kv, topic, 0) == [("z", 0, 79)]
    assert _l1_rows(kv) == {}


def test_level_two_inputs_start_a_job_by_their_own_count_and_max_entries_bounds_it(kv):
    _level_one_objects(kv, 40)
    plan = _plan_l2(kv, l2_max_inputs=40)  # no wait: 40 objects are enough
    assert len(plan.input_keys) == 40
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    plan = _plan_l2(kv, l2_max_inputs=25)
    assert plan.input_keys == [f"l{i:02}" for i in range(25)]
    kv.transact_sync(lambda tr: compaction.release(tr, SUB, plan, 1))
    # One entry an object here: max_entries keeps a job within one commit's limits
    # whatever the input cap.
    plan = _plan_l2(kv, l2_max_inputs=40, max_entries=30)
    assert len(plan.entries) == 30 and len(plan.input_keys) == 30


def test_a_row_of_the_older_five_field_format_reads_as_waiting_since_ever(kv):
    topic = _two_level_one_objects(kv)
    wait = NOW  # what a row whose time reads as 0 has waited at NOW
    assert _plan_l2(kv, wait=wait) is None  # written just now
    _set_l1_row(kv, topic.topic_id, 0, (400, 2, 0, -1, 0))  # as before rows kept a time
    assert _l1_rows(kv)[0] == (400, 2, 0, -1, 0)
    # A level-1 job adding to it keeps its (unknown, so oldest possible) time.
    _append(kv, topic, "e", {0: [(1, 50)]})
    _append(kv, topic, "f", {0: [(1, 60)]})
    assert _commit(kv, _plan_l1(kv), "w").committed
    assert _l1_rows(kv)[0] == (600, 3, 0, -1, 0, 0)
    plan = _plan_l2(kv, wait=wait)
    assert plan is not None and plan.input_keys == ["x", "y", "w"]


def test_objects_without_a_level_are_never_planned(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]})
    _append(kv, topic, "b", {0: [(1, 10)]})
    # As committed before levels: no queue row, no reverse index.
    kv.transact_sync(lambda tr: tr.clear_range(*SUB.range(keys.L0_OBJECT)))
    kv.transact_sync(lambda tr: tr.clear_range(*SUB.range(keys.OBJECT_CHUNK)))
    assert _plan_l1(kv) is None


def test_an_output_that_does_not_hold_the_inputs_is_refused(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]})
    _append(kv, topic, "b", {0: [(1, 10)]})
    plan = _plan_l1(kv)
    outputs = _outputs(plan, "x")[:-1] + [
        JobEntry(topic.topic_id, 0, log.ChunkEntry("x", 8, 150, 0, 1, 2, 10))
    ]
    with pytest.raises(ValueError):
        compaction.prepare_commit(SUB, plan, "x", 300, outputs)  # before any transaction
    with pytest.raises(ValueError):
        kv.transact_sync(
            lambda tr: compaction.commit_job(tr, SUB, plan, 1, "x", 300, outputs, NOW, DELAY)
        )
    assert _entries(kv, topic) == [("a", 0, 0), ("b", 1, 1)]


# Keys a compaction commit may change: the chunk index and the objects' bookkeeping.
COMPACTION_KEYS = {
    keys.CHUNK,
    keys.OBJECT,
    keys.DEAD_OBJECT,
    keys.OBJECT_CHUNK,
    keys.L0_OBJECT,
    keys.L1_PARTITION,
}


def _everything_else(kv: KV) -> list[tuple[bytes, bytes]]:
    """Every key and value of the cluster outside the chunk index, the objects'
    bookkeeping and the tallies: partitions, producers, transactions, aborted markers..."""
    rows = kv.transact_sync(lambda tr: tr.get_range(*SUB.range()))
    kept = []
    for key, value in rows:
        tag = SUB.unpack(key)[0]
        if tag in COMPACTION_KEYS or (tag == keys.CLUSTER and SUB.unpack(key)[1] == "tally"):
            continue
        kept.append((key, value))
    return kept


def test_compaction_leaves_partitions_producers_and_transactions_byte_for_byte(kv):
    """High watermarks, log start offsets, producer state (last sequences), open and
    aborted transactions: a level-1 and a level-2 commit change none of their keys."""
    topic = _topic(kv, partitions=1)

    def setup(tr):
        idem = cluster.allocate_producer_id(tr, SUB)
        producers.put_producer(tr, SUB, producers.ProducerIdentity(idem, 0, None))
        txn = cluster.allocate_producer_id(tr, SUB)
        producers.put_producer(tr, SUB, producers.ProducerIdentity(txn, 0, "tx"))
        txns.put_txn(tr, SUB, txns.Txn("tx", txn, 0, txns.TxnState.EMPTY, 60000, -1, 0, (), ()))
        return idem, txn

    idem, txn = kv.transact_sync(setup)

    def batch(count, pid=-1, seq=-1, transactional=False, control=log.NOT_CONTROL, start=0):
        return log.PendingBatch(
            topic.topic_id,
            0,
            start,
            100,
            count - 1,
            50,
            pid,
            0 if pid >= 0 else -1,
            seq,
            transactional,
            control,
        )

    def add_partition(tr):
        txns.add_partitions(tr, SUB, "tx", txn, 0, [(topic.topic_id, 0)], 1)

    def commit(key, batches):
        results = kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, 1000, 1, batches))
        assert all(r.error == ErrorCode.none for r in results), results

    kv.transact_sync(add_partition)
    commit(
        "a", [batch(2, pid=idem, seq=0), batch(3, pid=txn, seq=0, transactional=True, start=200)]
    )
    commit("b", [batch(1, pid=txn, control=log.ABORT_MARKER, transactional=True)])
    kv.transact_sync(add_partition)
    commit(
        "c", [batch(2, pid=idem, seq=2), batch(1, pid=txn, seq=3, transactional=True, start=200)]
    )
    commit("d", [batch(1), batch(2, pid=idem, seq=4, start=200)])  # the transaction stays open
    _change_delete_records(kv, topic)  # a log start above zero (2)
    before = _everything_else(kv)
    assert any(SUB.unpack(k)[0] == keys.ABORTED for k, _v in before)
    assert any(SUB.unpack(k)[0] == keys.PRODUCER_STATE for k, _v in before)

    plan = _plan_l1(kv, max_inputs=2)
    assert plan is not None and _commit(kv, plan, "x").committed
    plan = _plan_l1(kv, max_inputs=2)
    assert plan is not None and _commit(kv, plan, "y").committed
    assert {e.object_key for e in _full_entries(kv, topic)} == {"x", "y"}
    assert _everything_else(kv) == before
    plan = _plan_l2(kv, l2_max_inputs=2)
    assert plan is not None and _commit(kv, plan, "z").committed
    assert {e.object_key for e in _full_entries(kv, topic)} == {"z"}
    assert _everything_else(kv) == before


def test_a_compacted_topics_level_two_is_left_to_its_cleaner(kv):
    topic = _two_level_one_objects(kv)
    # Due by its objects and by its wait alike.
    plan = kv.transact_sync(
        lambda tr: compaction.plan_l2(
            tr,
            SUB,
            1,
            NOW + 1,
            Limits(l2_max_inputs=2),
            LEASE,
            None,
            {topic.topic_id},
            max_wait_ms=1,
        )
    )
    assert plan is None
    assert _l1_rows(kv) == {}  # its rows went: nothing waits for level 2


def test_the_oldest_object_leaves_the_queue_when_it_fits_with_none_after_it(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)] * 2})  # 200 bytes
    _append(kv, topic, "b", {0: [(1, 10)] * 2})  # 200 bytes: a and b make 400
    # No job within 350 bytes: a, first in line and fitting with nothing after it, leaves
    # the queue rather than block it.
    assert _plan_l1(kv, max_bytes=350) is None
    assert "a" not in _queued_l0(kv) and "b" in _queued_l0(kv)
    # b alone passed over nothing: it waits for a partner, which comes.
    assert _plan_l1(kv, max_bytes=350) is None
    assert "b" in _queued_l0(kv)
    _append(kv, topic, "c", {0: [(1, 10)]})  # 100 bytes
    assert _plan_l1(kv, max_bytes=350).input_keys == ["b", "c"]


def _select_l1(kv: KV, now: int = NOW, min_age: int = 0, **limits) -> compaction.L1Selection:
    return kv.transact_sync(
        lambda tr: compaction.select_l1(tr, SUB, now, min_age, Limits(**limits))
    )


def test_objects_of_entries_as_large_as_a_job_makes_enter_level_one_as_they_are(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 15)]}, length=300)  # p0 0-1, p1 0
    _append(kv, topic, "b", {0: [(3, 20)]}, length=300)  # p0 2-4
    _append(kv, topic, "c", {0: [(1, 5)]})  # p0 5, 100 bytes
    _append(kv, topic, "d", {0: [(1, 6)]})  # p0 6
    entries = [_full_entries(kv, topic, p) for p in (0, 1)]
    states = [_state(kv, topic, p) for p in (0, 1)]
    before = _tallies(kv)

    # Entries of 250 bytes or more enter level 1 as they are: a's and b's (300 bytes
    # each) move without a job; c and d (100 bytes each) are merged by one.
    plan = _plan_l1(kv, promote_bytes=250)
    assert plan is not None and plan.input_keys == ["c", "d"]
    assert _object(kv, "a") == lifecycle.ObjectRecord(602, 2, NOW, None, L1)
    assert _object(kv, "b") == lifecycle.ObjectRecord(301, 1, NOW, None, L1)
    assert sorted(_claims(kv)) == ["c", "d"]  # a and b left the queue
    assert _l1_rows(kv) == {0: (600, 2, 0, -1, 0, NOW), 1: (300, 1, 0, -1, 0, NOW)}
    # Nothing a reader sees changed: the same entries, offsets, bytes and tallies.
    assert [_full_entries(kv, topic, p) for p in (0, 1)] == entries
    assert [_state(kv, topic, p) for p in (0, 1)] == states
    assert _tallies(kv) == before
    assert _reverse(kv, "a") == [(0, 0, 1), (1, 0, 0)]

    # Level 2 takes them from there as it takes a level-1 job's output.
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    assert l2 is not None and l2.level == L2
    assert [(p, [e.object_key for e in es]) for _t, p, es in l2.partitions()] == [(0, ["a", "b"])]
    assert _commit(kv, l2, "L2", now=NOW + 1) == compaction.JobResult(True)
    assert _object(kv, "b") == lifecycle.ObjectRecord(301, 0, NOW, NOW + 1, L1)
    assert _object(kv, "a") == lifecycle.ObjectRecord(602, 1, NOW, None, L1)  # p1's entry
    assert _due(kv, NOW + 1 + DELAY) == [(NOW + 1 + DELAY, "b")]
    assert [(e.object_key, e.base_offset) for e in _full_entries(kv, topic, 0)] == [
        ("L2", 0),
        ("c", 5),
        ("d", 6),
    ]


def test_a_partition_behind_a_queued_ingest_file_waits_for_it_to_reach_level_one(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]})  # offset 0, 100 bytes: merged by a job
    _append(kv, topic, "b", {0: [(1, 20)]}, length=300)  # 1: promoted as it is
    _append(kv, topic, "c", {0: [(1, 30)]}, length=300)  # 2: promoted as it is
    assert _plan_l1(kv, promote_bytes=250) is None  # a alone is no job yet
    assert [_object(kv, k).level for k in "abc"] == [0, L1, L1]
    assert _l1_rows(kv)[0][:3] == (600, 2, 1)

    # b and c are due, but a holds the offset before them and waits for a level-1 job:
    # taken now, they would leave a's entry to reach level 1 after them, alone.
    assert _plan_l2(kv, now=NOW + 1, wait=0) is None
    assert _l1_rows(kv)[0][3] == -1  # nothing claimed

    _append(kv, topic, "d", {0: [(1, 40)]})  # offset 3
    l1 = _plan_l1(kv, promote_bytes=250)
    assert l1 is not None and l1.input_keys == ["a", "d"]
    assert _commit(kv, l1, "x").committed
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    assert l2 is not None
    taken = [(job.entry.object_key, job.entry.base_offset) for job in l2.entries]
    assert taken == [("x", 0), ("b", 1), ("c", 2), ("x", 3)]
    assert _commit(kv, l2, "z", now=NOW + 1).committed
    assert [e.object_key for e in _full_entries(kv, topic)] == ["z"]
    assert _l1_rows(kv) == {}


def test_a_level_one_run_before_a_queued_ingest_files_entry_waits_for_it(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]}, length=300)  # offset 0: promoted
    _append(kv, topic, "b", {0: [(1, 20)]})  # 1: waits for a level-1 job
    _append(kv, topic, "c", {0: [(1, 30)]}, length=300)  # 2
    _append(kv, topic, "d", {0: [(1, 40)]}, length=300)  # 3
    assert _plan_l1(kv, promote_bytes=250) is None
    assert _l1_rows(kv)[0][:3] == (900, 3, 0)

    # a's run ends at b, still to come: it waits for b rather than be passed over for
    # good, and c and d wait behind it (taken now, they would leave a alone).
    assert _plan_l2(kv, now=NOW + 1, wait=0) is None
    assert _l1_rows(kv)[0] == (900, 3, 0, -1, 0, NOW)

    _append(kv, topic, "e", {0: [(1, 50)]})  # 4
    l1 = _plan_l1(kv, promote_bytes=250)
    assert l1 is not None and l1.input_keys == ["b", "e"]
    assert _commit(kv, l1, "x").committed
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    taken = [(job.entry.object_key, job.entry.base_offset) for job in l2.entries]
    assert taken == [("a", 0), ("x", 1), ("c", 2), ("d", 3), ("x", 4)]


def test_a_partition_whose_level_one_begins_at_a_queued_ingest_files_entry_waits(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]}, length=300)  # offset 0
    _append(kv, topic, "b", {0: [(1, 20)]}, length=300)  # 1
    _append(kv, topic, "c", {0: [(1, 30)]})  # 2: waits for a level-1 job
    _append(kv, topic, "d", {0: [(1, 40)]}, length=300)  # 3
    _append(kv, topic, "e", {0: [(1, 50)]}, length=300)  # 4
    assert _plan_l1(kv, promote_bytes=250) is None
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    assert l2 is not None and l2.input_keys == ["a", "b"]  # a run of two objects goes
    assert _commit(kv, l2, "z", now=NOW + 1).committed
    assert _l1_rows(kv)[0][2] == 2  # level 1 from c's offset on

    # c is still level 0: d and e wait for it rather than leave it behind.
    assert _plan_l2(kv, now=NOW + 2, wait=0) is None
    _append(kv, topic, "f", {0: [(1, 60)]})  # 5
    assert _commit(kv, _plan_l1(kv, promote_bytes=250), "x").committed
    l2 = _plan_l2(kv, now=NOW + 2, wait=0)
    taken = [(job.entry.object_key, job.entry.base_offset) for job in l2.entries]
    assert taken == [("x", 2), ("d", 3), ("e", 4), ("x", 5)]


def test_a_level_two_commit_keeps_the_row_while_level_one_holds_more_than_it_counts(kv):
    topic = _topic(kv, partitions=1)
    for key, ts in (("a", 10), ("b", 20), ("c", 30)):  # offsets 0, 1, 2
        _append(kv, topic, key, {0: [(1, ts)]}, length=300)
    assert _plan_l1(kv, promote_bytes=250) is None
    # The row counts less than level 1 holds (a job that took part of an object's
    # entries of the partition counted the object gone, and the next one again).
    _set_l1_row(kv, topic.topic_id, 0, (600, 2, 0, -1, 0, NOW))
    l2 = _plan_l2(kv, now=NOW + 1, wait=0, max_entries=2)
    assert l2 is not None and l2.input_keys == ["a", "b"]
    assert _commit(kv, l2, "z", now=NOW + 1).committed
    # c is still in level 1: its row stays, from c's offset, rather than go with c left
    # out of every later plan.
    assert _l1_rows(kv)[0][1:3] == (1, 2)
    assert _l1_rows(kv)[0][0] == 300


def test_a_pass_over_that_empties_the_rows_counts_reads_on(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]}, length=300)  # offset 0
    _append(kv, topic, "big", {0: [(1, 20)]}, length=1000)  # 1: too large for a job
    _append(kv, topic, "c", {0: [(1, 30)]}, length=300)  # 2
    _append(kv, topic, "d", {0: [(1, 40)]}, length=300)  # 3
    assert _plan_l1(kv, promote_bytes=250, max_bytes=900) is None
    assert "big" not in _claims(kv)  # left in level 0 for good
    _set_l1_row(kv, topic.topic_id, 0, (300, 2, 0, -1, 0, NOW))  # counts short of c and d
    # a's run ends at big and is passed over; the counts say nothing is left, yet c and
    # d are: the plan reads on and takes them.
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    assert l2 is not None and l2.input_keys == ["c", "d"]


def test_a_partition_behind_an_ingest_file_out_of_the_queue_does_not_wait(kv):
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(1, 10)]}, length=1000)  # larger than a job: dropped
    _append(kv, topic, "b", {0: [(1, 20)]}, length=300)
    _append(kv, topic, "c", {0: [(1, 30)]}, length=300)
    assert _plan_l1(kv, promote_bytes=250, max_bytes=900) is None
    assert "a" not in _claims(kv) and _object(kv, "a").level == 0  # a level-0 object for good
    l2 = _plan_l2(kv, now=NOW + 1, wait=0)
    assert l2 is not None and l2.input_keys == ["b", "c"]


def test_an_object_with_one_small_entry_is_merged_by_a_job(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)]}, length=300)
    batches = [  # b: one entry of 300 bytes, one of 100
        log.PendingBatch(topic.topic_id, 0, 0, 300, 0, 20, -1, -1, -1),
        log.PendingBatch(topic.topic_id, 1, 301, 100, 0, 20, -1, -1, -1),
    ]
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, "b", 401, 1, batches))
    _append(kv, topic, "c", {1: [(1, 30)]})

    selection = _select_l1(kv, promote_bytes=250)
    assert [key for _c, key, _e in selection.promoted] == ["a"]
    assert [key for _c, key, _e in selection.chosen] == ["b", "c"]


def test_an_object_is_promoted_only_while_queued_unclaimed_and_alive(kv):
    topic = _topic(kv, partitions=1)
    for key, ts in (("a", 10), ("b", 20), ("c", 30)):
        _append(kv, topic, key, {0: [(1, ts)]}, length=300)
    selection = _select_l1(kv, promote_bytes=250)
    assert [key for _c, key, _e in selection.promoted] == ["a", "b", "c"]
    # Meanwhile retention takes a, and a job (promoting larger entries only) claims b and c.
    assert _retain(kv, topic, NOW, NOW - 15, -1).dropped == 1
    assert _object(kv, "a").dead_since_ms == NOW
    claimed = _plan_l1(kv, promote_bytes=1000)
    assert claimed is not None and claimed.input_keys == ["b", "c"]

    moved = kv.transact_sync(lambda tr: compaction.promote_l1(tr, SUB, selection, NOW))
    assert moved == 0
    assert [_object(kv, key).level for key in ("a", "b", "c")] == [0, 0, 0]
    assert _l1_rows(kv) == {}
    assert sorted(_claims(kv)) == ["b", "c"]
