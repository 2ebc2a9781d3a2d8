"""The produce pipeline: buffer, one object per flush, one metadata commit, then the acks.

Batches from every connection and partition collect in one buffer. A flush starts when
the buffer holds `flush_bytes` or its oldest batch has waited `flush_interval_ms`. Each
flush uploads one ingest file (if-absent) and then commits it in one metadata
transaction. Uploads may overlap; commits happen strictly in flush order, so a
producer's pipelined requests keep their order. No batch is answered before its object
is durable and its commit is done.

Each flush goes to a worker thread once: it uploads there and then commits there too,
in the same thread. Group commit: the thread that commits takes every uploaded flush
that is next in flush order into one metadata transaction (each file still gets its own
`commit_ingest`). A flush uploaded while another thread commits is left to that thread,
which looks again when its transaction is done, so commits never queue one behind the
other and no thread waits for another. If a transaction fails, every flush in it is
answered KAFKA_STORAGE_ERROR (nothing of it is acked).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from broker.sync import Notifier, Promise
from metadata import keys
from metadata.kv import KV
from metadata.log import AppendResult, PendingBatch, commit_ingest
from protocol.records import RecordBatchView
from storage.cache import ObjectCache
from storage.ingest import encode_ingest_file, new_object_key
from storage.objectstore import ObjectStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Queued:
    topic_id: bytes
    partition: int
    data: bytes | memoryview
    view: RecordBatchView
    promise: Promise[AppendResult]


@dataclass(slots=True, eq=False)
class _Flush:
    """One flush's object on its way to the log: uploaded, then committed in its turn."""

    seq: int
    key: str
    data: bytes
    pending: list[PendingBatch]
    order: list[int]  # the buffer index of each pending batch
    done: Promise[None]  # resolved by the thread that commits it, if not its own
    # Set under the pipeline's commit lock:
    results: list[AppendResult] | None = None
    uploaded: bool = False
    failed: bool = False  # the upload or the commit failed: nothing of it is acked
    handed_off: bool = False  # its own thread returned before it was committed


@dataclass(slots=True)
class PipelineStats:
    flushes: int = 0
    batches: int = 0
    bytes: int = 0
    commits: int = 0
    failed_flushes: int = 0


class IngestPipeline:
    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        store: ObjectStore,
        cache: ObjectCache,
        notifier: Notifier,
        *,
        flush_interval_ms: int,
        flush_bytes: int,
        max_concurrent_flushes: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self._sub = sub
        self._store = store
        self._cache = cache
        self._notifier = notifier
        self._interval = flush_interval_ms / 1000
        self._flush_bytes = flush_bytes
        self._flush_slots = anyio.Semaphore(max_concurrent_flushes)
        self._clock = clock
        self._buffer: list[_Queued] = []
        self._buffered_bytes = 0
        self._oldest = 0.0
        self._arrived = anyio.Event()
        self._full = anyio.Event()
        # Flush order: run() numbers flushes; they are committed in that order. The
        # worker threads keep that order under _commit_lock.
        self._next_flush = 0
        self._commit_lock = threading.Lock()
        self._uploaded: dict[int, _Flush | None] = {}  # None: not to be committed
        self._next_commit = 0
        self._committing = False
        self._threads = anyio.CapacityLimiter(max_concurrent_flushes)
        self._loop: asyncio.AbstractEventLoop | None = None  # set by run()
        self.stats = PipelineStats()

    async def append(
        self, topic_id: bytes, partition: int, data: bytes | memoryview, view: RecordBatchView
    ) -> AppendResult:
        """Queue one validated batch; returns once it is durable and has offsets (or failed)."""
        return await self.enqueue(topic_id, partition, data, view).wait()

    def enqueue(
        self, topic_id: bytes, partition: int, data: bytes | memoryview, view: RecordBatchView
    ) -> Promise[AppendResult]:
        """Queue one validated batch now; the promise resolves once it is durable and has
        offsets (or failed). Batches are committed in the order they are queued."""
        promise: Promise[AppendResult] = Promise()
        if not self._buffer:
            self._oldest = anyio.current_time()
            self._arrived.set()
        self._buffer.append(_Queued(topic_id, partition, data, view, promise))
        self._buffered_bytes += len(data)
        if self._buffered_bytes >= self._flush_bytes:
            self._full.set()
        return promise

    async def run(self) -> None:
        """The flusher loop; runs for the life of the agent in its root task group."""
        self._loop = asyncio.get_running_loop()  # where worker threads resolve promises
        async with anyio.create_task_group() as tg:
            while True:
                await self._arrived.wait()
                deadline = self._oldest + self._interval
                while self._buffered_bytes < self._flush_bytes:
                    remaining = deadline - anyio.current_time()
                    if remaining <= 0:
                        break
                    with anyio.move_on_after(remaining):
                        await self._full.wait()
                await self._flush_slots.acquire()
                items, self._buffer = self._buffer, []
                self._buffered_bytes = 0
                self._arrived = anyio.Event()
                self._full = anyio.Event()
                seq, self._next_flush = self._next_flush, self._next_flush + 1
                tg.start_soon(self._flush, items, seq)

    async def _flush(self, items: list[_Queued], seq: int) -> None:
        results = [AppendResult(ErrorCode.kafka_storage_error)] * len(items)
        flush: _Flush | None = None
        try:
            try:
                flush = self._prepare(items, seq)
                # Into the cache first: no reader looks for this key before its commit.
                self._cache.put(flush.key, flush.data)
                committed = await anyio.to_thread.run_sync(
                    self._upload_and_commit, flush, limiter=self._threads
                )
                if committed is None:  # another thread commits it
                    await flush.done.wait()
                    committed = flush.results
                assert committed is not None
                for i, result in zip(flush.order, committed, strict=True):
                    results[i] = result
            except Exception:
                log.exception("flush of %d batches failed", len(items))
            finally:
                with anyio.CancelScope(shield=True):
                    await self._give_up_turn(seq)  # nothing to do once it took its turn
        finally:
            self._flush_slots.release()
        if flush is not None and flush.uploaded:
            self.stats.flushes += 1
            self.stats.batches += len(items)
            self.stats.bytes += len(flush.data)
        if flush is not None and (flush.failed or flush.results is None):
            self._cache.discard(flush.key)  # never committed
        touched = set()
        for item, result in zip(items, results, strict=True):
            item.promise.set(result)
            touched.add((item.topic_id, item.partition))
        for key in touched:
            self._notifier.notify(key)

    def _prepare(self, items: list[_Queued], seq: int) -> _Flush:
        """The flush's object and what its commit will record, on the event loop."""
        # Group per partition, keeping arrival order inside each partition.
        groups: dict[tuple[bytes, int], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.topic_id, item.partition), []).append(i)
        chunks = [
            (topic_id, partition, [items[i].data for i in idx])
            for (topic_id, partition), idx in groups.items()
        ]
        data, locations = encode_ingest_file(chunks)
        order: list[int] = []
        pending: list[PendingBatch] = []
        for idx, location in zip(groups.values(), locations, strict=True):
            for i, start in zip(idx, location.batch_starts, strict=True):
                item = items[i]
                view = item.view
                order.append(i)
                pending.append(
                    PendingBatch(
                        topic_id=item.topic_id,
                        partition=item.partition,
                        start=start,
                        length=len(item.data),
                        last_offset_delta=view.last_offset_delta,
                        max_timestamp=view.max_timestamp,
                        producer_id=view.producer_id,
                        producer_epoch=view.producer_epoch,
                        base_sequence=view.base_sequence,
                        transactional=view.is_transactional,
                    )
                )
        return _Flush(seq, new_object_key(), data, pending, order, Promise())

    async def _give_up_turn(self, seq: int) -> None:
        """If flush seq never took its turn (it failed before its upload, or was cancelled),
        give it up, so that the flushes after it are not held back."""
        with self._commit_lock:
            if seq < self._next_commit or seq in self._uploaded:
                return
        await anyio.to_thread.run_sync(self._take_turn, seq, None)

    # -- in worker threads ---------------------------------------------------------------

    def _upload_and_commit(self, flush: _Flush) -> list[AppendResult] | None:
        """Upload the flush's object, then commit what is next in order unless another
        thread is committing. Returns the flush's results, or None when another thread
        commits it (flush.done resolves then)."""
        try:
            self._store.put_sync(flush.key, flush.data, if_absent=True)
        except Exception as exc:  # the store failed: nothing is acked
            log.warning("upload of %d batches failed: %s", len(flush.pending), exc)
            with self._commit_lock:
                self.stats.failed_flushes += 1
                flush.failed = True
            self._take_turn(flush.seq, None)
            return [AppendResult(ErrorCode.kafka_storage_error)] * len(flush.pending)
        flush.uploaded = True
        self._take_turn(flush.seq, flush)
        with self._commit_lock:
            if flush.results is None:
                flush.handed_off = True
            return flush.results

    def _take_turn(self, seq: int, flush: _Flush | None) -> None:
        """Flush seq is uploaded (None: it is not to be committed). Unless another thread
        is committing, commit every uploaded flush that is next in order, until none is."""
        with self._commit_lock:
            self._uploaded[seq] = flush
            if self._committing:
                return  # that thread looks again when its transaction is done
            self._committing = True
        while True:
            with self._commit_lock:
                group: list[_Flush] = []
                while self._next_commit in self._uploaded:
                    uploaded = self._uploaded.pop(self._next_commit)
                    self._next_commit += 1
                    if uploaded is not None:
                        group.append(uploaded)
                if not group:
                    self._committing = False
                    return
            self._commit(group)

    def _commit(self, group: list[_Flush]) -> None:
        """One metadata transaction for the group; then each flush has its results."""
        now_ms = int(self._clock() * 1000)

        def txn(tr: Any) -> list[list[AppendResult]]:
            return [
                commit_ingest(tr, self._sub, f.key, len(f.data), now_ms, f.pending) for f in group
            ]

        try:
            committed = self._kv.transact_sync(txn)
            failed = False
        except Exception as exc:  # the metadata store failed: nothing of it is acked
            log.warning("commit of %d flushes failed: %s", len(group), exc)
            committed = [
                [AppendResult(ErrorCode.kafka_storage_error)] * len(f.pending) for f in group
            ]
            failed = True
        with self._commit_lock:
            if failed:
                self.stats.failed_flushes += len(group)
            else:
                self.stats.commits += 1
            for f, results in zip(group, committed, strict=True):
                f.results = results
                f.failed = failed
                if f.handed_off:
                    _wake(self._loop, f.done)


def _wake(loop: asyncio.AbstractEventLoop | None, promise: Promise[None]) -> None:
    """Resolve a promise of the event loop from a worker thread."""
    assert loop is not None  # flushes start only in run()
    try:
        loop.call_soon_threadsafe(promise.set, None)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
