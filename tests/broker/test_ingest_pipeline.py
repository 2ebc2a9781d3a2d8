"""The produce pipeline in one process: real SQLite metadata and a real local folder store.

Where a test needs a slow or failing upload, the store is the real local store with a
delay or an error put in front of its writes; nothing else is replaced.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from broker import faults
from broker.ingest import ACK_WITHOUT_COMMIT, IngestPipeline
from broker.sync import Notifier
from metadata import keys, log, topics
from metadata.log import AppendResult
from metadata.sqlite_kv import SQLiteKV
from protocol.records import build_batch, iter_batches, iter_records
from storage.cache import ObjectCache
from storage.disk_cache import DiskCache
from storage.local import LocalObjectStore
from storage.objectstore import ObjectStoreError

SUB = keys.cluster_subspace("pipeline-test")


class FaultyStore(LocalObjectStore):
    """The local store, with writes that may wait or fail first (chosen per call)."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.before_put: Callable[[int], None] = lambda n: None
        self.calls = 0
        self._calls_lock = threading.Lock()

    def _before(self) -> None:
        with self._calls_lock:
            self.calls += 1
            n = self.calls
        self.before_put(n)

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        await anyio.to_thread.run_sync(self._before)
        await super().put(key, data, if_absent=if_absent)

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self._before()
        super().put_sync(key, data, if_absent=if_absent)

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        self._before()
        super().put_parts_sync(key, parts, if_absent=if_absent)


class FirstUploadHeld:
    """A store's `before_put` that holds the first upload until `release` is set (10 s
    at most); `uploading` is set once it is held."""

    def __init__(self) -> None:
        self.uploading = threading.Event()
        self.release = threading.Event()

    def __call__(self, n: int) -> None:
        if n == 1:
            self.uploading.set()
            self.release.wait(10)


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.kv = SQLiteKV(tmp_path / "meta.db", retry_deadline=1.0, busy_timeout=0.05)
        self.store = FaultyStore(tmp_path / "objects")
        self.cache = ObjectCache(64 << 20)
        self.topic = self.kv.transact_sync(
            lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 4, {}, 0)
        )

    def pipeline(self, **options: Any) -> IngestPipeline:
        return IngestPipeline(
            self.kv,
            SUB,
            self.store,
            self.cache,
            Notifier(),
            flush_interval_ms=options.pop("flush_interval_ms", 5),
            flush_bytes=options.pop("flush_bytes", 1 << 20),
            **options,
        )

    def values(self, partition: int) -> list[bytes]:
        """The record values of a partition, in offset order, read back from the store."""

        def read(tr: Any) -> list[log.ChunkEntry]:
            return log.read_chunks(tr, SUB, self.topic.topic_id, partition, 0, 100_000)

        out = []
        for entry in self.kv.read_sync(read):
            with open(Path(self.store.root) / entry.object_key, "rb") as f:
                f.seek(entry.start)
                data = f.read(entry.length)
            for batch in iter_batches(data):
                out += [r.value for r in iter_records(batch)]
        return out


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    s = Setup(tmp_path)
    yield s
    await s.kv.aclose()


def batch(value: bytes, records: int = 1) -> tuple[bytes, Any]:
    data = build_batch([(None, value + b"-%d" % i, (), 1000) for i in range(records)])
    (view,) = iter_batches(data)
    return data, view


async def append_all(
    pipeline: IngestPipeline, topic_id: bytes, wanted: list[tuple[int, bytes]]
) -> list[AppendResult]:
    """Queue every (partition, value) in this order, then wait for all the answers."""
    promises = [pipeline.enqueue(topic_id, p, *batch(v)) for p, v in wanted]
    return [await promise.wait() for promise in promises]


async def test_one_flush_numbers_each_partition_in_arrival_order(setup: Setup) -> None:
    pipeline = setup.pipeline(flush_interval_ms=50)
    wanted = [(0, b"a0"), (1, b"b0"), (0, b"a1"), (2, b"c0"), (1, b"b1"), (0, b"a2")]
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        results = await append_all(pipeline, setup.topic.topic_id, wanted)
        tg.cancel_scope.cancel()
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 0),
        (ErrorCode.none, 1),
        (ErrorCode.none, 0),
        (ErrorCode.none, 1),
        (ErrorCode.none, 2),
    ]
    assert pipeline.stats.flushes == 1 and setup.store.stats["puts"] == 1
    assert setup.values(0) == [b"a0-0", b"a1-0", b"a2-0"]
    assert setup.values(1) == [b"b0-0", b"b1-0"]
    # the object is in the cache for tailing consumers
    (key,) = setup.cache.whole_objects()
    assert (Path(setup.store.root) / key).read_bytes() == setup.cache.get(key)


async def test_a_flush_is_cached_as_its_batches_unless_they_hold_much_more(
    setup: Setup,
) -> None:
    """A flush's object is neither joined nor copied for the cache: a range of one batch
    is a view of the request's own bytes. Batches that are small views of a large frame
    (its other partitions refused, say) are copied, so the cache holds no more than it
    counts."""
    pipeline = setup.pipeline(flush_interval_ms=50)
    data, view = batch(b"v", records=20)
    frame = bytes(100) + data + bytes(5)
    mine = memoryview(frame)[100 : 100 + len(data)]
    large = bytes(1 << 20) + data
    small_of_large = memoryview(large)[1 << 20 :]
    topic_id = setup.topic.topic_id
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        first = pipeline.enqueue(topic_id, 0, mine, view)
        assert (await first.wait()).error == ErrorCode.none
        second = pipeline.enqueue(topic_id, 1, small_of_large, view)
        assert (await second.wait()).error == ErrorCode.none
        tg.cancel_scope.cancel()
    kept, copied = setup.cache.whole_objects()
    chunk = log.read_chunks  # where each batch sits in its object
    entries = {
        p: setup.kv.read_sync(lambda tr, p=p: chunk(tr, SUB, topic_id, p, 0, 10))[0] for p in (0, 1)
    }
    held = setup.cache.slice(kept, entries[0].start, entries[0].start + len(data))
    assert held is not None and bytes(held) == data
    assert held.obj is frame, "a view of the request's frame: no copy"
    other = setup.cache.slice(copied, entries[1].start, entries[1].start + len(data))
    assert other is not None and bytes(other) == data
    assert other.obj is not large, "a copy: the large frame is not kept alive"
    assert setup.values(0) == setup.values(1) == [b"v-%d" % i for i in range(20)]


async def test_overlapping_flushes_commit_in_the_order_batches_arrived(setup: Setup) -> None:
    # Small flushes, uploads that take random times: later flushes often finish first.
    rng = random.Random(5)
    setup.store.before_put = lambda n: time.sleep(rng.choice((0, 0, 0.001, 0.01, 0.03)))
    pipeline = setup.pipeline(flush_interval_ms=1, flush_bytes=1)
    wanted = [(i % 3, b"v%d" % i) for i in range(120)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        promises = []
        for p, v in wanted:
            promises.append(pipeline.enqueue(setup.topic.topic_id, p, *batch(v)))
            if rng.random() < 0.5:
                await anyio.sleep(0.002)
        results = [await promise.wait() for promise in promises]
        tg.cancel_scope.cancel()
    assert all(r.error == ErrorCode.none for r in results)
    # The uploads really overlapped: flushes were committed together.
    assert pipeline.stats.flushes >= 5 and pipeline.stats.commits < pipeline.stats.flushes
    for p in range(3):
        values = [v + b"-0" for q, v in wanted if q == p]
        assert setup.values(p) == values
        offsets = [r.base_offset for (q, _v), r in zip(wanted, results, strict=True) if q == p]
        assert offsets == list(range(len(values)))


async def test_a_failed_upload_answers_storage_error_and_later_flushes_go_on(
    setup: Setup,
) -> None:
    def fail_second(n: int) -> None:
        if n == 2:
            raise ObjectStoreError("disk full")

    setup.store.before_put = fail_second
    pipeline = setup.pipeline(flush_interval_ms=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        results = []
        for i in range(4):  # one flush each
            results += await append_all(pipeline, setup.topic.topic_id, [(0, b"x%d" % i)])
        tg.cancel_scope.cancel()
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.kafka_storage_error, -1),
        (ErrorCode.none, 1),
        (ErrorCode.none, 2),
    ]
    assert pipeline.stats.failed_flushes == 1
    assert setup.values(0) == [b"x0-0", b"x2-0", b"x3-0"]


async def test_a_failed_commit_answers_storage_error_and_acks_nothing_of_it(
    setup: Setup, tmp_path: Path
) -> None:
    pipeline = setup.pipeline(flush_interval_ms=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        first = await append_all(pipeline, setup.topic.topic_id, [(0, b"before")])
        # Another process holds SQLite's write lock past the commit's retry deadline.
        blocker = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        failed = await append_all(pipeline, setup.topic.topic_id, [(0, b"during"), (1, b"d")])
        blocker.execute("ROLLBACK")
        blocker.close()
        after = await append_all(pipeline, setup.topic.topic_id, [(0, b"after")])
        tg.cancel_scope.cancel()
    assert (first[0].error, first[0].base_offset) == (ErrorCode.none, 0)
    assert [r.error for r in failed] == [ErrorCode.kafka_storage_error] * 2
    assert (after[0].error, after[0].base_offset) == (ErrorCode.none, 1)
    assert setup.values(0) == [b"before-0", b"after-0"]
    assert setup.values(1) == []


async def test_stopping_with_flushes_in_flight_does_not_hang(setup: Setup) -> None:
    # The first upload is slow; the ones after it are done and wait for their turn.
    setup.store.before_put = lambda n: time.sleep(0.5 if n == 1 else 0)
    pipeline = setup.pipeline(flush_interval_ms=1, flush_bytes=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.run)
            for i in range(5):
                pipeline.enqueue(setup.topic.topic_id, 0, *batch(b"s%d" % i))
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()


async def test_a_flush_that_fails_before_its_upload_does_not_hold_back_the_next(
    setup: Setup,
) -> None:
    # A partition number the ingest file cannot hold: building that flush's object fails.
    pipeline = setup.pipeline(flush_interval_ms=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        first = await append_all(pipeline, setup.topic.topic_id, [(0, b"one")])
        bad = await append_all(pipeline, setup.topic.topic_id, [(2**31, b"bad")])
        after = await append_all(pipeline, setup.topic.topic_id, [(0, b"two"), (1, b"b")])
        tg.cancel_scope.cancel()
    assert [(r.error, r.base_offset) for r in first + bad + after] == [
        (ErrorCode.none, 0),
        (ErrorCode.kafka_storage_error, -1),
        (ErrorCode.none, 1),
        (ErrorCode.none, 0),
    ]
    assert setup.values(0) == [b"one-0", b"two-0"]


async def test_a_flush_uploaded_longer_ago_than_the_commit_delay_is_not_committed(
    setup: Setup,
) -> None:
    # The first upload is slow; the second is done at once and waits for its turn longer
    # than the pipeline may commit an object after its upload (an orphan sweep may delete
    # an object that old, so it must never become part of the log).
    setup.store.before_put = lambda n: time.sleep(0.6 if n == 1 else 0)
    pipeline = setup.pipeline(flush_interval_ms=1, flush_bytes=1, max_commit_delay_ms=300)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        first = pipeline.enqueue(setup.topic.topic_id, 0, *batch(b"slow"))
        await anyio.sleep(0.05)
        second = pipeline.enqueue(setup.topic.topic_id, 0, *batch(b"late"))
        results = [await first.wait(), await second.wait()]
        third = await append_all(pipeline, setup.topic.topic_id, [(0, b"after")])
        tg.cancel_scope.cancel()
    assert [(r.error, r.base_offset) for r in results + third] == [
        (ErrorCode.none, 0),
        (ErrorCode.kafka_storage_error, -1),
        (ErrorCode.none, 1),
    ]
    assert setup.values(0) == [b"slow-0", b"after-0"]


async def test_the_ack_without_commit_fault_point_answers_a_batch_it_never_commits(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Armed as BUCKETLOG_FAULT_POINTS=ingest.ack_without_commit@2 would arm it at start.
    monkeypatch.setattr(faults, "_armed", faults.parse(f"{ACK_WITHOUT_COMMIT}@2"))
    monkeypatch.setattr(faults, "_reached", {})
    pipeline = setup.pipeline(flush_interval_ms=50)
    wanted = [(0, b"a0"), (0, b"a1"), (0, b"a2"), (1, b"b0")]
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        results = await append_all(pipeline, setup.topic.topic_id, wanted)
        tg.cancel_scope.cancel()
    # All four acknowledged; the second claims offset 2, the partition's next offset.
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 2),
        (ErrorCode.none, 1),
        (ErrorCode.none, 0),
    ]
    assert setup.values(0) == [b"a0-0", b"a2-0"]
    assert setup.values(1) == [b"b0-0"]


def test_fault_points_parse_names_and_the_time_they_fire() -> None:
    assert faults.parse("") == {}
    assert faults.parse("gc.before_delete, ingest.ack_without_commit@3") == {
        "gc.before_delete": 1,
        "ingest.ack_without_commit": 3,
    }
    for bad in ("x@", "x@0", "x@two"):
        with pytest.raises(ValueError, match="name@n"):
            faults.parse(bad)


async def test_with_flush_when_idle_a_batch_reaching_an_idle_pipeline_goes_at_once(
    setup: Setup,
) -> None:
    """With nothing in flight, a batch does not wait for the flush interval (an hour
    here); a pipeline without flush_when_idle keeps it for the interval."""
    idle = setup.pipeline(flush_interval_ms=3_600_000, flush_when_idle=True)
    waiting = setup.pipeline(flush_interval_ms=300)
    async with anyio.create_task_group() as tg:
        tg.start_soon(idle.run)
        tg.start_soon(waiting.run)
        with anyio.fail_after(30):
            result = await idle.append(setup.topic.topic_id, 0, *batch(b"now"))
        assert result.error == ErrorCode.none and idle.stats.flushes == 1
        began = anyio.current_time()
        result = await waiting.append(setup.topic.topic_id, 1, *batch(b"later"))
        assert result.error == ErrorCode.none
        assert anyio.current_time() - began >= 0.3, "kept for the flush interval"
        tg.cancel_scope.cancel()


async def test_with_flush_when_idle_batches_wait_for_the_flush_in_flight_then_go_together(
    setup: Setup,
) -> None:
    """Batches that arrive while a flush is uploading go out in one flush as soon as it
    is answered, not each alone."""
    held = FirstUploadHeld()
    setup.store.before_put = held
    pipeline = setup.pipeline(flush_interval_ms=3_600_000, flush_when_idle=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        first = pipeline.enqueue(setup.topic.topic_id, 0, *batch(b"first"))
        assert await anyio.to_thread.run_sync(held.uploading.wait, 10)
        later = [pipeline.enqueue(setup.topic.topic_id, p, *batch(b"b%d" % p)) for p in range(3)]
        await anyio.sleep(0.05)
        assert pipeline.stats.flushes == 0, "the later batches wait for the flush in flight"
        held.release.set()
        with anyio.fail_after(30):
            results = [await p.wait() for p in [first, *later]]
        tg.cancel_scope.cancel()
    assert all(r.error == ErrorCode.none for r in results)
    assert pipeline.stats.flushes == 2 and setup.store.stats["puts"] == 2
    assert setup.values(0) == [b"first-0", b"b0-0"]


class ThreadsKV(SQLiteKV):
    """The real SQLite store, noting the thread each read-write transaction ran in."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, retry_deadline=1.0, busy_timeout=0.05)
        self.threads: list[str] = []

    def transact_sync(self, fn: Callable[[Any], Any]) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().transact_sync(fn)


async def test_a_flush_next_in_order_commits_in_its_upload_thread_and_the_next_wait(
    setup: Setup, tmp_path: Path
) -> None:
    """The first flush (next in order, nothing committing) commits right after its upload
    in the same worker thread. The two flushes that upload while it waits are committed
    after it, together, by the committer (a metadata worker thread), in order."""
    kv = ThreadsKV(tmp_path / "meta.db")
    held = FirstUploadHeld()
    setup.store.before_put = held
    pipeline = IngestPipeline(
        kv, SUB, setup.store, setup.cache, Notifier(), flush_interval_ms=1, flush_bytes=1
    )
    topic_id = setup.topic.topic_id
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.run)
            first = pipeline.enqueue(topic_id, 0, *batch(b"first"))
            assert await anyio.to_thread.run_sync(held.uploading.wait, 10)
            later = []
            for value in (b"second", b"third"):
                later.append(pipeline.enqueue(topic_id, 0, *batch(value)))
                await anyio.sleep(0.02)  # a flush each, uploaded while the first waits
            assert setup.store.calls == 3 and pipeline.stats.commits == 0
            held.release.set()
            with anyio.fail_after(30):
                results = [await p.wait() for p in [first, *later]]
            tg.cancel_scope.cancel()
    finally:
        await kv.aclose()
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 1),
        (ErrorCode.none, 2),
    ]
    assert pipeline.stats.own_commits == 1 and pipeline.stats.commits == 2
    assert kv.threads[0] == "upload worker"
    assert kv.threads[1] != "upload worker"
    assert setup.values(0) == [b"first-0", b"second-0", b"third-0"]


async def _flushes_until(
    setup: Setup, pipeline: IngestPipeline, flushes: int, done: Callable[[], bool]
) -> list[AppendResult]:
    """`flushes` appends of a record, a flush each, then a wait for `done` (what a
    thread of the pipeline does after the answers)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        results = []
        for i in range(flushes):
            results += await append_all(pipeline, setup.topic.topic_id, [(0, b"x%d" % i)])
        with anyio.fail_after(5):
            while not done():  # noqa: ASYNC110 -- set by a thread
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    return results


async def test_a_committed_flush_is_kept_on_the_disk_first_to_go_and_a_failed_one_is_not(
    setup: Setup, tmp_path: Path
) -> None:
    """With a disk cache each committed flush's file is written there (released: the
    first to go when room is wanted); a flush that failed leaves nothing there."""
    disk = DiskCache(str(tmp_path / "disk"), 64 << 20)

    def fail_second(n: int) -> None:
        if n == 2:
            raise ObjectStoreError("disk full")

    setup.store.before_put = fail_second
    pipeline = setup.pipeline(flush_interval_ms=1, disk=disk)
    results = await _flushes_until(setup, pipeline, 3, lambda: disk.stats["objects_kept"] >= 2)
    assert [r.error for r in results] == [
        ErrorCode.none,
        ErrorCode.kafka_storage_error,
        ErrorCode.none,
    ]
    entries = setup.kv.read_sync(
        lambda tr: log.read_chunks(tr, SUB, setup.topic.topic_id, 0, 0, 100)
    )
    committed = [e.object_key for e in entries]
    assert len(committed) == 2 and all(key in disk for key in committed)
    for key in committed:
        data = (Path(setup.store.root) / key).read_bytes()
        assert disk.read(key, 0, len(data)) == data
    assert (disk.stats["objects_kept"], disk.stats["objects_released"]) == (2, 2)


async def test_a_flush_the_disk_cannot_keep_is_answered_counted_and_warned_of_once(
    setup: Setup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk cache that cannot write (its folder gone here; full, say) costs the
    flush's copy, never its answer: counted, the first logged as a warning."""
    disk = DiskCache(str(tmp_path / "disk"), 64 << 20)
    (tmp_path / "disk").rmdir()
    pipeline = setup.pipeline(flush_interval_ms=1, disk=disk)
    results = await _flushes_until(setup, pipeline, 2, lambda: disk.stats["write_failures"] >= 2)
    assert [r.error for r in results] == [ErrorCode.none, ErrorCode.none]
    assert disk.stats["objects_kept"] == 0
    warned = [r for r in caplog.records if "disk cache could not keep" in r.getMessage()]
    assert [r.levelname for r in warned if r.levelname == "WARNING"] == ["WARNING"]
