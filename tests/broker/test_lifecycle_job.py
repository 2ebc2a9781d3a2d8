"""The lifecycle's jobs (retention, garbage collection, the orphan sweep) when the object
store fails: over real SQLite metadata and a real local folder store whose deletes and
listings fail when a test says so."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.lifecycle import Lifecycle, LifecycleSettings
from metadata import journal, keys, log, topics
from metadata.sqlite_kv import SQLiteKV
from protocol.records import build_batch, iter_batches
from storage.ingest import encode_ingest_file
from storage.local import LocalObjectStore
from storage.objectstore import ObjectInfo

SUB = keys.cluster_subspace("lifecycle-job-test")
DELAY_MS = 60_000
RETENTION_MS = 10_000


class FailingStore(LocalObjectStore):
    """A local folder store whose next deletes of given keys, or next listings, fail as a
    store outage would."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.failing_deletes: set[str] = set()
        self.failing_lists = 0
        self.deleted: list[str] = []

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        failing = [key for key in keys if key in self.failing_deletes]
        self.failing_deletes.difference_update(failing)
        failed: dict[str, Exception] = {
            key: OSError(f"injected: delete {key} failed") for key in failing
        }
        rest = [key for key in keys if key not in failed]
        failed.update(await super().delete_many(rest))
        self.deleted.extend(key for key in rest if key not in failed)
        return failed

    async def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        if self.failing_lists:
            self.failing_lists -= 1
            raise OSError("injected: list failed")
        return await super().list(prefix, start_after=start_after)


class _Agent:
    node_id = 1
    sub = SUB

    def __init__(self, kv: SQLiteKV, store: FailingStore) -> None:
        self.kv = kv
        self.store = store

    def topic_config(self, topic: topics.Topic, name: str) -> str:
        return {
            "cleanup.policy": "delete",
            "retention.ms": str(RETENTION_MS),
            "retention.bytes": "-1",
        }[name]


@pytest.fixture
def setup(tmp_path: Path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    store = FailingStore(str(tmp_path / "objects"))
    topic = kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 1, {}, 0)
    )
    yield kv, store, topic
    kv.close()


def _ingest(kv, store, topic, key: str, timestamp: int) -> None:
    """Write and commit an ingest file of one batch of two records into partition 0."""
    batch = build_batch([(None, b"v", [], timestamp), (None, b"w", [], timestamp)])
    data, (location,) = encode_ingest_file([(topic.topic_id, 0, [batch])])
    (view,) = iter_batches(batch)
    pending = [
        log.PendingBatch(
            topic.topic_id,
            0,
            location.batch_starts[0],
            len(batch),
            view.last_offset_delta,
            timestamp,
            -1,
            -1,
            -1,
        )
    ]
    store.put_sync(key, data, if_absent=True)
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, len(data), 1, pending))


def _entries(kv, topic) -> list[str]:
    chunks = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    return [c.object_key for c in chunks]


async def test_a_failed_delete_is_counted_kept_queued_and_done_by_the_next_pass(setup):
    kv, store, topic = setup
    now = [100_000]
    _ingest(kv, store, topic, "ingest/old", timestamp=1_000)
    _ingest(kv, store, topic, "ingest/new", timestamp=now[0])
    lifecycle = Lifecycle(
        _Agent(kv, store), LifecycleSettings(delete_delay_ms=DELAY_MS), clock=lambda: now[0]
    )
    assert await lifecycle.retention_pass() == 1
    assert _entries(kv, topic) == ["ingest/new"]

    # Within the delete delay nothing goes, whatever the store does.
    assert await lifecycle.gc_pass() == 0
    assert store.deleted == []

    now[0] += DELAY_MS + 1
    store.failing_deletes = {"ingest/old"}
    assert await lifecycle.gc_pass() == 0
    assert lifecycle.stats["delete_errors"] == 1
    assert store.get_sync("ingest/old")  # still there, and still queued

    assert await lifecycle.gc_pass() == 1
    assert store.deleted == ["ingest/old"]
    assert lifecycle.stats["objects_deleted"] == 1
    # The referenced object was never a candidate: it is still there and still read.
    assert store.get_sync("ingest/new")
    assert _entries(kv, topic) == ["ingest/new"]
    # Nothing is left queued: a later pass deletes nothing more.
    now[0] += 10 * DELAY_MS
    assert await lifecycle.gc_pass() == 0
    assert store.deleted == ["ingest/old"]


async def test_a_failed_listing_ends_the_sweep_and_the_next_sweep_deletes_the_orphan(setup):
    kv, store, topic = setup
    _ingest(kv, store, topic, "ingest/named", timestamp=1_000)
    store.put_sync("ingest/orphan", b"an upload whose commit never came", if_absent=True)
    # Two hours on, both objects are older than the sweep's minimum age (one hour).
    later = int(time.time() * 1000) + 2 * 3_600_000
    lifecycle = Lifecycle(_Agent(kv, store), LifecycleSettings(), clock=lambda: later)
    store.failing_lists = 1
    with pytest.raises(OSError, match="injected"):
        await lifecycle.orphan_sweep()
    assert store.deleted == []
    assert await lifecycle.orphan_sweep() == 1
    assert store.deleted == ["ingest/orphan"]
    assert lifecycle.stats["orphans_deleted"] == 1
    assert store.get_sync("ingest/named")


async def test_a_journal_object_waiting_to_be_sequenced_is_never_an_orphan(setup):
    kv, store, topic = setup
    # Sequence S: object 0 skipped (never answered), object 1 sequenced, 2 and 3 waiting.
    for n in range(4):
        store.put_sync(journal.object_key("S", n), b"journal object %d" % n, if_absent=True)
    batch = log.PendingBatch(topic.topic_id, 0, 8, 10, 0, 1000, -1, -1, -1)
    kv.transact_sync(lambda tr: journal.sequence_object(tr, SUB, "S", 1, 1, 30, 5, [batch]))
    later = int(time.time() * 1000) + 2 * 3_600_000
    lifecycle = Lifecycle(_Agent(kv, store), LifecycleSettings(), clock=lambda: later)
    # Object 1 is named by its entry; 0 is a skipped number's late upload: the only orphan.
    assert await lifecycle.orphan_sweep() == 1
    assert store.deleted == [journal.object_key("S", 0)]
    for n in (1, 2, 3):
        assert store.get_sync(journal.object_key("S", n))
