"""A cleaning round of a compacted partition, over real SQLite metadata and a real local
folder store: what the partition reads as afterwards, through the same entries a Fetch
reads."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from broker.cleaning import Cleaning, CleaningSettings, TopicRules
from metadata import cleaning as cleaning_layer
from metadata import keys, log, topics
from metadata.chunk_cache import ChunkCache
from metadata.sqlite_kv import SQLiteKV
from protocol.compression import Compression
from protocol.records import build_batch, iter_batches, iter_records, rebase_batches
from storage.ingest import encode_ingest_file
from storage.local import LocalObjectStore

SUB = keys.cluster_subspace("cleaning-round-test")
NOW = 1_800_000_000_000
RULES = TopicRules(min_ratio=0.5, min_lag_ms=0, max_lag_ms=2**62, delete_retention_ms=1000)


class _Agent:
    node_id = 1
    sub = SUB

    def __init__(self, kv: SQLiteKV, store: LocalObjectStore) -> None:
        self.kv = kv
        self.store = store
        self.chunks = ChunkCache()

    def topic_config(self, topic: topics.Topic, name: str) -> str:
        return {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.5",
            "min.compaction.lag.ms": "0",
            "max.compaction.lag.ms": str(2**62),
            "delete.retention.ms": "1000",
        }[name]


@pytest.fixture
def setup(tmp_path: Path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    store = LocalObjectStore(str(tmp_path / "objects"))
    topic = kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 1, {}, 0)
    )
    yield kv, store, topic
    kv.close()


def _produce(kv, store, topic, batches: list[list[tuple[bytes, bytes | None]]], codec=0) -> None:
    """One ingest file of the given batches (keyed records, timestamp 1000) for partition 0."""
    raw = [build_batch([(k, v, [], 1000) for k, v in b], compression=codec) for b in batches]
    data, (location,) = encode_ingest_file([(topic.topic_id, 0, raw)])
    pending = [
        log.PendingBatch(topic.topic_id, 0, start, len(b), len(records) - 1, 1000, -1, -1, -1)
        for b, start, records in zip(raw, location.batch_starts, batches, strict=True)
    ]
    key = f"ingest/{uuid.uuid4().hex}"
    store.put_sync(key, data, if_absent=True)
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, len(data), 1, pending))


def _read_log(kv, store, topic) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, read as Fetch reads: entry by entry, its
    batches numbered from the entry's base offset."""
    out = []
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    for entry in entries:
        data = store.get_sync(entry.object_key, entry.start, entry.start + entry.length)
        for batch in iter_batches(rebase_batches(data, entry.base_offset)):
            for record in iter_records(batch):
                out.append((batch.base_offset + record.offset_delta, record.key, record.value))
    return out


async def _clean(kv, store, topic, now=NOW, rules=RULES) -> int:
    cleaner = Cleaning(_Agent(kv, store), CleaningSettings(), clock=lambda: now)
    return await cleaner.clean_partition(topic, 0, rules)


@pytest.mark.parametrize(
    "codec",
    [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD],
)
async def test_a_round_keeps_the_latest_record_of_each_key_at_its_offset(setup, codec):
    kv, store, topic = setup
    _produce(kv, store, topic, [[(b"a", b"1"), (b"b", b"1")], [(b"c", b"1")]], codec)  # 0-2
    _produce(kv, store, topic, [[(b"a", b"2")], [(b"b", b"2"), (b"a", b"3")]], codec)  # 3-5
    _produce(kv, store, topic, [[(b"d", b"1"), (b"c", b"2")]], codec)  # 6-7
    state = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert await _clean(kv, store, topic) == 1

    assert _read_log(kv, store, topic) == [
        (4, b"b", b"2"),
        (5, b"a", b"3"),
        (6, b"d", b"1"),
        (7, b"c", b"2"),
    ]
    after = kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0))
    assert (after.high_watermark, after.log_start_offset) == (8, 0)
    assert after.log_bytes < state.log_bytes
    dirt = kv.transact_sync(lambda tr: cleaning_layer.measure(tr, SUB, topic.topic_id, 0, NOW, 0))
    assert (dirt.first_dirty_offset, dirt.dirty_bytes) == (8, 0)
    # Nothing dirty: the next pass leaves the partition alone.
    assert await _clean(kv, store, topic) == 0


async def test_tombstones_stay_for_delete_retention_then_go(setup):
    kv, store, topic = setup
    _produce(kv, store, topic, [[(b"a", b"1"), (b"b", b"1")]])  # 0-1
    _produce(kv, store, topic, [[(b"a", None)], [(b"z", b"1")]])  # 2 tombstone, 3
    assert await _clean(kv, store, topic) == 1
    assert _read_log(kv, store, topic) == [(1, b"b", b"1"), (2, b"a", None), (3, b"z", b"1")]
    # New dirt makes the next round worth it; the tombstone's horizon (now + 1 s) passed.
    _produce(kv, store, topic, [[(b"b", b"2"), (b"z", b"2")]])  # 4-5
    _produce(kv, store, topic, [[(b"y", b"1")]])  # 6
    eager = dataclasses.replace(RULES, min_ratio=0.01)
    assert await _clean(kv, store, topic, now=NOW + 2000, rules=eager) == 1
    assert _read_log(kv, store, topic) == [(4, b"b", b"2"), (5, b"z", b"2"), (6, b"y", b"1")]


async def test_a_small_key_map_cleans_in_rounds_and_ends_with_one_record_per_key(setup):
    kv, store, topic = setup
    for rnd in range(4):
        _produce(kv, store, topic, [[(f"k{i}".encode(), f"v{rnd}".encode()) for i in range(50)]])
    cleaner = Cleaning(
        _Agent(kv, store),
        # Room for about 20 keys: several rounds.
        CleaningSettings(dedupe_buffer_size=20 * 192 + 191),
        clock=lambda: NOW,
    )
    rounds = 0
    while await cleaner.clean_partition(topic, 0, RULES):
        rounds += 1
        assert rounds < 50
    assert rounds > 1
    records = _read_log(kv, store, topic)
    assert sorted(k for _o, k, _v in records) == sorted(f"k{i}".encode() for i in range(50))
    assert {v for _o, _k, v in records} == {b"v3"}
    assert [o for o, _k, _v in records] == list(range(150, 200))


async def test_stretches_hold_at_most_the_entries_a_commit_may_replace(setup):
    kv, store, topic = setup
    for r in range(7):
        _produce(kv, store, topic, [[(b"k", b"%d" % r)]])
    cleaner = Cleaning(_Agent(kv, store), CleaningSettings(stretch_entries=2), clock=lambda: NOW)
    assert await cleaner.clean_partition(topic, 0, RULES) == 1
    assert cleaner.stats.stretches == 4  # 7 entries, 2 a stretch
    assert _read_log(kv, store, topic) == [(6, b"k", b"6")]


async def test_rounds_follow_each_other_without_the_back_off_while_work_remains(setup):
    import anyio

    kv, store, topic = setup
    for rnd in range(4):
        _produce(kv, store, topic, [[(f"k{i}".encode(), f"v{rnd}".encode()) for i in range(50)]])
    cleaner = Cleaning(
        _Agent(kv, store),
        # Room for about 20 keys: several rounds; a back-off far longer than the test.
        CleaningSettings(dedupe_buffer_size=20 * 192 + 191, backoff_ms=600_000),
        clock=lambda: NOW,
    )

    def clean() -> bool:
        return len(_read_log(kv, store, topic)) == 50

    async with anyio.create_task_group() as tg:
        tg.start_soon(cleaner.run)
        for _ in range(400):  # 20 s at most
            if clean():
                break
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert clean(), cleaner.stats
    assert cleaner.stats.rounds > 1 and cleaner.stats.passes > 1


async def test_cleaning_cpu_is_counted_in_the_thread_that_cleans(setup):
    kv, store, topic = setup
    values = [(f"k{i % 500}".encode(), bytes(200) + b"%d" % i) for i in range(20_000)]
    for start in range(0, len(values), 2_000):
        _produce(kv, store, topic, [values[start : start + 2_000]], Compression.GZIP)
    cleaner = Cleaning(_Agent(kv, store), CleaningSettings(), clock=lambda: NOW)
    assert await cleaner.clean_partition(topic, 0, RULES) == 1
    # Decompressing and compressing 4 MB again takes tens of milliseconds of the worker
    # thread; the event loop's own thread idles meanwhile.
    assert cleaner.stats.cpu_seconds >= 0.02, cleaner.stats


class _PiecesStore(LocalObjectStore):
    """A local store that records how the cleaner reads and writes: an object written
    whole (put_sync) fails the test, and reads are counted by kind."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.parts_written: list[list[int]] = []
        self.views = self.copies = 0

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        if key.startswith("ingest/"):  # the test's own writes
            return super().put_sync(key, data, if_absent=if_absent)
        raise AssertionError(f"{key} written joined")

    def put_parts_sync(self, key, parts, *, if_absent: bool = False) -> None:
        self.parts_written.append([len(part) for part in parts])
        super().put_parts_sync(key, parts, if_absent=if_absent)

    def get_sync(self, key, start=0, end=None):
        self.copies += 1
        return super().get_sync(key, start, end)

    def get_view_sync(self, key, start=0, end=None):
        self.views += 1
        return super().get_view_sync(key, start, end)


async def test_a_round_reads_views_and_writes_its_output_from_the_kept_batches(tmp_path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    store = _PiecesStore(str(tmp_path / "objects"))
    try:
        topic = kv.transact_sync(
            lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 1, {}, 0)
        )
        # Two 600 KB batches of distinct keys (kept as they are) and a batch that
        # replaces one of their keys: the entries hold more than a mapped read's least.
        big = [(b"k%d" % i, bytes(1000)) for i in range(600)]
        _produce(kv, store, topic, [big[:300], big[300:]])  # 0-599
        _produce(kv, store, topic, [[(b"k0", b"new")]])  # 600
        assert await _clean(kv, store, topic) == 1
        # Every read of the round was a view, none a copy.
        assert store.views >= 2 and store.copies == 0
        records = _read_log(kv, store, topic)
        assert len(records) == 600 and records[-1] == (600, b"k0", b"new")
        # The output went to the store as pieces: the file's head, each kept batch,
        # and the footer and trailer, never one joined buffer.
        (parts,) = store.parts_written
        assert len(parts) >= 4 and max(parts) < sum(parts)
    finally:
        kv.close()
