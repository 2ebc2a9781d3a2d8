"""Transactions at the partition level: open transactions hold the last stable offset,
markers close them, aborted ones enter the index."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from metadata import cluster, keys, log, producers, topics, txns
from metadata.errors import MetadataError
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")


@pytest.fixture
def kv(tmp_path):
    return SQLiteKV(str(tmp_path / "meta.db"))


@pytest.fixture
def topic(kv) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 1, {}, 0)
    )


def new_txn_producer(kv, tid: str) -> int:
    def txn(tr):
        pid = cluster.allocate_producer_id(tr, SUB)
        producers.put_producer(tr, SUB, producers.ProducerIdentity(pid, 0, tid))
        txns.put_txn(tr, SUB, txns.Txn(tid, pid, 0, txns.TxnState.EMPTY, 60000, -1, 0, (), ()))
        return pid

    return kv.transact_sync(txn)


def batch(topic, count, *, pid=-1, seq=-1, transactional=False, control=log.NOT_CONTROL):
    return log.PendingBatch(
        topic_id=topic.topic_id,
        partition=0,
        start=0,
        length=10,
        last_offset_delta=count - 1,
        max_timestamp=0,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
        transactional=transactional,
        control=control,
    )


def commit(kv, batches):
    return kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, uuid.uuid4().hex, 10, 0, batches))


def lso(kv, topic) -> int:
    def read(tr):
        state = log.get_partition(tr, SUB, topic.topic_id, 0)
        return txns.last_stable_offset(tr, SUB, topic.topic_id, 0, state.high_watermark)

    return kv.transact_sync(read)


def test_transactional_batch_needs_the_partition_in_an_ongoing_transaction(kv, topic):
    pid = new_txn_producer(kv, "tx")
    (res,) = commit(kv, [batch(topic, 2, pid=pid, seq=0, transactional=True)])
    assert res.error == ErrorCode.invalid_txn_state
    kv.transact_sync(
        lambda tr: txns.add_partitions(tr, SUB, "tx", pid, 0, [(topic.topic_id, 0)], 1)
    )
    (res,) = commit(kv, [batch(topic, 2, pid=pid, seq=0, transactional=True)])
    assert (res.error, res.base_offset) == (ErrorCode.none, 0)


def test_open_transaction_holds_the_lso_and_an_abort_marker_indexes_it(kv, topic):
    pid = new_txn_producer(kv, "tx")
    commit(kv, [batch(topic, 3)])  # offsets 0-2, plain
    kv.transact_sync(
        lambda tr: txns.add_partitions(tr, SUB, "tx", pid, 0, [(topic.topic_id, 0)], 1)
    )
    commit(kv, [batch(topic, 2, pid=pid, seq=0, transactional=True)])  # 3-4, open
    commit(kv, [batch(topic, 1)])  # 5, plain, after the open transaction
    assert lso(kv, topic) == 3
    (marker,) = commit(kv, [batch(topic, 1, pid=pid, control=log.ABORT_MARKER, transactional=True)])
    assert marker.base_offset == 6
    assert lso(kv, topic) == 7
    aborted = kv.transact_sync(lambda tr: txns.aborted_between(tr, SUB, topic.topic_id, 0, 0, 7))
    assert aborted == [(pid, 3)]
    # a fetch starting after the marker sees no aborted transaction
    assert kv.transact_sync(lambda tr: txns.aborted_between(tr, SUB, topic.topic_id, 0, 7, 7)) == []


def test_aborted_between_reads_at_most_scan_limit_markers(kv, topic):
    pid = new_txn_producer(kv, "tx")
    for i in range(5):  # each: two records, then an abort marker: 3 offsets per round
        kv.transact_sync(
            lambda tr: txns.add_partitions(tr, SUB, "tx", pid, 0, [(topic.topic_id, 0)], 1)
        )
        commit(kv, [batch(topic, 2, pid=pid, seq=2 * i, transactional=True)])
        commit(kv, [batch(topic, 1, pid=pid, control=log.ABORT_MARKER, transactional=True)])

    def between(start, end, limit):
        return kv.transact_sync(
            lambda tr: txns.aborted_between(
                tr, SUB, topic.topic_id, 0, start, end, scan_limit=limit
            )
        )

    everything = [(pid, 3 * i) for i in range(5)]
    assert between(0, 15, 0) == everything
    assert between(0, 15, 5) == everything
    assert between(0, 15, 4) is None  # five markers to read, four allowed
    # Markers are read from the start on, also those of transactions past the end.
    assert between(0, 4, 5) == everything[:2]
    assert between(0, 4, 4) is None
    assert between(6, 15, 3) == everything[2:]


def test_commit_marker_closes_without_indexing(kv, topic):
    pid = new_txn_producer(kv, "tx")
    kv.transact_sync(
        lambda tr: txns.add_partitions(tr, SUB, "tx", pid, 0, [(topic.topic_id, 0)], 1)
    )
    commit(kv, [batch(topic, 2, pid=pid, seq=0, transactional=True)])
    assert lso(kv, topic) == 0
    commit(kv, [batch(topic, 1, pid=pid, control=log.COMMIT_MARKER, transactional=True)])
    assert lso(kv, topic) == 3
    assert kv.transact_sync(lambda tr: txns.aborted_between(tr, SUB, topic.topic_id, 0, 0, 3)) == []


def test_fenced_epoch_and_wrong_producer(kv, topic):
    pid = new_txn_producer(kv, "tx")
    kv.transact_sync(
        lambda tr: txns.put_txn(
            tr, SUB, txns.Txn("tx", pid, 3, txns.TxnState.EMPTY, 1, -1, 0, (), ())
        )
    )
    with pytest.raises(MetadataError) as fenced:
        kv.transact_sync(lambda tr: txns.add_partitions(tr, SUB, "tx", pid, 2, [], 1))
    assert fenced.value.error_code == ErrorCode.producer_fenced
    with pytest.raises(MetadataError) as wrong:
        kv.transact_sync(lambda tr: txns.add_partitions(tr, SUB, "tx", pid + 1, 3, [], 1))
    assert wrong.value.error_code == ErrorCode.invalid_producer_id_mapping


def txn_at(pid: int, epoch: int, last_pid: int = -1, last_epoch: int = -1) -> txns.Txn:
    return txns.Txn(
        "tx", pid, epoch, txns.TxnState.COMPLETE_ABORT, 1, -1, 0, (), (), last_pid, last_epoch
    )


EXHAUSTED = txns.MAX_EPOCH - 1
NEW_ID = txns.NEW_PRODUCER_ID


@pytest.mark.parametrize(
    ("txn", "expected", "answer"),
    [
        # A new instance (no expected producer): the next epoch, no retry possible after.
        (txn_at(7, 3, 7, 2), (-1, -1), (4, -1)),
        (txn_at(7, EXHAUSTED), (-1, -1), (NEW_ID, -1)),
        # KIP-360: the producer bumps its own epoch; the epoch it had becomes the last.
        (txn_at(7, 3), (7, 3), (4, 3)),
        # ... and a retry of that bump (its answer lost) gets the bumped epoch again.
        (txn_at(7, 4, 7, 3), (7, 3), (4, 3)),
        # Its epochs exhausted, it gets a new producer id; a retry of that gets it again.
        (txn_at(7, EXHAUSTED), (7, EXHAUSTED), (NEW_ID, EXHAUSTED)),
        (txn_at(8, 0, 7, EXHAUSTED), (7, EXHAUSTED), (0, EXHAUSTED)),
    ],
)
def test_init_epoch_follows_kafka(txn, expected, answer) -> None:
    assert txns.init_epoch(txn, *expected) == answer


@pytest.mark.parametrize(
    ("txn", "expected"),
    [
        (txn_at(7, 4, 7, 3), (7, 2)),  # older than the last epoch
        (txn_at(7, 4), (7, 3)),  # fenced by a new instance since (no last epoch)
        (txn_at(7, 4, 7, 3), (7, 5)),  # an epoch never handed out
        (txn_at(7, 4, 7, 3), (6, 3)),  # another producer id
        (txn_at(8, 0, 7, EXHAUSTED), (7, 5)),  # the previous id, epochs not exhausted
    ],
)
def test_init_epoch_fences_what_is_not_the_producer_or_a_retry(txn, expected) -> None:
    with pytest.raises(MetadataError) as fenced:
        txns.init_epoch(txn, *expected)
    assert fenced.value.error_code == ErrorCode.producer_fenced


def test_transactions_stored_before_the_last_epoch_was_kept_read_as_without_one(kv) -> None:
    """A value of the eight fields written before last_producer_id/last_epoch existed."""
    old = ("tx", 7, 3, "CompleteCommit", 60000, -1, 5, (), ())[1:]
    kv.transact_sync(lambda tr: tr.set(SUB.key(keys.TXN, "tx"), keys.pack_value(old)))
    txn = kv.transact_sync(lambda tr: txns.get_txn(tr, SUB, "tx"))
    assert (txn.producer_id, txn.epoch, txn.last_producer_id, txn.last_epoch) == (7, 3, -1, -1)
    kv.transact_sync(lambda tr: txns.put_txn(tr, SUB, txn))
    assert kv.transact_sync(lambda tr: txns.get_txn(tr, SUB, "tx")) == txn
