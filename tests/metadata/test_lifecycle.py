"""The object lifecycle layer on every KV backend: log start offsets, retention, references
and the dead-object queue, deleted topics."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from metadata import keys, lifecycle, log, topics
from metadata.errors import MetadataError
from metadata.kv import KV

SUB = keys.cluster_subspace("test")
DELAY = 60_000  # the delete delay


def _topic(kv: KV, name: str = "t", partitions: int = 2) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, name, uuid.uuid4().bytes, partitions, {}, 0)
    )


def _append(
    kv: KV, topic: topics.Topic, key: str, parts: dict[int, list[tuple[int, int]]], *, length=100
) -> None:
    """Commit object `key` holding, per partition, batches of (record count, max timestamp),
    each `length` bytes, not byte-contiguous (one entry per batch)."""
    batches = []
    start = 0
    for partition, specs in parts.items():
        for count, ts in specs:
            batches.append(
                log.PendingBatch(
                    topic.topic_id, partition, start, length, count - 1, ts, -1, -1, -1
                )
            )
            start += length + 1
    results = kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, start, 1, batches))
    assert all(r.error == ErrorCode.none for r in results)


def _state(kv: KV, topic: topics.Topic, p: int = 0) -> log.PartitionState | None:
    return kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, p))


def _entries(kv: KV, topic: topics.Topic, p: int = 0) -> list[tuple[str, int, int]]:
    found = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, p, 0))
    return [(e.object_key, e.base_offset, e.last_offset) for e in found]


def _object(kv: KV, key: str) -> lifecycle.ObjectRecord | None:
    return kv.transact_sync(lambda tr: lifecycle.get_object(tr, SUB, key))


def _due(kv: KV, now: int) -> list[tuple[int, str]]:
    found = kv.transact_sync(lambda tr: lifecycle.due_dead_objects(tr, SUB, now))
    return [(d.due_ms, d.object_key) for d in found]


def test_commits_count_each_objects_entries_and_each_partitions_bytes(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10), (3, 20)], 1: [(1, 10)]})
    assert _object(kv, "a") == lifecycle.ObjectRecord(303, 3, 1, None, 0)
    assert _state(kv, topic, 0) == log.PartitionState(5, 0, 200)
    assert _state(kv, topic, 1) == log.PartitionState(1, 0, 100)


def test_delete_records_moves_the_log_start_and_drops_whole_entries_below_it(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 10)]})  # offsets 0-1 of p0
    _append(kv, topic, "b", {0: [(3, 20)]})  # offsets 2-4

    def delete_records(offset: int, now: int = 1000) -> lifecycle.Step:
        return kv.transact_sync(
            lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, offset, now, DELAY)
        )

    step = delete_records(3)  # inside b's entry: a's goes, b's stays
    assert (step.dropped, step.log_start_offset) == (1, 3)
    assert _state(kv, topic) == log.PartitionState(5, 3, 100)
    assert _entries(kv, topic) == [("b", 2, 4)]
    # a still holds partition 1's entry: not queued.
    assert _object(kv, "a") == lifecycle.ObjectRecord(202, 1, 1, None, 0)
    # Never backwards.
    assert delete_records(1).log_start_offset == 3
    assert _state(kv, topic).log_start_offset == 3
    # -1 is the high watermark; b goes now, and is queued for deletion one delay later.
    assert delete_records(-1, now=2000).log_start_offset == 5
    assert _entries(kv, topic) == []
    assert _object(kv, "b") == lifecycle.ObjectRecord(101, 0, 1, 2000, 0)
    assert _due(kv, 2000 + DELAY - 1) == []
    assert _due(kv, 2000 + DELAY) == [(2000 + DELAY, "b")]


@pytest.mark.parametrize("offset", [6, -2])
def test_delete_records_past_the_watermark_is_offset_out_of_range(kv, offset):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(5, 10)]})
    with pytest.raises(MetadataError) as failed:
        kv.transact_sync(
            lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, offset, 1, DELAY)
        )
    assert failed.value.error_code == ErrorCode.offset_out_of_range
    assert _state(kv, topic).log_start_offset == 0


def test_delete_records_of_a_missing_partition_is_unknown(kv):
    topic = _topic(kv)
    with pytest.raises(MetadataError) as failed:
        kv.transact_sync(
            lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 7, 0, 1, DELAY)
        )
    assert failed.value.error_code == ErrorCode.unknown_topic_or_partition


def _retain(kv, topic, now, retention_ms, retention_bytes, limit=lifecycle.STEP_ENTRIES):
    return kv.transact_sync(
        lambda tr: lifecycle.apply_retention(
            tr, SUB, topic.topic_id, 0, now, retention_ms, retention_bytes, DELAY, limit
        )
    )


def test_time_retention_drops_the_entries_whose_newest_record_is_too_old(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 100)]})  # offsets 0-1, newest record at 100
    _append(kv, topic, "b", {0: [(2, 300)]})  # 2-3
    _append(kv, topic, "c", {0: [(2, 200)]})  # 4-5: older than b, but after it
    step = _retain(kv, topic, now=1250, retention_ms=1000, retention_bytes=-1)
    # a is older than 250; b is not, so the log starts after a (c waits behind b).
    assert (step.dropped, step.log_start_offset, step.more) == (1, 2, False)
    assert _entries(kv, topic) == [("b", 2, 3), ("c", 4, 5)]
    step = _retain(kv, topic, now=1350, retention_ms=1000, retention_bytes=-1)
    assert (step.dropped, step.log_start_offset) == (2, 6)  # all gone: the watermark
    assert _state(kv, topic) == log.PartitionState(6, 6, 0)
    assert _due(kv, 10**12) == [(1250 + DELAY, "a"), (1350 + DELAY, "b"), (1350 + DELAY, "c")]


def test_size_retention_keeps_at_least_retention_bytes(kv):
    topic = _topic(kv)
    for i in range(5):  # five entries of 100 bytes
        _append(kv, topic, f"o{i}", {0: [(1, 10)]})
    step = _retain(kv, topic, now=20, retention_ms=-1, retention_bytes=250)
    # Kafka drops a segment while what is left still holds retention.bytes: 500 -> 300.
    assert (step.dropped, step.log_start_offset) == (2, 2)
    assert _state(kv, topic) == log.PartitionState(5, 2, 300)
    assert _retain(kv, topic, now=20, retention_ms=-1, retention_bytes=250).dropped == 0


def test_retention_goes_in_bounded_steps(kv):
    topic = _topic(kv)
    for i in range(7):
        _append(kv, topic, f"o{i}", {0: [(1, 10)]})
    steps = []
    while True:
        step = _retain(kv, topic, now=10_000, retention_ms=10, retention_bytes=-1, limit=3)
        steps.append((step.dropped, step.log_start_offset, step.more))
        if not step.more:
            break
    assert steps == [(3, 3, True), (3, 6, True), (1, 7, False)]
    assert _entries(kv, topic) == []


def test_nothing_goes_with_both_limits_off(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(3, 1)]})
    assert _retain(kv, topic, now=10**12, retention_ms=-1, retention_bytes=-1).dropped == 0
    assert _entries(kv, topic) == [("a", 0, 2)]


def test_a_partition_stored_without_its_bytes_gets_them_counted(kv):
    topic = _topic(kv)
    for i in range(3):
        _append(kv, topic, f"o{i}", {0: [(1, 10)]})
    # As stored before partitions counted their bytes.
    kv.transact_sync(
        lambda tr: tr.set(SUB.key(keys.PARTITION, topic.topic_id, 0), keys.pack_value((3, 0)))
    )
    assert _state(kv, topic) == log.PartitionState(3, 0, None)
    step = _retain(kv, topic, now=20, retention_ms=-1, retention_bytes=150)
    assert (step.dropped, _state(kv, topic)) == (1, log.PartitionState(3, 1, 200))


def test_the_dead_queue_is_forgotten_once_the_objects_are_deleted(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(1, 10)]})
    kv.transact_sync(
        lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, -1, 100, DELAY)
    )
    due = kv.transact_sync(lambda tr: lifecycle.due_dead_objects(tr, SUB, 100 + DELAY))
    assert [d.object_key for d in due] == ["a"]
    assert kv.transact_sync(lambda tr: lifecycle.known_objects(tr, SUB, ["a", "x"])) == {"a"}
    kv.transact_sync(lambda tr: lifecycle.forget_deleted(tr, SUB, due))
    assert _due(kv, 10**12) == []
    assert _object(kv, "a") is None
    assert kv.transact_sync(lambda tr: lifecycle.known_objects(tr, SUB, ["a"])) == set()


def test_a_deleted_topics_entries_are_dropped_in_steps_and_shared_objects_stay(kv):
    gone, kept = _topic(kv, "gone"), _topic(kv, "kept", partitions=1)
    for i in range(5):
        _append(kv, gone, f"g{i}", {0: [(1, 10)], 1: [(1, 10)]})
    # One object shared by both topics (a flush holds any partitions).
    batches = [
        log.PendingBatch(gone.topic_id, 0, 0, 100, 0, 10, -1, -1, -1),
        log.PendingBatch(kept.topic_id, 0, 101, 100, 0, 10, -1, -1, -1),
    ]
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, "shared", 201, 1, batches))
    kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "gone", 500))
    assert kv.transact_sync(lambda tr: lifecycle.deleted_topics(tr, SUB)) == [(gone.topic_id, 2)]
    rounds = 0
    while not kv.transact_sync(
        lambda tr: lifecycle.reap_deleted_topic(tr, SUB, gone.topic_id, 2, 600, DELAY, limit=4)
    ):
        rounds += 1
    assert rounds == 2  # 11 entries, 4 a step
    assert kv.transact_sync(lambda tr: lifecycle.deleted_topics(tr, SUB)) == []
    assert sorted(k for _d, k in _due(kv, 10**12)) == [f"g{i}" for i in range(5)]
    assert _object(kv, "shared") == lifecycle.ObjectRecord(201, 1, 1, None, 0)
    assert _entries(kv, kept) == [("shared", 0, 0)]


def test_a_lease_is_held_by_one_node_until_it_expires_or_is_released(kv):
    from metadata import leases

    def claim(node: int, now: int) -> bool:
        return kv.transact_sync(lambda tr: leases.claim(tr, SUB, "gc", node, now, 1000))

    assert claim(1, 0)
    assert not claim(2, 500)
    assert claim(1, 900)  # renewed until 1900
    assert not claim(2, 1899)
    assert claim(2, 1900)
    kv.transact_sync(lambda tr: leases.release(tr, SUB, "gc", 1))  # not its lease
    assert not claim(1, 2000)
    kv.transact_sync(lambda tr: leases.release(tr, SUB, "gc", 2))
    assert claim(1, 2000)


def test_retention_reads_page_after_page(kv):
    topic = _topic(kv, partitions=1)
    count = 2 * lifecycle.PAGE + 22
    batches = [
        log.PendingBatch(topic.topic_id, 0, i * 101, 100, 0, i, -1, -1, -1) for i in range(count)
    ]
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, "big", count * 101, 1, batches))
    keep = count - 5
    step = _retain(kv, topic, now=keep + 1000, retention_ms=1000, retention_bytes=-1)
    assert (step.dropped, step.log_start_offset, step.more) == (keep, keep, False)
    assert len(_entries(kv, topic)) == 5
    assert _object(kv, "big").live_entries == 5


def test_tallies_count_objects_bytes_and_entries_until_they_go(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(1, 10), (1, 10)], 1: [(1, 10)]})
    _append(kv, topic, "b", {0: [(1, 10)]})
    tallies = kv.transact_sync(lambda tr: lifecycle.read_tallies(tr, SUB))
    assert tallies == {"objects": 2, "object_bytes": 303 + 101, "chunk_entries": 4}
    kv.transact_sync(
        lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, -1, 0, DELAY)
    )
    due = kv.transact_sync(lambda tr: lifecycle.due_dead_objects(tr, SUB, DELAY))
    kv.transact_sync(lambda tr: lifecycle.forget_deleted(tr, SUB, due))
    tallies = kv.transact_sync(lambda tr: lifecycle.read_tallies(tr, SUB))
    assert tallies == {"objects": 1, "object_bytes": 303, "chunk_entries": 1}


def _reverse(kv: KV, key: str) -> list[tuple[int, int, int]]:
    """(partition, base, last) of the entries the object's reverse index names."""
    found = kv.transact_sync(lambda tr: log.object_entries(tr, SUB, key))
    return [(p, e.base_offset, e.last_offset) for _t, p, e in found]


def _queued_l0(kv: KV) -> list[str]:
    rows = kv.transact_sync(lambda tr: tr.get_range(*SUB.range(keys.L0_OBJECT)))
    return [str(SUB.unpack(k)[2]) for k, _v in rows]


def test_the_reverse_index_and_the_compaction_queue_follow_the_entries(kv):
    topic = _topic(kv)
    _append(kv, topic, "a", {0: [(2, 10)], 1: [(1, 10)]})  # p0 0-1, p1 0
    _append(kv, topic, "b", {0: [(3, 20)]})  # p0 2-4
    assert _reverse(kv, "a") == [(0, 0, 1), (1, 0, 0)]
    assert _reverse(kv, "b") == [(0, 2, 4)]
    # The copy is the entry itself.
    (entry,) = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 1, 0))
    assert kv.transact_sync(lambda tr: log.object_entries(tr, SUB, "a"))[1] == (
        topic.topic_id,
        1,
        entry,
    )
    assert _queued_l0(kv) == ["a", "b"]
    # DeleteRecords drops a's p0 entry: a still holds p1's, so it stays queued.
    kv.transact_sync(
        lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, 2, 100, DELAY)
    )
    assert _reverse(kv, "a") == [(1, 0, 0)]
    assert _queued_l0(kv) == ["a", "b"]
    # Retention drops b's: b is dead, and leaves the queue with its reverse index.
    _retain(kv, topic, now=10_000, retention_ms=10, retention_bytes=-1)
    assert _reverse(kv, "b") == []
    assert _queued_l0(kv) == ["a"]
    # The topic is deleted: a goes too.
    kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "t", 500))
    kv.transact_sync(
        lambda tr: lifecycle.reap_deleted_topic(tr, SUB, topic.topic_id, 2, 600, DELAY)
    )
    assert _reverse(kv, "a") == []
    assert _queued_l0(kv) == []


def test_an_object_record_written_before_levels_has_none(kv):
    kv.transact_sync(
        lambda tr: tr.set(SUB.key(keys.OBJECT, "old"), keys.pack_value((10, 1, 5, None)))
    )
    assert _object(kv, "old") == lifecycle.ObjectRecord(10, 1, 5, None, None)
    kv.transact_sync(lambda tr: lifecycle.unreference_many(tr, SUB, [("old", 1)], 50, DELAY))
    assert _object(kv, "old") == lifecycle.ObjectRecord(10, 0, 5, 50, None)
    assert _due(kv, 50 + DELAY) == [(50 + DELAY, "old")]
