"""The produce pipeline: buffer, one object per flush, one metadata commit, then the acks.

Batches from every connection and partition collect in one buffer. A flush starts when
the buffer holds `flush_bytes` or its oldest batch has waited `flush_interval_ms`, and,
with `flush_when_idle` (the local store's), as soon as no flush is in flight: a batch
reaching an idle pipeline goes at once, and those that arrive while flushes upload and
commit go together when the last of them is answered (or the interval ends). Each
flush uploads one ingest file (if-absent) in a worker thread and then waits for its
commit. Uploads may overlap; commits happen strictly in flush order, so a producer's
pipelined requests keep their order. No batch is answered before its object is durable
and its commit is done.

One committer task owns the commit side: it takes the uploaded flushes in flush order
and commits every one that is ready, in one metadata transaction (group commit; each
file still gets its own `commit_ingest`). A flush uploaded while a transaction runs
waits for the next one. A flush whose upload failed, or that failed before it, is
skipped in its turn. If a transaction fails, every flush in it is answered
KAFKA_STORAGE_ERROR (nothing of it is acked).

A flush that is next in order when it starts its upload, with no commit under way,
commits itself instead: its worker thread runs the commit right after the upload (one
hand-over to a thread and back instead of two; on the local store at a modest rate that
is nearly every flush), and the committer waits for it before it commits the flushes
after it. Answers and failures are the same either way.

With a disk cache (storage.disk_cache; S3's default) every committed flush's file is
also written there once its batches are answered, among the first objects to go when
room is wanted: level-1 compaction, which takes files of the last 10-20 s, and readers
of them find them on this disk once the memory cache has let them go, rather than
GETting them from the store again (integration/bench/README.md, 54th pass).

The one exception is a test-only fault point (`broker.faults`): armed with
`BUCKETLOG_FAULT_POINTS=ingest.ack_without_commit@n`, the n-th batch of a producer
without idempotence is answered with success and an offset (the partition's high
watermark, which the next record takes) and never committed: a lost acknowledged batch,
for the chaos tests to catch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from broker import faults
from broker.costs import charge
from broker.metrics import Meter
from broker.sync import Flag, Notifier, Promise
from metadata import keys
from metadata.chunk_cache import ChunkCache
from metadata.kv import KV
from metadata.log import AppendResult, ChunkEntry, PendingBatch, commit_ingest, get_partition
from protocol.records import RecordBatchView
from storage.cache import ObjectCache, Pieces
from storage.disk_cache import DiskCache
from storage.hedge import HedgedPuts
from storage.ingest import INGEST_PREFIX, ChunkLocation, encode_ingest_parts
from storage.objectstore import ObjectStore
from storage.threads import ThreadPool

logger = logging.getLogger(__name__)

ACK_WITHOUT_COMMIT = "ingest.ack_without_commit"  # a fault point: test-only
MAX_CONCURRENT_FLUSHES = 8  # uploads under way at once, each in a thread of its own
HELD_SLACK = 64 * 1024  # bytes a flush's pieces may keep alive beyond a quarter more


@dataclass(slots=True)
class _Queued:
    topic_id: bytes
    partition: int
    data: bytes | memoryview
    view: RecordBatchView
    promise: Promise[AppendResult]
    deadline: float | None  # time.monotonic() after which it must not be committed
    accepted_at: float = 0.0  # time.monotonic() when it was queued


@dataclass(slots=True, eq=False)
class _Flush:
    """One flush's object on its way to the log: uploaded, then committed in its turn."""

    seq: int
    key: str
    # The object as the pieces it is made of (its batches among them, views of the
    # requests' frames), written as they are and never joined unless read.
    parts: list[bytes | memoryview]
    pending: list[PendingBatch]
    deadlines: list[float | None]  # of each pending batch (_Queued.deadline)
    # The buffer index of each pending batch, then of each dropped one.
    order: list[int]
    committed: Promise[list[AppendResult]]  # resolved by the committer
    size: int = 0  # bytes of the object
    started_at: float = 0.0  # time.monotonic() when it was made
    uploaded_at: float = 0.0  # time.monotonic() when its upload returned
    # (topic id, partition) of each batch to be acknowledged but not committed (only
    # ever with the test-only fault point ACK_WITHOUT_COMMIT)
    dropped: list[tuple[bytes, int]] = field(default_factory=list)


@dataclass(slots=True)
class PipelineStats:
    flushes: int = 0
    batches: int = 0
    bytes: int = 0
    commits: int = 0
    failed_flushes: int = 0
    timed_out_batches: int = 0  # refused at their commit: past their request's deadline
    own_commits: int = 0  # flushes committed in their upload's thread (of `commits`)


def _keep_on_disk(disk: DiskCache, flush: _Flush) -> None:
    """A committed flush's file into the disk cache, released: first to go for room. A
    file the disk cannot write stays in the store only (the disk cache counts it)."""
    disk.fill(flush.key, flush.size, iter(flush.parts))
    disk.release(flush.key)  # (a no-op if it was not kept)


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
        max_concurrent_flushes: int = MAX_CONCURRENT_FLUSHES,
        max_commit_delay_ms: int | None = None,
        flush_when_idle: bool = False,
        hedge: HedgedPuts | None = None,
        meter: Meter | None = None,
        topic_name: Callable[[bytes], str] = bytes.hex,
        clock: Callable[[], float] = time.time,
        chunks: ChunkCache | None = None,
        disk: DiskCache | None = None,
    ) -> None:
        self._kv = kv
        self._disk = disk
        # The Fetch's cache of chunk entries: what a commit writes joins the runs held.
        self._chunks = chunks
        self._hedge = hedge
        self.meter = meter or Meter()
        self._topic_name = topic_name
        self._sub = sub
        self._store = store
        self._cache = cache
        self._notifier = notifier
        self._interval = flush_interval_ms / 1000
        self._flush_bytes = flush_bytes
        self._max_commit_delay = None if max_commit_delay_ms is None else max_commit_delay_ms / 1000
        # Held by each flush from its start until its commit is done (or it failed).
        # fast_acquire: a free slot is taken without a turn of the event loop.
        self._flush_slots = anyio.Semaphore(
            max_concurrent_flushes, max_value=max_concurrent_flushes, fast_acquire=True
        )
        self._clock = clock
        self._buffer: list[_Queued] = []
        self._buffered_bytes = 0
        self._oldest = 0.0
        # Flags, not anyio's events, and time.monotonic(), not anyio.current_time(): made
        # and read for every flush, and anyio's ask for the running loop each time (a
        # getpid() on Python 3.11; broker.sync.Flag).
        self._arrived = Flag()
        self._full = Flag()  # the buffer holds flush_bytes, or no flush is in flight
        self._flush_when_idle = flush_when_idle
        # Flush order: run() numbers flushes; the committer commits them in that order.
        self._next_flush = 0
        self._uploaded: dict[int, _Flush | None] = {}  # None: skipped, nothing to commit
        self._uploaded_changed = Flag()
        self._next_commit = 0
        self._commit_busy = False  # a commit is under way: the committer's or a flush's own
        self._hedged_threads = anyio.CapacityLimiter(max_concurrent_flushes)
        self._uploads = ThreadPool(max_concurrent_flushes, "upload")
        self.stats = PipelineStats()

    @property
    def _no_flush_in_flight(self) -> bool:
        return self._flush_slots.value == self._flush_slots.max_value

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the batches accepted and not yet in a flush."""
        return self._buffered_bytes

    async def append(
        self, topic_id: bytes, partition: int, data: bytes | memoryview, view: RecordBatchView
    ) -> AppendResult:
        """Queue one validated batch; returns once it is durable and has offsets (or failed)."""
        return await self.enqueue(topic_id, partition, data, view).wait()

    def enqueue(
        self,
        topic_id: bytes,
        partition: int,
        data: bytes | memoryview,
        view: RecordBatchView,
        deadline: float | None = None,
    ) -> Promise[AppendResult]:
        """Queue one validated batch now; the promise resolves once it is durable and has
        offsets (or failed). Batches are committed in the order they are queued. A batch
        whose commit would begin after `deadline` (time.monotonic()) is refused with
        REQUEST_TIMED_OUT instead, nothing of it written."""
        promise: Promise[AppendResult] = Promise()
        if not self._buffer:
            self._oldest = time.monotonic()
            self._arrived.set()
        self._buffer.append(
            _Queued(topic_id, partition, data, view, promise, deadline, time.monotonic())
        )
        self._buffered_bytes += len(data)
        if self._buffered_bytes >= self._flush_bytes:
            self._full.set()
        return promise

    async def run(self) -> None:
        """The flusher loop and the committer; run for the life of the agent in its root
        task group."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._committer)
            while True:
                await self._arrived.wait()
                deadline = self._oldest + self._interval
                while self._buffered_bytes < self._flush_bytes:
                    if self._flush_when_idle and self._no_flush_in_flight:
                        break
                    if self._full.is_set():  # set, and neither reason holds any more
                        self._full = Flag()
                    if not await self._full.wait_until(deadline):
                        break  # the deadline came first
                await self._flush_slots.acquire()
                items, self._buffer = self._buffer, []
                self._buffered_bytes = 0
                self._arrived = Flag()
                self._full = Flag()
                seq, self._next_flush = self._next_flush, self._next_flush + 1
                tg.start_soon(self._flush, items, seq)

    async def _flush(self, items: list[_Queued], seq: int) -> None:
        results = [AppendResult(ErrorCode.kafka_storage_error)] * len(items)
        flush: _Flush | None = None
        own: _OwnCommit | None = None  # the flush commits itself, in its upload's thread
        try:
            try:
                flush = self._prepare(items, seq)
                # Into the cache first: no reader looks for this key before its commit.
                self._cache.put(flush.key, Pieces(flush.parts))
                began = time.monotonic()
                with charge(partial(self._weights, items)):
                    if self._hedge is not None:
                        await self._hedge.put(flush.key, flush.parts, self._hedged_threads)
                    elif (own := self._own_commit(flush)) is not None:
                        try:
                            await self._uploads.run(self._put_and_commit, flush, own)
                        finally:
                            self._own_commit_done()
                    else:
                        await self._uploads.run(
                            partial(
                                self._store.put_parts_sync, flush.key, flush.parts, if_absent=True
                            )
                        )
            except Exception as exc:  # nothing of it is acked
                if flush is None:
                    logger.exception("flush of %d batches failed", len(items))
                else:
                    logger.warning("upload of %d batches failed: %s", len(items), exc)
                    self.stats.failed_flushes += 1
                    self._cache.discard(flush.key)
                if own is None:  # (a flush committing itself has left the order already)
                    self._hand_over(seq, None)
            else:
                ended = own.uploaded_at if own is not None else time.monotonic()
                self.meter.flush_upload.observe(ended - began)
                self.stats.flushes += 1
                self.stats.batches += len(items)
                self.stats.bytes += flush.size
                if own is not None:
                    flush.uploaded_at = own.uploaded_at
                    (committed,) = self._committed([flush], own.outcome, own.written, own.took)
                    if not isinstance(own.outcome, Exception):
                        self.stats.own_commits += 1
                else:
                    flush.uploaded_at = time.monotonic()
                    committed = await self._after_upload(flush)
                for i, result in zip(flush.order, committed, strict=True):
                    results[i] = result
        finally:
            if seq not in self._uploaded and seq >= self._next_commit:
                self._hand_over(seq, None)  # cancelled: do not hold back the others
            self._flush_slots.release()
            if self._flush_when_idle and self._no_flush_in_flight and self._buffer:
                self._full.set()  # what waits for a flush goes now
        touched = set()
        for item, result in zip(items, results, strict=True):
            item.promise.set(result)
            touched.add((item.topic_id, item.partition))
        if flush is not None:
            self.meter.flush_end_to_end.observe(time.monotonic() - flush.started_at)
        for key in touched:
            self._notifier.notify(key)
        if self._disk is not None and flush is not None:
            if any(result.error == ErrorCode.none for result in results):  # committed
                await anyio.to_thread.run_sync(_keep_on_disk, self._disk, flush)

    def _weights(self, items: list[_Queued]) -> dict[str, float]:
        """The bytes of each topic in a flush: its share of the upload (broker.costs)."""
        weights: dict[str, float] = {}
        for item in items:
            name = self._topic_name(item.topic_id)
            weights[name] = weights.get(name, 0) + len(item.data)
        return weights

    def _hand_over(self, seq: int, flush: _Flush | None) -> None:
        """Flush seq is uploaded (None: it is not to be committed); tell the committer."""
        self._uploaded[seq] = flush
        self._uploaded_changed.set()

    def _own_commit(self, flush: _Flush) -> _OwnCommit | None:
        """If the flush, about to upload, is to commit itself in its upload's thread (one
        hand-over to a thread instead of two): only when it is next to commit and no
        commit is under way. It then holds the commit side until _own_commit_done."""
        if not self._commits_own or self._commit_busy or flush.seq != self._next_commit:
            return None
        self._commit_busy = True
        self._next_commit += 1
        return _OwnCommit()

    def _own_commit_done(self) -> None:
        self._commit_busy = False
        self._uploaded_changed.set()  # the committer goes on with the flushes after it

    def _put_and_commit(self, flush: _Flush, own: _OwnCommit) -> None:
        """In a worker thread: the flush's upload, then at once its commit. An upload that
        fails raises (nothing committed); a failed commit is kept in `own.outcome`."""
        self._store.put_parts_sync(flush.key, flush.parts, if_absent=True)
        own.uploaded_at = time.monotonic()
        txn, own.written = self._commit_txn([flush])
        try:
            own.outcome = self._kv.transact_sync(txn)
        except Exception as exc:
            own.outcome = exc
        own.took = time.monotonic() - own.uploaded_at

    async def _committer(self) -> None:
        """Commit the uploaded flushes in flush order: every one that is ready, together."""
        while True:
            self._uploaded_changed = Flag()
            if self._commit_busy:  # a flush commits itself: the next ones wait for it
                await self._uploaded_changed.wait()
                continue
            group: list[_Flush] = []
            while self._next_commit in self._uploaded:
                uploaded = self._uploaded.pop(self._next_commit)
                self._next_commit += 1
                if uploaded is not None:
                    group.append(uploaded)
            group = self._within_commit_delay(group)
            if group:
                self._commit_busy = True
                try:
                    await self._commit(group)
                finally:
                    self._commit_busy = False
            else:
                await self._uploaded_changed.wait()

    def _within_commit_delay(self, group: list[_Flush]) -> list[_Flush]:
        """The flushes still young enough to commit; the others are answered
        KAFKA_STORAGE_ERROR and left to the orphan sweep (which may delete an object of
        that age, so it must never be committed)."""
        if self._max_commit_delay is None:
            return group
        now = time.monotonic()
        late = [f for f in group if now - f.uploaded_at > self._max_commit_delay]
        for f in late:
            logger.warning(
                "not committing flush %s: uploaded %.0f s ago", f.key, now - f.uploaded_at
            )
            self.stats.failed_flushes += 1
            self._cache.discard(f.key)
            f.committed.set([AppendResult(ErrorCode.kafka_storage_error)] * len(f.order))
        return [f for f in group if f not in late]

    async def _commit(self, group: list[_Flush]) -> None:
        """One metadata transaction for the group; then each flush has its results."""
        txn, written = self._commit_txn(group)
        began = time.monotonic()
        outcome: list[list[AppendResult]] | Exception
        try:
            outcome = await self._kv.transact(txn)
        except Exception as exc:
            outcome = exc
        committed = self._committed(group, outcome, written, time.monotonic() - began)
        for f, results in zip(group, committed, strict=True):
            f.committed.set(results)

    def _commit_txn(
        self, group: list[_Flush]
    ) -> tuple[Callable[[Any], list[list[AppendResult]]], list[tuple[bytes, int, ChunkEntry]]]:
        """The transaction that commits the group's flushes (run in any thread), and the
        list its committing attempt fills with the chunk entries it wrote."""
        now_ms = int(self._clock() * 1000)
        written: list[tuple[bytes, int, ChunkEntry]] = []  # by the attempt that commits

        def txn(tr: Any) -> list[list[AppendResult]]:
            # Taken in each attempt, once the store let it begin (SQLite's write lock
            # held): a batch past its deadline now is not written.
            now = time.monotonic()
            written.clear()
            return [
                commit_ingest(
                    tr,
                    self._sub,
                    f.key,
                    f.size,
                    now_ms,
                    f.pending,
                    {i for i, d in enumerate(f.deadlines) if d is not None and now > d},
                    written,
                )
                + [_acked_not_committed(tr, self._sub, *dropped) for dropped in f.dropped]
                for f in group
            ]

        return txn, written

    def _committed(
        self,
        group: list[_Flush],
        outcome: list[list[AppendResult]] | Exception,
        written: list[tuple[bytes, int, ChunkEntry]],
        took: float,
    ) -> list[list[AppendResult]]:
        """On the event loop, after the group's transaction: each flush's results."""
        if isinstance(outcome, Exception):  # the metadata store failed: nothing is acked
            logger.warning("commit of %d flushes failed: %s", len(group), outcome)
            self.stats.failed_flushes += len(group)
            for f in group:
                self._cache.discard(f.key)  # never committed
            return [[AppendResult(ErrorCode.kafka_storage_error)] * len(f.order) for f in group]
        self.meter.metadata_commit.observe(took)
        self.meter.commit_batch.observe(len(group))
        self.stats.commits += 1
        if self._chunks is not None:
            self._chunks.extend(written)
        late = sum(r.error == ErrorCode.request_timed_out for rs in outcome for r in rs)
        if late:
            self.stats.timed_out_batches += late
            logger.warning("%d batches not committed: their produce requests timed out", late)
        return outcome

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
        planned: list[_Plan] = []

        def plan(locations: list[ChunkLocation]) -> bytes:
            planned.append(self._plan(items, list(groups.values()), locations))
            return self._table(planned[0].pending)

        parts, _locations = encode_ingest_parts(chunks, plan)
        size = sum(len(part) for part in parts)
        if _held_bytes(parts) > size + size // 4 + HELD_SLACK:
            # The requests' frames hold much more than their batches here (partitions
            # refused, say): keep a copy of the batches rather than the frames.
            parts = [b"".join(parts)]
        (found,) = planned
        return _Flush(
            seq,
            self._object_key(size),
            parts,
            found.pending,
            found.deadlines,
            found.order + found.dropped,
            Promise(),
            size=size,
            started_at=time.monotonic(),
            dropped=[(items[i].topic_id, items[i].partition) for i in found.dropped],
        )

    def _plan(
        self, items: list[_Queued], groups: list[list[int]], locations: list[ChunkLocation]
    ) -> _Plan:
        """Each batch's place in the object (grouped by partition, `groups` of item
        indexes in chunk order), as its commit will record it."""
        found = _Plan()
        for idx, location in zip(groups, locations, strict=True):
            for i, start in zip(idx, location.batch_starts, strict=True):
                item = items[i]
                view = item.view
                if (
                    self._drop_fault
                    and view.producer_id < 0
                    and faults.misbehave(ACK_WITHOUT_COMMIT)
                ):
                    logger.warning(
                        "fault point %s (test-only): a batch of partition %d acknowledged, "
                        "never committed",
                        ACK_WITHOUT_COMMIT,
                        item.partition,
                    )
                    found.dropped.append(i)
                    continue
                found.order.append(i)
                found.deadlines.append(item.deadline)
                found.pending.append(
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
        return found

    # -- what a journal (broker.journal) does otherwise ----------------------------------

    _drop_fault = True  # the test-only fault point ACK_WITHOUT_COMMIT applies
    _commits_own = True  # a flush next to commit commits itself (_own_commit)

    def _object_key(self, size: int) -> str:
        return self._store.new_key(INGEST_PREFIX, size)

    def _table(self, pending: list[PendingBatch]) -> bytes:
        """A block to put before the object's footer (none)."""
        return b""

    async def _after_upload(self, flush: _Flush) -> list[AppendResult]:
        """The answers of an uploaded flush's batches: once it is committed."""
        self._hand_over(flush.seq, flush)
        return await flush.committed.wait()


@dataclass(slots=True)
class _OwnCommit:
    """A flush's commit made in its upload's thread (IngestPipeline._put_and_commit)."""

    outcome: list[list[AppendResult]] | Exception = field(default_factory=list)
    written: list[tuple[bytes, int, ChunkEntry]] = field(default_factory=list)
    uploaded_at: float = 0.0  # time.monotonic() when the upload returned
    took: float = 0.0  # seconds of the commit


@dataclass(slots=True)
class _Plan:
    order: list[int] = field(default_factory=list)  # item index of each pending batch
    pending: list[PendingBatch] = field(default_factory=list)
    deadlines: list[float | None] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # the fault point's


def _acked_not_committed(
    tr: Any, sub: keys.Subspace, topic_id: bytes, partition: int
) -> AppendResult:
    """The answer of a batch dropped by the fault point: success, at the offset the next
    record of the partition takes."""
    state = get_partition(tr, sub, topic_id, partition)
    if state is None:
        return AppendResult(ErrorCode.unknown_topic_or_partition)
    return AppendResult(ErrorCode.none, state.high_watermark, state.log_start_offset)


def _held_bytes(parts: list[bytes | memoryview]) -> int:
    """The bytes that holding `parts` keeps alive: each buffer a view is of, once."""
    held = 0
    buffers: dict[int, int] = {}
    for part in parts:
        if isinstance(part, memoryview):
            buffers[id(part.obj)] = memoryview(part.obj).nbytes
        else:
            held += len(part)
    return held + sum(buffers.values())
