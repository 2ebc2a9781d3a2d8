"""Chunk index entries kept in memory answer what the index answered, for a while."""

from __future__ import annotations

import random
import uuid

import pytest

from metadata import keys, log, topics
from metadata.chunk_cache import ChunkCache, read_chunks_cached
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")


@pytest.fixture
def kv(tmp_path):
    store = SQLiteKV(str(tmp_path / "meta.db"))
    yield store
    store.close()


@pytest.fixture
def topic(kv) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 2, {}, 0)
    )


def pending_batch(topic, rng: random.Random, partition: int = 0) -> log.PendingBatch:
    """A batch of random size and offset count, alone in its object."""
    return log.PendingBatch(
        topic_id=topic.topic_id,
        partition=partition,
        start=0,
        length=rng.randint(1, 400),
        last_offset_delta=rng.randint(0, 9),
        max_timestamp=1000,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
    )


def append(kv, topic, rng: random.Random, entries: int, partition: int = 0) -> None:
    """Entries of random sizes and offset counts, one object each."""
    for _ in range(entries):
        pending = pending_batch(topic, rng, partition)
        key = f"obj-{uuid.uuid4().hex}"
        kv.transact_sync(lambda tr, k=key, b=pending: log.commit_ingest(tr, SUB, k, 10_000, 5, [b]))


def both(kv, cache, topic, from_offset, limit, max_bytes, with_watermark=True, wider=1):
    """(through the cache, straight from the index), in one transaction."""

    def txn(tr):
        state = log.get_partition(tr, SUB, topic.topic_id, 0)
        hw = state.high_watermark if with_watermark else None
        cached = read_chunks_cached(
            tr, cache, SUB, topic.topic_id, 0, from_offset, limit, max_bytes, hw, wider=wider
        )
        direct = log.read_chunks(tr, SUB, topic.topic_id, 0, from_offset, limit, max_bytes)
        return cached, direct, state.high_watermark

    return kv.read_sync(txn)


def test_answers_match_the_index_while_it_grows(kv, topic):
    rng = random.Random(7)
    cache = ChunkCache(entries=24)
    for _round in range(6):
        append(kv, topic, rng, 15)
        for _ in range(150):
            hw = kv.read_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
            from_offset = rng.randint(0, hw.high_watermark + 2)
            limit = rng.choice([0, 1, 4, 16])
            max_bytes = rng.choice([0, 1, 150, 600, 2000, 1 << 20])
            cached, direct, _hw = both(
                kv,
                cache,
                topic,
                from_offset,
                limit,
                max_bytes,
                rng.random() < 0.8,
                wider=rng.choice([1, 4]),
            )
            assert cached == direct, (from_offset, limit, max_bytes)
    assert cache.stats["hits"] > 100  # the answers compared did come from memory


def test_a_consumer_reading_forward_is_answered_from_memory(kv, topic):
    append(kv, topic, random.Random(1), 40)
    cache = ChunkCache()
    hw = kv.read_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0)).high_watermark
    offset, fetches = 0, 0
    while offset < hw:
        cached, direct, _hw = both(kv, cache, topic, offset, 16, 1000)
        assert cached == direct
        fetches += 1
        offset = cached[-1].last_offset + 1
        # A read-ahead asks for the next stretch before the consumer does.
        kv.read_sync(
            lambda tr, o=offset: read_chunks_cached(tr, cache, SUB, topic.topic_id, 0, o, 16, 1000)
        )
    assert fetches > 3
    # Every Fetch after the first was answered from what the read-ahead read.
    assert cache.stats["hits"] >= fetches - 1


def test_a_miss_reads_past_the_budget_for_the_fetches_after_it(kv, topic):
    """Without read-ahead (a consumer of data still in the object cache): each Fetch
    takes about a budget's worth of entries, and most of those after it are held."""
    append(kv, topic, random.Random(4), 120)
    cache = ChunkCache()
    hw = kv.read_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0)).high_watermark
    offset, fetches = 0, 0
    while offset < hw:
        cached, direct, _hw = both(kv, cache, topic, offset, 16, 1000, wider=4)
        assert cached == direct
        fetches += 1
        offset = cached[-1].last_offset + 1
    assert fetches > 12
    assert cache.stats["misses"] <= fetches // 2, cache.stats


def test_entries_held_are_served_without_reading_the_index(kv, topic):
    append(kv, topic, random.Random(2), 5)
    cache = ChunkCache()
    first, direct, hw = both(kv, cache, topic, 0, 16, 1 << 20)
    assert first == direct and len(first) == 5
    # Take the entries out of the store: an answer now can only come from memory.
    kv.transact_sync(lambda tr: tr.clear_range(*SUB.range(keys.CHUNK, topic.topic_id, 0)))
    again = kv.read_sync(
        lambda tr: read_chunks_cached(tr, cache, SUB, topic.topic_id, 0, 0, 16, 1 << 20, hw)
    )
    assert again == first


def test_bounded_per_partition_and_in_partitions(kv, topic):
    append(kv, topic, random.Random(3), 30)
    cache = ChunkCache(partitions=1, entries=8)
    entries = kv.read_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    cache.add(topic.topic_id, 0, entries)
    # Only the last 8 entries are held: an offset before them cannot be answered.
    assert cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20) is None
    assert cache.lookup(topic.topic_id, 0, entries[-8].base_offset, 4, 1 << 20) == entries[-8:-4]
    # A second partition pushes the first out.
    cache.add(topic.topic_id, 1, entries[:2])
    assert cache.lookup(topic.topic_id, 0, entries[-8].base_offset, 4, 1 << 20) is None


def test_entries_held_expire_before_their_objects_can_be_deleted(kv, topic):
    """Compaction re-points entries; a copy of the old ones is used for max_age at most,
    and the old objects are deleted a whole delete delay after the commit."""
    from metadata import compaction

    append(kv, topic, random.Random(4), 3)
    now = [100.0]
    cache = ChunkCache(max_age_s=30.0, clock=lambda: now[0])
    old, direct, hw = both(kv, cache, topic, 0, 16, 1 << 20)
    assert old == direct
    plan = kv.transact_sync(
        lambda tr: compaction.plan_l1(tr, SUB, 1, 10**6, 0, compaction.Limits(), 1000)
    )
    outputs = compaction.output_entries(plan, "merged", [8], 1 << 20)
    assert kv.transact_sync(
        lambda tr: compaction.commit_job(tr, SUB, plan, 1, "merged", 99, outputs, 10**6, 60_000)
    ).committed

    def cached() -> list[log.ChunkEntry]:
        return kv.read_sync(
            lambda tr: read_chunks_cached(tr, cache, SUB, topic.topic_id, 0, 0, 16, 1 << 20, hw)
        )

    now[0] += 29.9  # still the entries of before, naming objects not yet deleted
    assert cached() == old
    now[0] += 0.1  # too old: read again, the compacted entry
    assert [(e.object_key, e.base_offset) for e in cached()] == [("merged", 0)]
    assert cache.stats["expired"] == 1
    # A run extended later is as old as its first entries.
    now[0] += 20
    append(kv, topic, random.Random(5), 2)
    hw2 = kv.read_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0)).high_watermark
    kv.read_sync(
        lambda tr: read_chunks_cached(tr, cache, SUB, topic.topic_id, 0, hw, 16, 1 << 20, hw2)
    )
    assert len(cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20, hw2)) == 3
    now[0] += 10
    assert cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20, hw2) is None


def append_extending(kv, cache, topic, rng: random.Random, entries: int) -> None:
    """`append`, each commit's entries then given to the cache as the ingest pipeline
    gives them (`commit_ingest`'s `written`, after the commit)."""
    for _ in range(entries):
        pending = pending_batch(topic, rng)
        key = f"obj-{uuid.uuid4().hex}"
        written: list[tuple[bytes, int, log.ChunkEntry]] = []

        def txn(tr, k=key, b=pending, w=written):
            w.clear()
            return log.commit_ingest(tr, SUB, k, 10_000, 5, [b], (), w)

        kv.transact_sync(txn)
        assert [(tid, p) for tid, p, _e in written] == [(topic.topic_id, 0)]
        cache.extend(written)


def test_entries_committed_join_the_run_they_continue(kv, topic):
    """A consumer at the end: each commit's entry joins the run held, and the Fetch after
    it is answered from memory, as the index answers."""
    rng = random.Random(11)
    append(kv, topic, rng, 3)
    cache = ChunkCache()
    _first, _direct, hw = both(kv, cache, topic, 0, 16, 1 << 20)
    misses = cache.stats["misses"]
    for _ in range(20):
        append_extending(kv, cache, topic, rng, 1)
        cached, direct, new_hw = both(kv, cache, topic, hw, 16, 1 << 20)
        assert cached == direct and len(cached) == 1
        hw = new_hw
    assert cache.stats["misses"] == misses  # every answer from memory
    assert cache.stats["extended"] == 20


def test_an_entry_that_does_not_continue_the_run_is_not_held(kv, topic):
    """A run of an older stretch (a consumer behind) stays as it is; an entry after a gap
    (another agent's commit in between, say) is not added; a partition no one reads
    holds nothing."""
    rng = random.Random(12)
    append(kv, topic, rng, 6)
    entries = kv.read_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    cache = ChunkCache()
    cache.add(topic.topic_id, 0, entries[:3])
    cache.extend([(topic.topic_id, 0, entries[4])])  # entries[3] missing: a gap
    assert cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20, entries[-1].last_offset + 1) is None
    assert cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20, entries[3].base_offset) == entries[:3]
    cache.extend([(topic.topic_id, 0, entries[3])])  # continues it
    assert cache.lookup(topic.topic_id, 0, 0, 16, 1 << 20, entries[4].base_offset) == entries[:4]
    cache.extend([(topic.topic_id, 1, entries[0])])
    assert cache.lookup(topic.topic_id, 1, 0, 16, 1 << 20) is None
    assert cache.stats["extended"] == 1


def test_answers_match_the_index_while_commits_extend_the_cache(kv, topic):
    rng = random.Random(13)
    cache = ChunkCache(entries=24)
    for _round in range(6):
        append_extending(kv, cache, topic, rng, 15)
        for _ in range(100):
            hw = kv.read_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
            from_offset = rng.randint(max(0, hw.high_watermark - 40), hw.high_watermark + 2)
            limit = rng.choice([0, 1, 4, 16])
            max_bytes = rng.choice([0, 1, 150, 600, 2000, 1 << 20])
            cached, direct, _hw = both(
                kv, cache, topic, from_offset, limit, max_bytes, rng.random() < 0.8, wider=4
            )
            assert cached == direct, (from_offset, limit, max_bytes)
    assert cache.stats["extended"] > 0
