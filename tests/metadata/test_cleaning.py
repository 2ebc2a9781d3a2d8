"""Cleaning compacted partitions in the metadata store, on every KV backend: how dirty a
partition is, stretch commits that replace exactly what they read or nothing, and the end
of a round."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from metadata import cleaning, cluster, keys, lifecycle, log, producers, topics, txns
from metadata.cleaning import Dirt
from metadata.kv import KV
from tests.metadata.test_lifecycle import DELAY, SUB, _append, _due, _object, _state, _topic

NOW = 1_000_000
HOUR = 3_600_000


def _measure(kv: KV, topic: topics.Topic, now: int = NOW, min_lag: int = 0) -> Dirt:
    dirt = kv.transact_sync(lambda tr: cleaning.measure(tr, SUB, topic.topic_id, 0, now, min_lag))
    assert dirt is not None
    return dirt


def _entries(kv: KV, topic: topics.Topic) -> list[log.ChunkEntry]:
    return kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))


def _reverse(kv: KV, object_key: str) -> list[int]:
    rows = kv.transact_sync(lambda tr: tr.get_range(*SUB.range(keys.OBJECT_CHUNK, object_key)))
    return [int(SUB.unpack(k)[-1]) for k, _v in rows]


def _commit(kv: KV, topic, inputs, key, size, outputs, now=NOW, removed_abort_markers=()):
    return kv.transact_sync(
        lambda tr: cleaning.commit_stretch(
            tr,
            SUB,
            topic.topic_id,
            0,
            inputs,
            key,
            size,
            outputs,
            now,
            DELAY,
            removed_abort_markers,
        )
    )


def _four_entries(kv: KV) -> topics.Topic:
    """Partition 0: offsets 0-1 (a), 2-4 (b), 5 (c), 6-7 (d); 100 bytes each."""
    topic = _topic(kv, partitions=1)
    _append(kv, topic, "a", {0: [(2, 10)]})
    _append(kv, topic, "b", {0: [(3, 20)]})
    _append(kv, topic, "c", {0: [(1, 30)]})
    _append(kv, topic, "d", {0: [(2, 40)]})
    return topic


def test_a_partition_never_cleaned_is_all_dirty(kv):
    topic = _four_entries(kv)
    assert _measure(kv, topic) == Dirt(0, 0, 8, 400, 400, 10)
    assert _measure(kv, topic).ratio == 1.0


def test_min_compaction_lag_and_the_last_stable_offset_end_what_is_cleanable(kv):
    topic = _four_entries(kv)
    # Records newer than now - lag: c's newest (30) and after stay dirty and uncleanable.
    assert _measure(kv, topic, now=1000, min_lag=975) == Dirt(0, 0, 5, 200, 200, 10)

    def open_transaction(tr):
        pid = cluster.allocate_producer_id(tr, SUB)
        producers.put_producer(tr, SUB, producers.ProducerIdentity(pid, 0, "tx"))
        txns.put_txn(tr, SUB, txns.Txn("tx", pid, 0, txns.TxnState.EMPTY, 60000, -1, 0, (), ()))
        txns.add_partitions(tr, SUB, "tx", pid, 0, [(topic.topic_id, 0)], 1)
        return pid

    pid = kv.transact_sync(open_transaction)
    batch = log.PendingBatch(topic.topic_id, 0, 0, 100, 1, 50, pid, 0, 0, True)
    results = kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, "e", 100, 1, [batch]))
    assert results[0].error == ErrorCode.none  # offsets 8-9, open
    _append(kv, topic, "f", {0: [(1, 60)]})  # offset 10, after the open transaction
    assert _measure(kv, topic) == Dirt(0, 0, 8, 400, 400, 10)


def test_worth_cleaning_by_ratio_or_by_max_lag():
    dirt = Dirt(0, 4, 8, 100, 400, 500)
    assert not dirt.worth_cleaning(now_ms=1000, min_ratio=0.5, max_lag_ms=HOUR)
    assert dirt.worth_cleaning(now_ms=1000, min_ratio=0.25, max_lag_ms=HOUR)
    # A dirty record older than max.compaction.lag.ms forces a round.
    assert dirt.worth_cleaning(now_ms=1000, min_ratio=0.5, max_lag_ms=499)
    # Nothing cleanable past the first dirty offset: never.
    assert not Dirt(0, 8, 8, 0, 400, None).worth_cleaning(0, 0.0, 0)


def test_a_stretch_commit_replaces_exactly_its_entries_with_fewer_bytes(kv):
    topic = _four_entries(kv)
    before = _state(kv, topic)
    tallies = kv.transact_sync(lambda tr: lifecycle.read_tallies(tr, SUB))
    inputs = _entries(kv, topic)[:3]  # a, b, c: offsets 0-5
    outputs = [
        log.ChunkEntry("clean", 8, 60, 1, 1, 1, 10),  # offset 0 gone
        log.ChunkEntry("clean", 68, 80, 3, 5, 2, 30),  # offset 2 gone, 4 kept with 5
    ]
    assert _commit(kv, topic, inputs, "clean", 200, outputs).committed

    assert [(e.object_key, e.base_offset, e.last_offset) for e in _entries(kv, topic)] == [
        ("clean", 1, 1),
        ("clean", 3, 5),
        ("d", 6, 7),
    ]
    assert _reverse(kv, "clean") == [1, 5]
    for key in "abc":  # each lost its only entry: dead, due one delete delay on
        assert _object(kv, key).live_entries == 0
        assert _reverse(kv, key) == []
    assert _due(kv, NOW + DELAY) == [(NOW + DELAY, k) for k in "abc"]
    assert _object(kv, "clean") == lifecycle.ObjectRecord(200, 2, NOW, None, cleaning.L2)
    after = _state(kv, topic)
    assert (after.high_watermark, after.log_start_offset) == (
        before.high_watermark,
        before.log_start_offset,
    )
    assert after.log_bytes == before.log_bytes - 300 + 140
    assert kv.transact_sync(lambda tr: lifecycle.read_tallies(tr, SUB)) == {
        "objects": tallies["objects"] + 1,
        "object_bytes": tallies["object_bytes"] + 200,
        "chunk_entries": tallies["chunk_entries"] - 1,
    }


def test_a_stretch_left_with_nothing_needs_no_object(kv):
    topic = _four_entries(kv)
    inputs = _entries(kv, topic)[1:3]  # b, c
    assert _commit(kv, topic, inputs, None, 0, []).committed
    assert [(e.base_offset, e.last_offset) for e in _entries(kv, topic)] == [(0, 1), (6, 7)]
    assert _state(kv, topic).high_watermark == 8


@pytest.mark.parametrize("change", ["delete_records", "another_round", "topic_deleted"])
def test_a_stretch_commit_changes_nothing_when_an_input_changed(kv, change):
    topic = _four_entries(kv)
    inputs = _entries(kv, topic)[:2]
    if change == "delete_records":
        kv.transact_sync(
            lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, 2, NOW, DELAY)
        )
    elif change == "another_round":
        other = [log.ChunkEntry("other", 8, 150, 1, 4, 2, 20)]
        assert _commit(kv, topic, inputs, "other", 158, other).committed
    else:
        kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "t", NOW))
    entries = _entries(kv, topic)
    state = _state(kv, topic)
    outputs = [log.ChunkEntry("late", 8, 150, 1, 4, 2, 20)]
    result = _commit(kv, topic, inputs, "late", 158, outputs)
    assert not result.committed and result.reason
    assert _entries(kv, topic) == entries
    assert _state(kv, topic) == state
    # The output is garbage at once: no entry ever named it.
    assert _object(kv, "late") == lifecycle.ObjectRecord(158, 0, NOW, NOW, cleaning.L2)
    assert (NOW, "late") in _due(kv, NOW)


def test_cleaned_entries_must_fit_the_stretch_in_order(kv):
    topic = _four_entries(kv)
    inputs = _entries(kv, topic)[:2]  # offsets 0-4
    for outputs in (
        [log.ChunkEntry("x", 8, 10, 4, 5, 1, 1)],  # past the stretch
        [log.ChunkEntry("x", 8, 10, 2, 3, 1, 1), log.ChunkEntry("x", 18, 10, 1, 1, 1, 1)],
        [log.ChunkEntry("y", 8, 10, 0, 0, 1, 1)],  # another object
        [log.ChunkEntry("x", 8, 201, 0, 4, 2, 1)],  # more bytes than the stretch
    ):
        with pytest.raises(ValueError):
            _commit(kv, topic, inputs, "x", 300, outputs)
    assert _entries(kv, topic)[:2] == inputs


def test_stretches_are_whole_entries_below_the_end_within_a_budget(kv):
    topic = _four_entries(kv)

    def stretch(start, end, budget):
        found = kv.transact_sync(
            lambda tr: cleaning.stretch_entries(tr, SUB, topic.topic_id, 0, start, end, budget)
        )
        return [(e.base_offset, e.last_offset) for e in found]

    assert stretch(0, 8, 250) == [(0, 1), (2, 4)]
    assert stretch(5, 8, 250) == [(5, 5), (6, 7)]
    assert stretch(0, 8, 10) == [(0, 1)]  # one entry at least
    assert stretch(0, 5, 1000) == [(0, 1), (2, 4)]  # c ends at 5: not below the end


def test_a_stretch_commit_clears_the_aborts_whose_markers_it_removed(kv):
    topic = _four_entries(kv)
    for marker, first in ((5, 2), (7, 6)):
        kv.transact_sync(
            lambda tr, marker=marker, first=first: tr.set(
                SUB.key(keys.ABORTED, topic.topic_id, 0, marker), keys.pack_value((7, first))
            )
        )
    inputs = _entries(kv, topic)[1:3]  # offsets 2-5
    outputs = [log.ChunkEntry("clean", 8, 10, 3, 3, 1, 20)]
    with pytest.raises(ValueError):  # a marker the stretch does not hold
        _commit(kv, topic, inputs, "clean", 18, outputs, removed_abort_markers=[7])
    assert _commit(kv, topic, inputs, "clean", 18, outputs, removed_abort_markers=[5]).committed
    aborted = kv.transact_sync(lambda tr: txns.aborted_between(tr, SUB, topic.topic_id, 0, 0, 8))
    assert aborted == [(7, 6)]


def test_a_round_moves_the_first_dirty_offset_forward_only(kv):
    topic = _four_entries(kv)
    kv.transact_sync(lambda tr: cleaning.finish_round(tr, SUB, topic.topic_id, 0, 5))
    assert _measure(kv, topic) == Dirt(0, 5, 8, 200, 400, 30)
    kv.transact_sync(lambda tr: cleaning.finish_round(tr, SUB, topic.topic_id, 0, 2))
    assert _measure(kv, topic).first_dirty_offset == 5
    # The log start moving past it makes the dirty part start there.
    kv.transact_sync(
        lambda tr: lifecycle.advance_log_start(tr, SUB, topic.topic_id, 0, 6, NOW, DELAY)
    )
    assert _measure(kv, topic) == Dirt(6, 6, 8, 100, 100, 40)
