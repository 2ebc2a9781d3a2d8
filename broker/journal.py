"""Lightning topics: a produce is answered once its object is durable, and sequenced after.

A topic with `bucketlog.topic.type=lightning` takes the journal path (DESIGN.md, "Lazy
sequencing"):

1. `JournalPipeline` buffers its batches like the ingest pipeline and writes one object
   per flush into this process's journal sequence (`journal/<sequence>/<n>`, a new
   sequence after `files_per_sequence` objects or `sequence_seconds`). The object carries
   a batch table (storage.ingest) so that anyone can sequence it from its tail alone.
2. As soon as the upload returns, the batches are answered: no error, base offset -1
   (Kafka's answer when the offset is not known).
3. The committer then sequences the objects in n order (metadata.journal), each at most
   once: a second attempt (a retry after an unknown result, the sweep racing it) changes
   nothing. A failed commit is retried until it succeeds; the batches are already
   answered.
4. `JournalSweep`, run by one agent at a time (a lease), sequences the objects of
   sequences no live process writes any more: an agent killed between answering and
   sequencing loses nothing.

Idempotent producers stay correct (`ProducerSequences`): the agent checks each batch's
sequence against what it answered before for that producer and partition (loaded from
the metadata store at first sight) and answers DUPLICATE (no error, offset -1) or
OUT_OF_ORDER_SEQUENCE_NUMBER / INVALID_PRODUCER_EPOCH at produce time, as Kafka does at
append. Since the objects are sequenced in order, the check at sequencing agrees.
Transactional batches are refused (INVALID_TXN_STATE): a transaction's markers must come
after its batches in the log, which a lazily sequenced batch cannot promise.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from broker import faults
from broker.ingest import IngestPipeline, _Flush
from broker.metrics import Meter
from broker.sync import Notifier
from metadata import journal as journal_layer
from metadata import keys, leases, producers
from metadata.kv import KV, KVError
from metadata.log import AppendResult, PendingBatch
from protocol.records import RecordBatchView
from storage.cache import ObjectCache
from storage.hedge import HedgedPuts
from storage.ingest import (
    IngestFileError,
    encode_journal_table,
    new_object_key,
    read_journal_table,
)
from storage.objectstore import ObjectExistsError, ObjectInfo, ObjectStore, ObjectStoreError

logger = logging.getLogger(__name__)

# Test-only (broker.faults): the committer sequences nothing from the n-th flush on, so
# that answered objects wait for the sweep of another process.
COMMIT_NEVER = "journal.commit_never"

UNKNOWN = AppendResult(ErrorCode.none, -1, -1)
# After the agents' membership changed: how long the others may still answer for a
# partition that moved (they re-read the live agents every 0.5 s), and how often the
# journal is listed meanwhile.
SETTLE_S = 1.5
DRAIN_CHECK_S = 0.5
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


@dataclass(slots=True)
class JournalStats:
    sequenced_objects: int = 0  # by this agent's committer
    swept_objects: int = 0  # by the sweep (objects of other processes' sequences)
    skipped_holes: int = 0
    claimed_holes: int = 0  # missing numbers claimed by the sweep (JournalSweep._claim)
    commit_retries: int = 0
    refused_at_sequencing: int = 0  # answered with success, refused when sequenced
    # Refused when sequenced: answered with an error, or swept (its answer not known).
    refused_unanswered: int = 0
    # Idempotent batches ahead of the sequences known here, answered with a retriable
    # error (ProducerSequences.check).
    ahead_of_known: int = 0
    # Uploaded batches answered NOT_LEADER_OR_FOLLOWER: the agents' membership changed,
    # or was not confirmed lately, since they were accepted.
    answers_withheld: int = 0
    unreadable_objects: int = 0
    backlog_objects: int = 0  # answered, not yet sequenced (this agent's)
    retired_sequences: int = 0  # sequence records dropped by the sweep
    backlog_bytes: int = 0


class JournalPipeline(IngestPipeline):
    """The ingest pipeline of lightning topics: answer after the upload, sequence after."""

    _drop_fault = False
    _commits_own = False  # its flushes are sequenced by its own committer

    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        store: ObjectStore,
        cache: ObjectCache,
        notifier: Notifier,
        node_id: Callable[[], int],
        *,
        flush_interval_ms: int,
        flush_bytes: int,
        files_per_sequence: int = 1000,
        sequence_seconds: float = 600.0,
        upload_limit_ms: int = 30_000,
        hedge: HedgedPuts | None = None,
        meter: Meter | None = None,
        topic_name: Callable[[bytes], str] = bytes.hex,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            kv,
            sub,
            store,
            cache,
            notifier,
            flush_interval_ms=flush_interval_ms,
            flush_bytes=flush_bytes,
            hedge=hedge,
            meter=meter,
            topic_name=topic_name,
            clock=clock,
        )
        self._node_id = node_id
        self._upload_limit_s = upload_limit_ms / 1000
        self._files_per_sequence = files_per_sequence
        self._sequence_seconds = sequence_seconds
        self._sequence = ""
        self._sequence_files = 0
        self._sequence_opened = 0.0
        self.sequences: set[str] = set()  # every sequence this process wrote
        self._committing = True  # False once the COMMIT_NEVER fault point fired (tests)
        self.journal_stats = JournalStats()
        # Per partition, how many answered batches wait to be sequenced.
        self._unsequenced: Counter[tuple[bytes, int]] = Counter()
        self._sequenced = anyio.Event()
        # An idempotent producer's batch is never answered before the flushes holding
        # its earlier batches of that partition have an outcome (_after_upload); other
        # batches are answered as soon as their own upload returns, whatever the
        # flushes before them are waiting for.
        self._outcomes: set[int] = set()  # flushes past that were answered or failed
        self._answered_below = 0  # every flush below this was answered or failed
        self._answered = anyio.Event()
        # (producer id, topic id, partition) -> the flushes without an outcome yet that
        # hold an idempotent batch of it
        self._in_flight: dict[tuple[int, bytes, int], set[int]] = {}
        self._deps: dict[int, set[int]] = {}  # seq -> the earlier flushes it waits for
        self._failed: set[int] = set()  # flushes failed that a later one waits for
        self._keys: dict[int, set[tuple[int, bytes, int]]] = {}  # seq -> its producers
        # (producer id, topic id, partition) -> time.monotonic() of the last failure of
        # a flush holding a batch of it
        self._failed_at: dict[tuple[int, bytes, int], float] = {}
        # Object key -> the batches of it answered with an error (still sequenced: a
        # refusal of those is expected).
        self._answered_with_error: dict[str, set[int]] = {}
        self.on_failure: Callable[[], None] = lambda: None
        # seq -> time.monotonic() when its first batch was accepted
        self._accepted_from: dict[int, float] = {}
        # Whether batches accepted since the given time.monotonic() may be answered now
        # (ProducerSequences.stable_since): not once the partitions may have moved.
        self.may_answer: Callable[[float], bool] = lambda accepted_from: True

    # -- the object -------------------------------------------------------------------

    def _object_key(self, size: int) -> str:
        now = time.monotonic()
        if (
            not self._sequence
            or self._sequence_files >= self._files_per_sequence
            or now - self._sequence_opened >= self._sequence_seconds
        ):
            self._sequence = new_object_key("")
            self._sequence_files = 0
            self._sequence_opened = now
            self.sequences.add(self._sequence)
        n, self._sequence_files = self._sequence_files, self._sequence_files + 1
        return journal_layer.object_key(self._sequence, n)

    def _table(self, pending: list[PendingBatch]) -> bytes:
        return encode_journal_table(pending)

    # -- answering and sequencing -----------------------------------------------------

    def _prepare(self, items: list[Any], seq: int) -> _Flush:
        self._accepted_from[seq] = min(item.accepted_at for item in items)
        deps: set[int] = set()
        keys = set()
        for item in items:
            if item.view.producer_id >= 0:
                key = (item.view.producer_id, item.topic_id, item.partition)
                keys.add(key)
                holders = self._in_flight.setdefault(key, set())
                deps |= holders - {seq}
                holders.add(seq)
        self._deps[seq] = deps
        self._keys[seq] = keys
        return super()._prepare(items, seq)

    def _resolved(self, seq: int) -> bool:
        return seq < self._answered_below or seq in self._outcomes

    def _hand_over(self, seq: int, flush: _Flush | None) -> None:
        if flush is None:  # failed: its batches are answered with an error
            self._accepted_from.pop(seq, None)
            self._deps.pop(seq, None)
            if any(seq in deps for deps in self._deps.values()):
                self._failed.add(seq)
            now = time.monotonic()
            for key in self._keys.get(seq, ()):
                self._failed_at[key] = now
            self.on_failure()
        for key in self._keys.pop(seq, ()):
            holders = self._in_flight.get(key)
            if holders is not None:
                holders.discard(seq)
                if not holders:
                    del self._in_flight[key]
        super()._hand_over(seq, flush)
        self._outcomes.add(seq)
        while self._answered_below in self._outcomes:
            self._outcomes.remove(self._answered_below)
            self._answered_below += 1
        self._answered.set()
        self._answered = anyio.Event()

    async def _after_upload(self, flush: _Flush) -> list[AppendResult]:
        deps = self._deps.pop(flush.seq)
        while not all(self._resolved(d) for d in deps):  # its producers' earlier batches
            await self._answered.wait()
        accepted_from = self._accepted_from.pop(flush.seq)
        # Failed before it: a flush it waited for, or any flush holding a batch of one of
        # its producers once its batches were accepted (their sequence checks counted
        # on those batches being written).
        failed_before = bool(deps & self._failed) or any(
            self._failed_at.get(key, -1.0) >= accepted_from for key in self._keys.get(flush.seq, ())
        )
        if self._failed and not self._deps:
            self._failed.clear()  # no flush waits for any of them any more
        if self._failed_at:
            too_old = time.monotonic() - 2 * self._upload_limit_s - 60
            for key in [k for k, at in self._failed_at.items() if at < too_old]:
                del self._failed_at[key]
        took = anyio.current_time() - flush.started_at
        if took > self._upload_limit_s:
            # The sweep may have skipped this object's number by now: never answer it.
            logger.warning("upload of %s took %.1f s: not answered with success", flush.key, took)
            self.stats.failed_flushes += 1
            self._hand_over(flush.seq, None)
            return [AppendResult(ErrorCode.kafka_storage_error)] * len(flush.pending)
        flush.parts = []  # in the cache and the store; only the batch list waits
        for b in flush.pending:
            self._unsequenced[b.topic_id, b.partition] += 1
        self.journal_stats.backlog_objects += 1
        self.journal_stats.backlog_bytes += flush.size
        self._hand_over(flush.seq, flush)
        if not self.may_answer(accepted_from):
            # The partitions may have moved since its batches were accepted: another
            # agent may be answering for them already, and these would be sequenced
            # after its. Still sequenced: a producer's retry is then a duplicate.
            self.journal_stats.answers_withheld += len(flush.pending)
            self._answered_with_error[flush.key] = set(range(len(flush.pending)))
            return [AppendResult(ErrorCode.not_leader_or_follower)] * len(flush.pending)
        if not failed_before:
            return [UNKNOWN] * len(flush.pending)
        # A flush made before it failed: an idempotent producer's batch here follows
        # one of its batches there, which sequencing would then refuse. It is answered
        # with the failed flush's retriable error, and the producer sends both again, in
        # order and under the same epoch: if sequencing wrote it after all (it was in
        # order), the retry is a duplicate. (OUT_OF_ORDER_SEQUENCE_NUMBER would make the
        # producer send them under a new epoch, which no duplicate check can match.)
        self._answered_with_error[flush.key] = {
            i for i, b in enumerate(flush.pending) if b.producer_id >= 0
        }
        return [
            AppendResult(ErrorCode.kafka_storage_error) if b.producer_id >= 0 else UNKNOWN
            for b in flush.pending
        ]

    async def _commit(self, group: list[_Flush]) -> None:
        """Sequence each flush in turn, retrying until the store takes it."""
        for flush in group:
            await self._sequence_flush(flush)

    async def _sequence_flush(self, flush: _Flush) -> None:
        parsed = journal_layer.parse_key(flush.key)
        assert parsed is not None
        sequence, n = parsed
        size = flush.size
        pause = RETRY_FIRST_S
        attempts, began = 0, time.monotonic()
        if self._committing and faults.misbehave(COMMIT_NEVER):
            self._committing = False
            logger.warning(
                "fault point %s (test-only): %s and every later flush answered, never"
                " sequenced here",
                COMMIT_NEVER,
                flush.key,
            )
        if not self._committing:
            return
        while True:
            txn = partial(
                journal_layer.sequence_object,
                sub=self._sub,
                sequence=sequence,
                n=n,
                node_id=self._node_id(),
                object_size=size,
                now_ms=int(self._clock() * 1000),
                batches=flush.pending,
            )
            try:
                began = time.monotonic()
                results = await self._kv.transact(txn)
                self.meter.metadata_commit.observe(time.monotonic() - began)
                break
            except KVError as exc:  # the metadata store is unavailable: later
                self.journal_stats.commit_retries += 1
                # The first failure is news; the retries (every RETRY_MAX_S at most) are not.
                logger.log(
                    logging.WARNING if attempts == 0 else logging.DEBUG,
                    "sequencing %s failed, trying again until it succeeds: %s",
                    flush.key,
                    exc,
                )
            except Exception:
                self.journal_stats.commit_retries += 1
                logger.exception("sequencing %s failed, again in %.2f s", flush.key, pause)
            attempts += 1
            await anyio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_S)
        if attempts:
            logger.info(
                "sequenced %s after %d failed attempts over %.1f s",
                flush.key,
                attempts,
                time.monotonic() - began,
            )
        self.stats.commits += 1
        answered_with_error = self._answered_with_error.pop(flush.key, set())
        if results is not None:
            self.journal_stats.sequenced_objects += 1
            _report_refusals(
                flush.key, flush.pending, results, self.journal_stats, answered_with_error
            )
        self.journal_stats.backlog_objects -= 1
        self.journal_stats.backlog_bytes -= size
        touched = set()
        for b in flush.pending:
            key = (b.topic_id, b.partition)
            touched.add(key)
            self._unsequenced[key] -= 1
            if self._unsequenced[key] <= 0:
                del self._unsequenced[key]
        for key in touched:
            self._notifier.notify(key)
        self._sequenced.set()
        self._sequenced = anyio.Event()

    async def wait_sequenced(self, topic_id: bytes, partition: int) -> None:
        """Return once no batch of the partition answered here waits to be sequenced
        (a topic turned classic: its next batches must come after them)."""
        while self._unsequenced.get((topic_id, partition)):
            await self._sequenced.wait()


def _report_refusals(
    key: str,
    pending: list[PendingBatch],
    results: list[AppendResult],
    stats: JournalStats,
    not_answered: set[int] | None,
) -> None:
    """A batch answered with success and refused at sequencing is lost: never expected
    (the produce-time checks agree with sequencing), loud if it happens. One answered
    with an error, or never answered (`not_answered` None: the sweep does not know which
    its writer answered), may be refused: its producer sends it again."""
    for i, (batch, result) in enumerate(zip(pending, results, strict=True)):
        if result.error == ErrorCode.none:
            continue
        if not_answered is not None and i in not_answered:
            stats.refused_unanswered += 1
            logger.info(
                "journal object %s: a batch of producer %d on partition %d, answered with "
                "an error, was refused when sequenced: %s",
                key,
                batch.producer_id,
                batch.partition,
                result.error.name,
            )
            continue
        if not_answered is None:  # its writer's answer is not known here
            stats.refused_unanswered += 1
            logger.warning(
                "journal object %s: a batch of producer %d on partition %d was refused "
                "when sequenced: %s (expected if its writer did not answer it with "
                "success, and the producer sent it again elsewhere)",
                key,
                batch.producer_id,
                batch.partition,
                result.error.name,
            )
            continue
        stats.refused_at_sequencing += 1
        logger.error(
            "journal object %s: a batch of producer %d on partition %d, answered with "
            "success, was refused when sequenced: %s",
            key,
            batch.producer_id,
            batch.partition,
            result.error.name,
        )


# -- idempotent producers ---------------------------------------------------------------


class ProducerSequences:
    """The sequence rules of idempotent producers, checked when a lightning batch is
    answered: against the batches answered before, here, for that producer and
    partition, and at first sight against the metadata store.

    The metadata store is the truth about what other agents answered only once their
    journal objects are sequenced. So after the agents' membership changes (partitions
    move between agents), and when the agent starts, it answers lightning batches
    NOT_LEADER_OR_FOLLOWER (retriable: the producer asks again) until every other
    process's journal object in the store is sequenced (`settled`), `SETTLE_S` after the
    change at the earliest (the other agents learn of it by then and stop answering for
    partitions they no longer lead): a producer's batches answered here come after those
    answered elsewhere, and an idempotent producer's are checked against them. What it
    answered before is then loaded afresh."""

    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        journal: JournalPipeline,
        live_view: Callable[[], tuple[int, ...]] = lambda: (),
        others_drained: Callable[[], Awaitable[bool]] | None = None,
        own_node_id: Callable[[], int] = lambda: -1,
        view_fresh: Callable[[], bool] = lambda: True,
        outage: Callable[[], bool] = lambda: False,
        settle_s: float = SETTLE_S,
    ) -> None:
        self._kv = kv
        self._sub = sub
        self._journal = journal
        self._states: dict[tuple[int, bytes, int], producers.PartitionProducerState | None] = {}
        self._identities: dict[int, producers.ProducerIdentity | None] = {}
        journal.on_failure = self.forget
        self._live_view = live_view
        self._others_drained = others_drained
        self._own_node_id = own_node_id
        self._view_fresh = view_fresh
        self._outage = outage
        self._settle_s = settle_s
        journal.may_answer = self.stable_since
        self._view: tuple[int, ...] | None = None
        self._view_changed_at = 0.0
        self._settled = others_drained is None
        self._next_drain_check = 0.0

    def _observe_view(self, now: float) -> tuple[int, ...]:
        view = self._live_view()
        if view != self._view:
            self._view, self._view_changed_at, self._settled = view, now, False
        return view

    def stable_since(self, accepted_from: float) -> bool:
        """Whether batches accepted since `accepted_from` (time.monotonic()) may be
        answered now: the agent's view of its peers is confirmed and unchanged since."""
        if self._others_drained is None:
            return True
        self._observe_view(time.monotonic())
        return self._view_fresh() and self._view_changed_at <= accepted_from

    async def settled(self) -> bool:
        """Whether lightning batches may be answered now (see the class)."""
        if self._others_drained is None:
            return True
        now = time.monotonic()
        view = self._observe_view(now)
        if not self._view_fresh():
            return False
        if self._settled:
            return True
        alone = view == (self._own_node_id(),)
        if (
            not alone and now - self._view_changed_at < self._settle_s
        ) or now < self._next_drain_check:
            return False
        self._next_drain_check = now + DRAIN_CHECK_S
        try:
            if not await self._others_drained():
                return False
        except (KVError, ObjectStoreError) as exc:
            logger.debug("drain check failed: %s", exc)
            return False
        if self._view == view:
            self._settled = True
            self.forget()
        return self._settled

    async def may_accept(self, idempotent: bool) -> bool:
        """Whether a lightning batch may be accepted now: once settled; and in Ripcord
        mode while the metadata store is unreachable (no drain check can be made), a
        batch without a producer id as soon as the view of the peers is fresh."""
        if await self.settled():
            return True
        return not idempotent and self._outage() and self._view_fresh()

    def forget(self) -> None:
        """Drop what was answered: a flush failed, and its batches with it. Each state is
        loaded again, once what was answered here is sequenced."""
        self._states.clear()
        self._identities.clear()

    async def check(self, topic_id: bytes, partition: int, view: RecordBatchView) -> AppendResult:
        """UNKNOWN (answer success, offset -1) and the batch recorded as answered, a
        duplicate's UNKNOWN (nothing recorded: not to be written again), or an error."""
        if not await self.settled():
            return AppendResult(ErrorCode.not_leader_or_follower)
        pid = view.producer_id
        key = (pid, topic_id, partition)
        if key not in self._states or (
            (identity := self._identities.get(pid)) is not None
            and view.producer_epoch > identity.epoch
        ):
            try:
                await self._load(key)
            except KVError:  # the store is unreachable (Ripcord): the producer waits
                return AppendResult(ErrorCode.not_leader_or_follower)
        last_seq = producers.last_sequence_of(view.base_sequence, view.last_offset_delta)

        def ahead(check: producers.SequenceCheck) -> bool:
            return check.error == ErrorCode.out_of_order_sequence_number and _ahead(
                self._identities.get(pid),
                self._states.get(key),
                view.producer_epoch,
                view.base_sequence,
            )

        check = self._check(key, view, last_seq)
        if ahead(check):
            # Ahead of what is known here: the batches between may have been answered
            # by another agent and not be sequenced yet. Known afresh, if still ahead,
            # answered with a retriable error: OUT_OF_ORDER_SEQUENCE_NUMBER would make
            # the producer send its unanswered batches again under a new epoch, and any
            # of them already written would be written twice.
            if self._outage():  # nothing can be learnt now (Ripcord): the producer waits
                return AppendResult(ErrorCode.not_leader_or_follower)
            self._states.pop(key, None)
            try:
                await self._load(key)
            except KVError:
                return AppendResult(ErrorCode.not_leader_or_follower)
            check = self._check(key, view, last_seq)
            if ahead(check):
                self._journal.journal_stats.ahead_of_known += 1
                return AppendResult(ErrorCode.not_leader_or_follower)
        if check.error != ErrorCode.none:
            return AppendResult(check.error)
        if check.duplicate_of is not None:
            return AppendResult(ErrorCode.none, -1, -1, duplicate=True)
        self._states[key] = producers.record_append(
            self._states.get(key), view.producer_epoch, view.base_sequence, last_seq, -1
        )
        return UNKNOWN

    def _check(
        self, key: tuple[int, bytes, int], view: RecordBatchView, last_seq: int
    ) -> producers.SequenceCheck:
        return producers.check_batch(
            self._identities.get(key[0]),
            self._states.get(key),
            view.producer_epoch,
            view.base_sequence,
            last_seq,
        )

    async def _load(self, key: tuple[int, bytes, int]) -> None:
        pid, topic_id, partition = key
        # The metadata store knows every batch answered here once they are sequenced.
        await self._journal.wait_sequenced(topic_id, partition)

        def read(tr: Any) -> tuple[Any, Any]:
            return (
                producers.get_producer(tr, self._sub, pid),
                producers.load_partition_state(tr, self._sub, pid, topic_id, partition),
            )

        identity, state = await self._kv.read(read)
        self._identities[pid] = identity
        if key not in self._states:  # else answered here meanwhile: that is newer
            self._states[key] = state


def _ahead(
    identity: producers.ProducerIdentity | None,
    state: producers.PartitionProducerState | None,
    epoch: int,
    first_seq: int,
) -> bool:
    """Whether a batch out of order against `state` starts past its next sequence: the
    batches missing in between may exist elsewhere (a batch too old, or of an epoch the
    producer was never given, is out of order whatever was answered elsewhere)."""
    if identity is None or epoch > identity.epoch:
        return False
    if state is None or epoch != state.epoch:
        return True
    distance = (first_seq - state.last_sequence - 1) % (producers.INT32_MAX + 1)
    return 0 < distance <= producers.INT32_MAX // 2


# -- the sweep ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepSettings:
    interval_ms: int = 10_000
    # A sequence is another process's to finish once its newest object is this old.
    idle_ms: int = 10_000
    # An upload outliving this is not answered with success: a missing object n whose
    # successor is older than this (plus the idle time) will never come.
    upload_limit_ms: int = 30_000
    # A sequence's record is dropped once none of its objects is left and it was last
    # sequenced this long ago: far longer than any upload can take, so that no object of
    # it can appear afterwards but a new one.
    retire_after_ms: int = 3_600_000


class JournalSweep:
    """Sequences the journal objects no live process will sequence: those of sequences
    whose writer died (or stopped committing) after answering them."""

    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        store: ObjectStore,
        notifier: Notifier,
        pipeline: JournalPipeline,
        node_id: Callable[[], int],
        settings: SweepSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self._sub = sub
        self._store = store
        self._notifier = notifier
        self._pipeline = pipeline
        self._node_id = node_id
        self.settings = settings
        self._clock = clock
        self.stats = pipeline.journal_stats

    async def others_drained(self) -> bool:
        """Whether every journal object of another process in the store is sequenced
        (or skipped). An agent that waits for this finishes the idle sequences itself,
        without the sweep's lease (whose holder may be the agent that died): sequencing
        an object twice changes nothing, so two agents doing it is only work done
        twice. Sequences still written to are left to their writers."""
        nexts, by_sequence = await self._waiting_by_sequence()
        if await self._finish_idle(nexts, by_sequence):
            nexts, by_sequence = await self._waiting_by_sequence()
        return not any(max(objects) >= nexts[sequence] for sequence, objects in by_sequence.items())

    async def _finish_idle(
        self, nexts: dict[str, int], by_sequence: dict[str, dict[int, ObjectInfo]]
    ) -> int:
        """Sequence what waits in the sequences with no new object for the idle time."""
        now = self._clock()
        done = 0
        for sequence, objects in sorted(by_sequence.items()):
            waiting = {n: info for n, info in objects.items() if n >= nexts[sequence]}
            if not waiting:
                continue
            newest = max(info.last_modified for info in objects.values())
            if now - newest < self.settings.idle_ms / 1000:
                continue  # its writer may still be sequencing it
            done += await self._finish(sequence, nexts[sequence], waiting, now)
        return done

    async def _waiting_by_sequence(
        self, *, every_sequence: bool = True
    ) -> tuple[dict[str, int], dict[str, dict[int, ObjectInfo]]]:
        """The objects waiting to be sequenced in other processes' sequences, and each
        such sequence's next number. Each sequence is listed from its next number on, so
        that the objects already sequenced (most of the journal, until compaction and
        GC remove them) are never read. `every_sequence=False` (the periodic sweep)
        leaves out the sequences sequenced within the idle time: their writers are at
        work, and listing them would only cost requests."""
        sequences = [
            s
            for s in await self._store.list_folders(journal_layer.PREFIX)
            if s not in self._pipeline.sequences
        ]
        if not sequences:
            return {}, {}
        records = await self._kv.read(lambda tr: journal_layer.records_of(tr, self._sub, sequences))
        now_ms = self._clock() * 1000
        by_sequence: dict[str, dict[int, ObjectInfo]] = {}
        for sequence in sequences:
            next_n, updated_ms = records[sequence]
            if (
                not every_sequence
                and updated_ms is not None
                and now_ms - updated_ms < self.settings.idle_ms
            ):
                continue
            after = journal_layer.object_key(sequence, next_n - 1) if next_n > 0 else ""
            for info in await self._store.list(
                f"{journal_layer.PREFIX}{sequence}/", start_after=after
            ):
                parsed = journal_layer.parse_key(info.key)
                if parsed is not None and parsed[1] >= next_n:
                    by_sequence.setdefault(sequence, {})[parsed[1]] = info
        return {s: records[s][0] for s in by_sequence}, by_sequence

    async def run(self, on_store_failure: Callable[[str, Exception], None] | None = None) -> None:
        report = on_store_failure or (lambda message, exc: logger.warning(message, exc))
        while True:
            await anyio.sleep(self.settings.interval_ms / 1000)
            try:
                await self.sweep()
            except KVError as exc:
                report("journal sweep failed: %s", exc)
            except OSError as exc:
                logger.warning("journal sweep failed: %s", exc)
            except Exception:
                logger.exception("journal sweep failed")

    async def sweep(self) -> int:
        """One pass; the objects sequenced."""
        now = self._clock()
        node_id = self._node_id()
        duration = 3 * self.settings.interval_ms
        claimed = await self._kv.transact(
            lambda tr: leases.claim(tr, self._sub, "journal", node_id, int(now * 1000), duration)
        )
        if not claimed:
            return 0
        nexts, by_sequence = await self._waiting_by_sequence(every_sequence=False)
        done = await self._finish_idle(nexts, by_sequence)
        await self._retire(now)
        return done

    async def _retire(self, now: float) -> None:
        """Drop the records of sequences none of whose objects is left in the store (all
        sequenced, compacted and deleted, or skipped and swept) and last sequenced more
        than `retire_after_ms` ago, so that the metadata store does not keep one record
        per sequence forever."""
        on_record = await self._kv.read(lambda tr: journal_layer.list_sequences(tr, self._sub))
        cutoff_ms = int(now * 1000) - self.settings.retire_after_ms
        old = [(s, u) for s, _n, u in on_record if u < cutoff_ms]
        if not old:
            return
        listed = set(await self._store.list_folders(journal_layer.PREFIX))
        for sequence, updated_ms in old:
            if sequence in listed:
                continue
            retired = await self._kv.transact(
                partial(
                    journal_layer.retire, sub=self._sub, sequence=sequence, updated_ms=updated_ms
                )
            )
            if retired:
                self.stats.retired_sequences += 1

    async def _claim(self, sequence: str, missing: list[int]) -> bool:
        """Claim missing numbers of a sequence by writing an empty object under each
        (only where none is: a conditional write), so that an upload of one still on its
        way fails, and is answered with an error, instead of landing after its number
        was skipped. False if one has landed meanwhile (it is sequenced next pass) or the
        store cannot write conditionally."""
        if not getattr(self._store, "conditional_writes", True):
            return False
        for n in missing:
            try:
                await self._store.put(journal_layer.object_key(sequence, n), b"", if_absent=True)
            except ObjectExistsError:
                return False
            self.stats.claimed_holes += 1
        return True

    async def _finish(
        self, sequence: str, next_n: int, waiting: dict[int, ObjectInfo], now: float
    ) -> int:
        """Sequence the waiting objects of one sequence in n order. A missing one is
        skipped once it is claimed (`_claim`), or, on a store without conditional
        writes, once no upload of it can still be answered."""
        done = 0
        hole_limit_s = (self.settings.upload_limit_ms + self.settings.idle_ms) / 1000
        for n in sorted(waiting):
            info = waiting[n]
            if info.size == 0:
                continue  # a claimed number (below): skipped with the next object
            missing = [m for m in range(next_n, n) if m not in waiting]
            if missing and not await self._claim(sequence, missing):
                if now - info.last_modified < hole_limit_s:
                    return done  # objects next_n..n-1 are missing; their uploads may land
            try:
                table = await read_journal_table(self._store, info.key)
            except IngestFileError as exc:
                self.stats.unreadable_objects += 1
                logger.error("journal object %s left in place, not sequenced: %s", info.key, exc)
                return done
            # The table holds a pending batch's fields under the same names.
            pending = [PendingBatch(**asdict(b)) for b in table]
            txn = partial(
                journal_layer.sequence_object,
                sub=self._sub,
                sequence=sequence,
                n=n,
                node_id=self._node_id(),
                object_size=info.size,
                now_ms=int(self._clock() * 1000),
                batches=pending,
            )
            results = await self._kv.transact(txn)
            if results is not None:
                self.stats.swept_objects += 1
                self.stats.skipped_holes += n - next_n
                _report_refusals(info.key, pending, results, self.stats, None)
                logger.info("journal sweep sequenced %s", info.key)
                for key in {(b.topic_id, b.partition) for b in pending}:
                    self._notifier.notify(key)
                done += 1
            next_n = n + 1
        return done
