"""The produce pipeline: buffer, one object per flush, one metadata commit, then the acks.

Batches from every connection and partition collect in one buffer. A flush starts when
the buffer holds `flush_bytes` or its oldest batch has waited `flush_interval_ms`. Each
flush uploads one ingest file (if-absent) and then commits it in one metadata
transaction. Uploads may overlap; commits happen strictly in flush order, so a
producer's pipelined requests keep their order. No batch is answered before its object
is durable and its commit is done.

Group commit: one committer task commits every uploaded flush that is next in flush
order, all in one metadata transaction (each file still gets its own `commit_ingest`).
While a transaction runs, the flushes uploaded meanwhile wait and go together in the
next one, so commits never queue one behind the other. If that transaction fails,
every flush in it is answered KAFKA_STORAGE_ERROR (nothing of it is acked).
"""

from __future__ import annotations

import logging
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
    data: bytes
    view: RecordBatchView
    promise: Promise[AppendResult]


@dataclass(slots=True)
class _Uploaded:
    """One flush whose object is durable, waiting for its turn to be committed."""

    key: str
    size: int
    pending: list[PendingBatch]
    outcome: Promise[list[AppendResult]]


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
        # Flush order: run() numbers flushes; the committer takes them in that order.
        self._next_flush = 0
        self._next_commit = 0
        self._uploaded: dict[int, _Uploaded | None] = {}  # None: the upload failed
        self._upload_done = anyio.Event()
        self.stats = PipelineStats()

    async def append(
        self, topic_id: bytes, partition: int, data: bytes, view: RecordBatchView
    ) -> AppendResult:
        """Queue one validated batch; returns once it is durable and has offsets (or failed)."""
        return await self.enqueue(topic_id, partition, data, view).wait()

    def enqueue(
        self, topic_id: bytes, partition: int, data: bytes, view: RecordBatchView
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
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._committer)
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
        uploaded: _Uploaded | None = None
        order: list[int] = []
        try:
            try:
                uploaded, order = await self._upload(items)
            except Exception as exc:  # the store failed: nothing is acked
                log.warning("upload of %d batches failed: %s", len(items), exc)
                self.stats.failed_flushes += 1
            finally:
                # Even a failed upload takes its turn, so later flushes are not held back.
                self._uploaded[seq] = uploaded
                self._upload_done.set()
            if uploaded is None:
                results = [AppendResult(ErrorCode.kafka_storage_error)] * len(items)
            else:
                committed = await uploaded.outcome.wait()
                results = [AppendResult(ErrorCode.unknown_server_error)] * len(items)
                for i, result in zip(order, committed, strict=True):
                    results[i] = result
        finally:
            self._flush_slots.release()
        touched = set()
        for item, result in zip(items, results, strict=True):
            item.promise.set(result)
            touched.add((item.topic_id, item.partition))
        for key in touched:
            self._notifier.notify(key)

    async def _upload(self, items: list[_Queued]) -> tuple[_Uploaded, list[int]]:
        """Write the flush's object; returns it with the item index of each pending batch."""
        # Group per partition, keeping arrival order inside each partition.
        groups: dict[tuple[bytes, int], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.topic_id, item.partition), []).append(i)
        chunks = [
            (topic_id, partition, [items[i].data for i in idx])
            for (topic_id, partition), idx in groups.items()
        ]
        data, locations = encode_ingest_file(chunks)
        key = new_object_key()
        await self._store.put(key, data, if_absent=True)
        self._cache.put(key, data)
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
        self.stats.flushes += 1
        self.stats.batches += len(items)
        self.stats.bytes += len(data)
        return _Uploaded(key, len(data), pending, Promise()), order

    async def _committer(self) -> None:
        """Commit uploaded flushes in flush order, all that are ready in one transaction."""
        while True:
            await self._upload_done.wait()
            self._upload_done = anyio.Event()
            group: list[_Uploaded] = []
            while self._next_commit in self._uploaded:
                uploaded = self._uploaded.pop(self._next_commit)
                self._next_commit += 1
                if uploaded is not None:
                    group.append(uploaded)
            if not group:
                continue
            now_ms = int(self._clock() * 1000)

            def txn(
                tr: Any, group: list[_Uploaded] = group, now_ms: int = now_ms
            ) -> list[list[AppendResult]]:
                return [
                    commit_ingest(tr, self._sub, u.key, u.size, now_ms, u.pending) for u in group
                ]

            try:
                committed = await self._kv.transact(txn)
            except Exception as exc:  # the metadata store failed: nothing of it is acked
                log.warning("commit of %d flushes failed: %s", len(group), exc)
                self.stats.failed_flushes += len(group)
                for u in group:
                    u.outcome.set([AppendResult(ErrorCode.kafka_storage_error)] * len(u.pending))
                continue
            self.stats.commits += 1
            for u, results in zip(group, committed, strict=True):
                u.outcome.set(results)
