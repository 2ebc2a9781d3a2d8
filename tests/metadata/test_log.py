"""The append transaction: dense offsets, chunk entries, idempotent-producer rules."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from metadata import cluster, keys, log, producers, topics
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")


@pytest.fixture
def kv(tmp_path):
    store = SQLiteKV(str(tmp_path / "meta.db"))
    yield store
    store.transact_sync(lambda tr: None)


@pytest.fixture
def topic(kv) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 2, {}, 0)
    )


def batch(topic, partition, start, count, *, pid=-1, epoch=-1, seq=-1, length=100, ts=1000):
    return log.PendingBatch(
        topic_id=topic.topic_id,
        partition=partition,
        start=start,
        length=length,
        last_offset_delta=count - 1,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def commit(kv, batches, key="obj-1"):
    return kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, 10_000, 5, batches))


def new_producer(kv) -> int:
    def txn(tr):
        pid = cluster.allocate_producer_id(tr, SUB)
        producers.put_producer(tr, SUB, producers.ProducerIdentity(pid, 0, None))
        return pid

    return kv.transact_sync(txn)


def test_offsets_are_dense_per_partition_and_runs_become_one_entry(kv, topic):
    results = commit(
        kv,
        [batch(topic, 0, 8, 3), batch(topic, 1, 108, 2), batch(topic, 0, 208, 5, length=50)],
    )
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 0),
        (ErrorCode.none, 3),
    ]
    results = commit(kv, [batch(topic, 0, 8, 1)], key="obj-2")
    assert results[0].base_offset == 8
    state = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert state == log.PartitionState(9, 0, 250)  # bytes of its three entries
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    # batches at 8 (len 100) and 208 are not byte-contiguous: two entries in obj-1
    assert [(e.object_key, e.start, e.length, e.base_offset, e.last_offset) for e in entries] == [
        ("obj-1", 8, 100, 0, 2),
        ("obj-1", 208, 50, 3, 7),
        ("obj-2", 8, 100, 8, 8),
    ]
    # the entry holding offset 5 is found by its last offset
    found = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 5, 1))
    assert found[0].base_offset == 3


def test_read_chunks_stops_at_what_a_byte_budget_can_use(kv, topic):
    for i in range(6):  # six entries of 100 bytes, one per object
        commit(kv, [batch(topic, 0, 0, 1)], key=f"obj-{i}")

    def lengths(from_offset, max_bytes):
        entries = kv.transact_sync(
            lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, from_offset, 16, max_bytes)
        )
        return [e.base_offset for e in entries]

    assert lengths(0, None) == [0, 1, 2, 3, 4, 5]
    # The first entry does not count; then entries until 250 bytes are covered.
    assert lengths(0, 250) == [0, 1, 2, 3]
    assert lengths(2, 200) == [2, 3, 4]
    assert lengths(0, 1) == [0, 1]
    assert lengths(4, 10_000) == [4, 5]


class _CountingReads:
    """A read transaction that counts the pairs its ranges answered."""

    def __init__(self, tr):
        self._tr = tr
        self.pairs = 0

    def get(self, key):
        return self._tr.get(key)

    def get_range(self, begin, end, *, limit=0, reverse=False):
        rows = self._tr.get_range(begin, end, limit=limit, reverse=reverse)
        self.pairs += len(rows)
        return rows


def test_read_chunks_with_a_budget_reads_a_few_pairs_past_it_not_the_whole_limit(kv, topic):
    for i in range(300):  # 300 entries of 100 bytes, one per object
        commit(kv, [batch(topic, 0, 0, 1)], key=f"obj-{i}")

    def read(from_offset, limit, max_bytes):
        def txn(tr):
            counting = _CountingReads(tr)
            entries = log.read_chunks(
                counting, SUB, topic.topic_id, 0, from_offset, limit, max_bytes
            )
            return [e.base_offset for e in entries], counting.pairs

        return kv.read_sync(txn)

    # 1,000 bytes: 11 entries, found in the first page.
    assert read(0, 1024, 1000) == (list(range(11)), log.FIRST_PAGE)
    # 5,000 bytes: 51 entries, in two pages (32 + 64).
    assert read(10, 1024, 5000) == (list(range(10, 61)), 3 * log.FIRST_PAGE)
    # Everything: every entry once, across the pages; and the limit still holds.
    assert read(0, 1024, 10**9) == (list(range(300)), 300)
    assert read(0, 0, 10**9) == (list(range(300)), 300)
    assert read(5, 40, 10**9) == (list(range(5, 45)), 40)
    assert read(299, 1024, 10**9) == ([299], 1)


def test_contiguous_batches_share_an_entry(kv, topic):
    commit(kv, [batch(topic, 0, 0, 2), batch(topic, 0, 100, 3)])
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    assert [(e.start, e.length, e.base_offset, e.last_offset, e.batch_count) for e in entries] == [
        (0, 200, 0, 4, 2)
    ]


def test_deleted_topic_gets_unknown_topic(kv, topic):
    kv.transact_sync(lambda tr: topics.delete_topic(tr, SUB, "t"))
    (result,) = commit(kv, [batch(topic, 0, 0, 1)])
    assert result.error == ErrorCode.unknown_topic_or_partition


def test_idempotent_duplicate_is_answered_with_the_original_offset(kv, topic):
    pid = new_producer(kv)
    commit(kv, [batch(topic, 0, 0, 1)])  # someone else's record first
    (first,) = commit(kv, [batch(topic, 0, 0, 4, pid=pid, epoch=0, seq=0)], key="o2")
    assert (first.error, first.base_offset, first.duplicate) == (ErrorCode.none, 1, False)
    (retry,) = commit(kv, [batch(topic, 0, 0, 4, pid=pid, epoch=0, seq=0)], key="o3")
    assert (retry.error, retry.base_offset, retry.duplicate) == (ErrorCode.none, 1, True)
    state = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert state.high_watermark == 5  # the retry took no offsets
    (nxt,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=4)], key="o4")
    assert (nxt.error, nxt.base_offset) == (ErrorCode.none, 5)


def test_duplicate_inside_one_flush_is_stored_once(kv, topic):
    pid = new_producer(kv)
    results = commit(
        kv,
        [
            batch(topic, 0, 0, 2, pid=pid, epoch=0, seq=0),
            batch(topic, 0, 100, 2, pid=pid, epoch=0, seq=0),
            batch(topic, 0, 200, 2, pid=pid, epoch=0, seq=2),
        ],
    )
    assert [(r.error, r.base_offset, r.duplicate) for r in results] == [
        (ErrorCode.none, 0, False),
        (ErrorCode.none, 0, True),
        (ErrorCode.none, 2, False),
    ]
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    assert [(e.start, e.length, e.base_offset) for e in entries] == [(0, 100, 0), (200, 100, 2)]


def test_sequence_gap_is_out_of_order(kv, topic):
    pid = new_producer(kv)
    commit(kv, [batch(topic, 0, 0, 2, pid=pid, epoch=0, seq=0)])
    (gap,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=5)], key="o2")
    assert gap.error == ErrorCode.out_of_order_sequence_number
    state = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert state.high_watermark == 2


def test_stale_epoch_is_fenced_and_new_epoch_must_start_at_zero(kv, topic):
    pid = new_producer(kv)
    commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=3, seq=0)])
    (stale,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=2, seq=1)], key="o2")
    assert stale.error == ErrorCode.invalid_producer_epoch
    (bad_new,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=4, seq=7)], key="o3")
    assert bad_new.error == ErrorCode.out_of_order_sequence_number
    (good_new,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=4, seq=0)], key="o4")
    assert (good_new.error, good_new.base_offset) == (ErrorCode.none, 1)


def test_unknown_producer_id(kv, topic):
    (result,) = commit(kv, [batch(topic, 0, 0, 1, pid=987654, epoch=0, seq=0)])
    assert result.error == ErrorCode.unknown_producer_id


def test_sequence_wraps_at_int32_max(kv, topic):
    pid = new_producer(kv)
    top = 2**31 - 1
    commit(kv, [batch(topic, 0, 0, top, pid=pid, epoch=0, seq=0)])  # sequences 0..top-1
    commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=top)], key="o2")
    (wrapped,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=0)], key="o3")
    assert (wrapped.error, wrapped.base_offset) == (ErrorCode.none, top + 1)


def test_a_first_batch_must_be_sequence_zero(kv, topic):
    pid = new_producer(kv)
    (late,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=3)])
    assert late.error == ErrorCode.out_of_order_sequence_number
    (first,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=0)], key="o2")
    assert (first.error, first.base_offset) == (ErrorCode.none, 0)


def test_only_last_five_batches_are_remembered(kv, topic):
    pid = new_producer(kv)
    for seq in range(7):
        commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=seq)], key=f"o{seq}")
    (recent,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=3)], key="r1")
    assert (recent.error, recent.base_offset) == (ErrorCode.none, 3)
    (old,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=1)], key="r2")
    assert old.error == ErrorCode.out_of_order_sequence_number


def test_expired_batches_are_refused_and_leave_no_trace(kv, topic):
    pid = new_producer(kv)
    results = kv.transact_sync(
        lambda tr: log.commit_ingest(
            tr,
            SUB,
            "obj-late",
            10_000,
            5,
            [
                batch(topic, 0, 0, 2),
                batch(topic, 0, 100, 4, pid=pid, epoch=0, seq=0),
                batch(topic, 0, 200, 3),
            ],
            {1},
        )
    )
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.request_timed_out, -1),
        (ErrorCode.none, 2),
    ]
    state = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert state.high_watermark == 5
    # The producer's sequence did not move: its retry of the refused batch is written.
    (retry,) = commit(kv, [batch(topic, 0, 0, 4, pid=pid, epoch=0, seq=0)], key="o2")
    assert (retry.error, retry.base_offset, retry.duplicate) == (ErrorCode.none, 5, False)
    entries = kv.transact_sync(lambda tr: list(log.read_chunks(tr, SUB, topic.topic_id, 0, 0)))
    assert [(e.object_key, e.start, e.length) for e in entries] == [
        ("obj-late", 0, 100),
        ("obj-late", 200, 100),
        ("o2", 0, 100),
    ]


def test_after_a_refused_first_batch_a_later_one_must_wait_for_its_retry(kv, topic):
    # No state for the producer yet: the batch after the refused one must not be taken
    # past the gap (a client seeing it succeed would count the first as written, as
    # librdkafka does).
    pid = new_producer(kv)
    (refused,) = kv.transact_sync(
        lambda tr: log.commit_ingest(
            tr, SUB, "o1", 10_000, 5, [batch(topic, 0, 0, 2, pid=pid, epoch=0, seq=0)], {0}
        )
    )
    assert refused.error == ErrorCode.request_timed_out
    (later,) = commit(kv, [batch(topic, 0, 0, 1, pid=pid, epoch=0, seq=2)], key="o2")
    assert later.error == ErrorCode.out_of_order_sequence_number
    retry, then = commit(
        kv,
        [
            batch(topic, 0, 0, 2, pid=pid, epoch=0, seq=0),
            batch(topic, 0, 100, 1, pid=pid, epoch=0, seq=2),
        ],
        key="o3",
    )
    assert [(r.error, r.base_offset) for r in (retry, then)] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 2),
    ]


def _statements_of_an_ingest_commit(kv, partitions: int) -> int:
    """SQLite statements of the commit of one file holding a batch of each of two
    idempotent producers in each of `partitions` partitions (and their second ones)."""
    topic = kv.transact_sync(
        lambda tr: topics.create_topic(
            tr, SUB, f"t{partitions}", uuid.uuid4().bytes, partitions, {}, 0
        )
    )
    pids = [new_producer(kv), new_producer(kv)]

    def batches(seq: int) -> list[log.PendingBatch]:
        return [
            batch(topic, p, 100 * (2 * p + k), 1, pid=pid, epoch=0, seq=seq)
            for p in range(partitions)
            for k, pid in enumerate(pids)
        ]

    commit(kv, batches(0), key=f"first-{partitions}")  # the producers' states exist

    def fn(tr) -> int:
        count = [0]
        tr._conn.set_trace_callback(lambda _sql: count.__setitem__(0, count[0] + 1))
        try:
            results = log.commit_ingest(tr, SUB, f"second-{partitions}", 10_000, 5, batches(1))
            tr._before_commit()  # the tallies, as the commit writes them
        finally:
            tr._conn.set_trace_callback(None)
        assert [r.base_offset for r in results] == [2, 3] * partitions
        return count[0]

    return kv.transact_sync(fn)


def test_an_ingest_commits_statements_do_not_grow_with_its_partitions(kv):
    """Each SQLite statement gives up the GIL and waits to take it back, a wait a busy
    event loop makes long: the produce commit reads its partitions' and producers'
    records in one batch and writes its entries and states in another."""
    assert _statements_of_an_ingest_commit(kv, 4) == _statements_of_an_ingest_commit(kv, 32)
