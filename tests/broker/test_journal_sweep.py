"""The journal sweep in one process, on a real local store and SQLite: it sequences the
objects another process answered and left, in n order, skips a missing number once it
has claimed it (or, without conditional writes, once no upload of it can still be
answered), and leaves an unreadable object in place."""

from __future__ import annotations

import uuid

import pytest

from broker.journal import JournalPipeline, JournalSweep, SweepSettings
from broker.sync import Notifier
from metadata import journal, keys, log, topics
from metadata.sqlite_kv import SQLiteKV
from protocol.records import build_batch
from storage.cache import ObjectCache
from storage.ingest import JournalBatch, encode_ingest_file, encode_journal_table
from storage.local import LocalObjectStore
from storage.objectstore import ObjectExistsError

SUB = keys.cluster_subspace("sweep-test")
SETTINGS = SweepSettings(interval_ms=100, idle_ms=1_000, upload_limit_ms=5_000)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingStore(LocalObjectStore):
    """The local store, counting the objects its listings return."""

    listed = 0

    async def list(self, prefix: str = "", *, start_after: str = ""):  # type: ignore[no-untyped-def]
        found = await super().list(prefix, start_after=start_after)
        self.listed += len(found)
        return found


@pytest.fixture
def setup(tmp_path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    store = CountingStore(str(tmp_path / "objects"))
    topic = kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "lt", uuid.uuid4().bytes, 1, {}, 0)
    )
    pipeline = JournalPipeline(
        kv, SUB, store, ObjectCache(1 << 20), Notifier(), lambda: 1,
        flush_interval_ms=10, flush_bytes=1 << 20,
    )  # fmt: skip
    clock = Clock()
    sweep = JournalSweep(kv, SUB, store, Notifier(), pipeline, lambda: 1, SETTINGS, clock)
    return kv, store, topic, sweep, clock


def journal_object(topic, values: list[bytes]) -> bytes:
    batches = [build_batch([(None, v, [], 1000)]) for v in values]

    def table(locations):
        return encode_journal_table(
            [
                JournalBatch(topic.topic_id, 0, start, len(b), 0, 1000, -1, -1, -1, False)
                for b, start in zip(batches, locations[0].batch_starts, strict=True)
            ]
        )

    data, _ = encode_ingest_file([(topic.topic_id, 0, batches)], table)
    return data


def high_watermark(kv, topic) -> int:
    return kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0)).high_watermark


async def last_modified(store, key: str) -> float:
    (info,) = [i for i in await store.list(key) if i.key == key]
    return info.last_modified


async def test_objects_left_behind_are_sequenced_in_order_and_a_hole_is_claimed(setup):
    kv, store, topic, sweep, clock = setup
    store.put_sync(journal.object_key("S", 0), journal_object(topic, [b"a", b"b"]))
    store.put_sync(journal.object_key("S", 2), journal_object(topic, [b"c"]))
    newest = await last_modified(store, journal.object_key("S", 2))
    clock.now = newest + 0.5
    assert await sweep.sweep() == 0  # the writer may still be at work
    clock.now = newest + 2
    # Object 0, then 1 is claimed (an empty object where none is), then 2.
    assert await sweep.sweep() == 2
    assert high_watermark(kv, topic) == 3
    assert sweep.stats.claimed_holes == 1 and sweep.stats.skipped_holes == 1
    assert store.get_sync(journal.object_key("S", 1)) == b""
    # An upload of 1 still on its way fails: its writer answers it with an error.
    with pytest.raises(ObjectExistsError):
        store.put_sync(journal.object_key("S", 1), journal_object(topic, [b"x"]), if_absent=True)
    assert await sweep.sweep() == 0  # done once
    assert kv.transact_sync(lambda tr: journal.next_to_sequence(tr, SUB, "S")) == 3


async def test_without_conditional_writes_a_hole_waits_for_the_upload_limit(setup):
    kv, store, topic, sweep, clock = setup
    store.conditional_writes = False  # as an S3 store that refused If-None-Match
    store.put_sync(journal.object_key("S", 0), journal_object(topic, [b"a", b"b"]))
    store.put_sync(journal.object_key("S", 2), journal_object(topic, [b"c"]))
    newest = await last_modified(store, journal.object_key("S", 2))
    clock.now = newest + 2
    assert await sweep.sweep() == 1  # object 0; object 1 may still be uploading
    assert high_watermark(kv, topic) == 2
    clock.now = newest + 7  # past the upload limit and the idle time: 1 never comes
    assert await sweep.sweep() == 1
    assert high_watermark(kv, topic) == 3
    assert sweep.stats.skipped_holes == 1 and sweep.stats.claimed_holes == 0
    assert kv.transact_sync(lambda tr: journal.next_to_sequence(tr, SUB, "S")) == 3


async def test_an_unreadable_object_is_left_in_place_and_nothing_after_it_is_sequenced(setup):
    kv, store, topic, sweep, clock = setup
    good = journal_object(topic, [b"a"])
    store.put_sync(journal.object_key("T", 0), good[: len(good) // 2])  # truncated
    store.put_sync(journal.object_key("T", 1), journal_object(topic, [b"b"]))
    clock.now = await last_modified(store, journal.object_key("T", 1)) + 60
    assert await sweep.sweep() == 0
    assert sweep.stats.unreadable_objects == 1
    assert high_watermark(kv, topic) == 0
    assert journal.object_key("T", 0) in {i.key for i in await store.list("journal/")}


async def test_a_sequence_with_nothing_left_is_retired_long_after_its_last_sequencing(setup):
    kv, store, topic, sweep, clock = setup
    # "Done": sequenced an hour ago and nothing of it left. "Kept": as old, but an object
    # of it is still in the store. "Recent": nothing left, sequenced a minute ago.
    store.put_sync(journal.object_key("Kept", 0), journal_object(topic, [b"k"]))
    clock.now = await last_modified(store, journal.object_key("Kept", 0)) + 2
    assert await sweep.sweep() == 1
    now_ms = int(clock.now * 1000)
    hour_ago = now_ms - sweep.settings.retire_after_ms - 1

    def on_record(tr):
        return {s: u for s, _n, u in journal.list_sequences(tr, SUB)}

    def backdate(tr):
        for sequence, updated_ms in (
            ("Done", hour_ago),
            ("Kept", hour_ago),
            ("Recent", now_ms - 60_000),
        ):
            tr.set(SUB.key(keys.JOURNAL, sequence), keys.pack_value((1, 1, updated_ms)))

    kv.transact_sync(backdate)
    await sweep.sweep()
    assert set(kv.transact_sync(on_record)) == {"Kept", "Recent"}
    assert sweep.stats.retired_sequences == 1
    # A sequence whose record was dropped is new again: its next object is sequenced.
    assert kv.transact_sync(lambda tr: journal.next_to_sequence(tr, SUB, "Done")) == 0


async def test_the_sweep_reads_only_what_waits_not_the_objects_already_sequenced(setup):
    kv, store, topic, sweep, clock = setup
    # 50 objects already sequenced (awaiting compaction), one waiting.
    for n in range(51):
        store.put_sync(journal.object_key("Big", n), journal_object(topic, [b"%d" % n]))
    clock.now = await last_modified(store, journal.object_key("Big", 50)) + 2
    kv.transact_sync(
        lambda tr: tr.set(
            SUB.key(keys.JOURNAL, "Big"), keys.pack_value((50, 2, int(clock.now * 1000) - 5_000))
        )
    )
    store.listed = 0
    assert await sweep.sweep() == 1
    assert kv.transact_sync(lambda tr: journal.next_to_sequence(tr, SUB, "Big")) == 51
    assert store.listed == 1  # object 50 alone
