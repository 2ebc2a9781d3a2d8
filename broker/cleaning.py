"""Cleaning compacted topics (cleanup.policy holds "compact"): the agent's side of a round.

Every `--log-cleaner-backoff-ms` the agent holding the "cleaner" lease looks at every
partition of every compacted topic (metadata.cleaning.measure) and cleans, one after the
other, those worth it by the topic's min.cleanable.dirty.ratio and max.compaction.lag.ms.
A round, in a worker thread:

1. reads the partition's producers (each one's last batch is kept, emptied if need be,
   so that idempotent producers still find their last sequence) and its aborted index;
2. maps the latest offset of every key of the dirty entries (storage.cleaner, at most
   `--log-cleaner-dedupe-buffer-size` of map; a round whose map fills ends there and the
   next round goes on);
3. cleans the partition from its log start to the round's end (the entry holding it
   too: what the map did not reach is kept as it is) in one pass, cut into
   stretches of at most `--compaction-max-job-bytes` and `--compaction-max-entries`
   of entries: each stretch's kept
   batches go into one new object (under compacted/), written first, and one metadata
   transaction puts its entries in place of the stretch's (metadata.cleaning), only if
   the stretch is unchanged; otherwise the round stops there, and the next pass starts
   a new one;
4. moves the partition's first dirty offset to the round's end.

Batches are read with their offsets (rebased as Fetch rebases them), so the cleaner sees
Kafka's offsets; the cleaned entries hold runs of consecutive offsets only (a removed
batch leaves a gap between entries, which Fetch and consumers pass over). Whatever is
killed when, every record at or above the log start offset stays readable: a stretch
commit is all or nothing, and an uploaded output whose commit never came is an orphan
for the lifecycle's sweep.

A round cleans entries wherever they are, ingest files included: their records are
deduplicated from the first rewrite of them, and a level-1 compaction that planned the
same entries meanwhile is dropped at its commit (as a round is when compaction commits
first). Level 2 compaction leaves compacted topics to the cleaner.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import Any, Protocol

import anyio

from broker import faults
from broker.compaction import OUTPUT_PREFIX
from broker.context import JobAgent
from broker.topic_configs import cleanup_policies
from metadata import cleaning as cleaning_layer
from metadata import keys, leases, producers, txns
from metadata import topics as topics_layer
from metadata.chunk_cache import ChunkCache
from metadata.kv import KV
from metadata.log import ChunkEntry, read_chunks
from protocol.records import (
    ControlRecordType,
    RecordBatchView,
    control_record_type,
    iter_batches,
    iter_records,
    rebase_batches,
)
from storage.cleaner import CleanedBatch, CleanerStats, KeyMap, LastBatch, build_key_map, clean
from storage.ingest import encode_ingest_parts, new_object_key
from storage.objectstore import ObjectStore

logger = logging.getLogger(__name__)

LEASE = "cleaner"
PAGE = 1024


@dataclass(frozen=True, slots=True)
class CleaningSettings:
    enabled: bool = True
    backoff_ms: int = 15_000  # Kafka's log.cleaner.backoff.ms
    dedupe_buffer_size: int = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size
    stretch_bytes: int = 64 * 1024 * 1024
    stretch_entries: int = 2_000  # a stretch's commit fits FoundationDB's limits
    entry_bytes: int = 256 * 1024
    delete_delay_ms: int = 60_000


@dataclass(slots=True)
class CleaningStats:
    passes: int = 0
    rounds: int = 0  # finished
    rounds_stopped: int = 0  # a stretch changed under the round
    failures: int = 0
    stretches: int = 0
    records_read: int = 0
    records_removed: int = 0
    bytes_before: int = 0  # of the stretches cleaned
    bytes_after: int = 0
    cpu_seconds: float = 0.0
    # "topic-partition": the dirty ratio last measured, for each compacted partition.
    dirty_ratios: dict[str, float] = field(default_factory=dict)


class CleaningAgent(JobAgent, Protocol):
    """What cleaning needs of its agent: its cache of chunk entries too."""

    @property
    def chunks(self) -> ChunkCache: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class TopicRules:
    """A compacted topic's cleaning configs."""

    min_ratio: float
    min_lag_ms: int
    max_lag_ms: int
    delete_retention_ms: int


def _rules(agent: CleaningAgent, topic: topics_layer.Topic) -> TopicRules:
    def number(name: str) -> int:
        return int(agent.topic_config(topic, name))

    return TopicRules(
        float(agent.topic_config(topic, "min.cleanable.dirty.ratio")),
        number("min.compaction.lag.ms"),
        number("max.compaction.lag.ms"),
        number("delete.retention.ms"),
    )


class Cleaning:
    def __init__(
        self,
        agent: CleaningAgent,
        settings: CleaningSettings,
        *,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._agent = agent
        self.settings = settings
        self._clock = clock
        self.stats = CleaningStats()
        self._thread = anyio.CapacityLimiter(1)

    async def run(self) -> None:
        """Pass after pass, for the life of the agent (in its root task group). As Kafka's
        cleaner, it backs off only after a pass that found nothing to clean: a partition
        whose dirty part holds more keys than the key map takes its rounds back to back."""
        if not self.settings.enabled:
            return
        while True:
            finished = 1
            while finished:
                try:
                    finished = await self.run_pass()
                except Exception as exc:  # the store or the metadata store failed: next time
                    self.stats.failures += 1
                    logger.warning("cleaning failed, will try again: %s", exc)
                    finished = 0
            await anyio.sleep(self.settings.backoff_ms / 1000)

    async def run_pass(self) -> int:
        """Clean every compacted partition worth it; the rounds finished."""
        agent = self._agent
        now, node_id = self._clock(), agent.node_id
        duration = max(3 * self.settings.backoff_ms, 60_000)
        if not await agent.kv.transact(
            lambda tr: leases.claim(tr, agent.sub, LEASE, node_id, now, duration)
        ):
            return 0
        self.stats.passes += 1
        finished = 0
        topics = await agent.kv.read(lambda tr: topics_layer.list_topics(tr, agent.sub))
        for topic in topics:
            if "compact" not in cleanup_policies(agent.topic_config(topic, "cleanup.policy")):
                continue
            rules = _rules(agent, topic)
            for partition in range(topic.partitions):
                finished += await self.clean_partition(topic, partition, rules)
        return finished

    async def clean_partition(
        self, topic: topics_layer.Topic, partition: int, rules: TopicRules
    ) -> int:
        """One round on the partition if it is worth one; 1 when a round finished."""
        agent, s = self._agent, self.settings
        now = self._clock()
        dirt = await agent.kv.read(
            partial(
                cleaning_layer.measure,
                sub=agent.sub,
                topic_id=topic.topic_id,
                partition=partition,
                now_ms=now,
                min_lag_ms=rules.min_lag_ms,
            )
        )
        if dirt is None:
            return 0
        self.stats.dirty_ratios[f"{topic.name}-{partition}"] = round(dirt.ratio, 4)
        if not dirt.worth_cleaning(now, rules.min_ratio, rules.max_lag_ms):
            return 0
        stats = CleanerStats()
        cpu_seconds = [0.0]

        def round_in_thread() -> tuple[int, int, int] | None:
            started = time.thread_time()  # the CPU of this worker thread
            try:
                return clean_round(
                    agent.kv,
                    agent.sub,
                    agent.store,
                    topic.topic_id,
                    partition,
                    dirt,
                    rules,
                    s,
                    now,
                    stats,
                )
            finally:
                cpu_seconds[0] = time.thread_time() - started

        done = await anyio.to_thread.run_sync(round_in_thread, limiter=self._thread)
        self.stats.cpu_seconds += cpu_seconds[0]
        # This agent's Fetches read the cleaned entries from now on; other agents' copies
        # (older entries, whose objects outlive them) expire by themselves.
        agent.chunks.forget(topic.topic_id, partition)
        self.stats.records_read += stats.records_read
        self.stats.records_removed += stats.records_read - stats.records_kept
        if done is None:
            self.stats.rounds_stopped += 1
            return 0
        stretches, before, after = done
        self.stats.stretches += stretches
        self.stats.bytes_before += before
        self.stats.bytes_after += after
        self.stats.rounds += 1
        logger.info(
            "cleaned %s-%d: %d of %d records kept, %d bytes now %d",
            topic.name,
            partition,
            stats.records_kept,
            stats.records_read,
            before,
            after,
        )
        return 1


# -- a round (in a worker thread) ---------------------------------------------------------


def _entries_between(
    kv: KV, sub: keys.Subspace, topic_id: bytes, partition: int, start: int, end: int
) -> list[ChunkEntry]:
    """The entries holding offsets from start on that begin below end."""
    out: list[ChunkEntry] = []
    offset = start
    while True:
        page: list[ChunkEntry] = kv.transact_sync(
            partial(
                read_chunks,
                sub=sub,
                topic_id=topic_id,
                partition=partition,
                from_offset=offset,
                limit=PAGE,
            )
        )
        for entry in page:
            if entry.base_offset >= end:
                return out
            out.append(entry)
        if len(page) < PAGE:
            return out
        offset = page[-1].last_offset + 1


def _entry_batches(store: ObjectStore, entry: ChunkEntry) -> list[RecordBatchView]:
    """The entry's batches, numbered with their offsets; they must hold exactly those."""
    # A view (the file mapped, for a large range of the local store): the rebase below
    # is the one copy of the bytes.
    data = store.get_view_sync(entry.object_key, entry.start, entry.start + entry.length)
    if len(data) != entry.length:
        raise ValueError(f"{entry.object_key} ends inside [{entry.start}, +{entry.length})")
    batches = list(iter_batches(rebase_batches(data, entry.base_offset)))
    if not batches or batches[-1].last_offset != entry.last_offset:
        raise ValueError(
            f"{entry.object_key} [{entry.start}, +{entry.length}) does not hold offsets "
            f"{entry.base_offset}-{entry.last_offset}"
        )
    return batches


def _last_batches(
    tr: Any, sub: keys.Subspace, topic_id: bytes, partition: int
) -> dict[int, LastBatch]:
    """Each producer's last data batch on the partition, by its last offset."""
    out: dict[int, LastBatch] = {}
    for producer_id, state in producers.partition_producers(tr, sub, topic_id, partition):
        if state.batches:
            first_seq, last_seq, base_offset = state.batches[-1]
            count = (last_seq - first_seq) % (1 << 31) + 1  # sequences wrap at 2^31
            out[producer_id] = (base_offset + count - 1, state.epoch)
    return out


def _output_entries(
    object_key: str, kept: Sequence[RecordBatchView], starts: Sequence[int], entry_bytes: int
) -> list[ChunkEntry]:
    """Entries over the kept batches: runs of consecutive offsets, up to entry_bytes."""
    entries: list[ChunkEntry] = []
    run: list[tuple[RecordBatchView, int]] = []

    def close() -> None:
        if run:
            first, start = run[0]
            entries.append(
                ChunkEntry(
                    object_key,
                    start,
                    sum(b.size for b, _s in run),
                    first.base_offset,
                    run[-1][0].last_offset,
                    len(run),
                    max(b.max_timestamp for b, _s in run),
                )
            )
            run.clear()

    size = 0
    for batch, start in zip(kept, starts, strict=True):
        if run and (
            batch.base_offset != run[-1][0].last_offset + 1 or size + batch.size > entry_bytes
        ):
            close()
            size = 0
        run.append((batch, start))
        size += batch.size
    close()
    return entries


def _is_abort_marker(batch: RecordBatchView) -> bool:
    if not batch.is_control:
        return False
    records = list(iter_records(batch))
    return bool(records) and control_record_type(records[0].key) is ControlRecordType.ABORT


def clean_round(
    kv: KV,
    sub: keys.Subspace,
    store: ObjectStore,
    topic_id: bytes,
    partition: int,
    dirt: cleaning_layer.Dirt,
    rules: TopicRules,
    settings: CleaningSettings,
    now_ms: int,
    stats: CleanerStats,
) -> tuple[int, int, int] | None:
    """One round; (stretches committed, their bytes before, after), or None when a
    stretch changed under it (what it committed before stays: each stretch is whole)."""

    def read(tr: Any) -> tuple[dict[int, LastBatch], list[tuple[int, int]], list[tuple[int, int]]]:
        every = txns.aborted_between(
            tr, sub, topic_id, partition, dirt.log_start_offset, dirt.end_offset
        )
        dirty = txns.aborted_between(
            tr, sub, topic_id, partition, dirt.first_dirty_offset, dirt.end_offset
        )
        assert every is not None and dirty is not None  # no scan limit
        return _last_batches(tr, sub, topic_id, partition), every, dirty

    last_batches, aborted, aborted_dirty = kv.transact_sync(read)

    key_map = KeyMap(settings.dedupe_buffer_size)
    dirty_entries = _entries_between(
        kv, sub, topic_id, partition, dirt.first_dirty_offset, dirt.end_offset
    )

    def dirty_batches() -> Iterator[RecordBatchView]:
        for entry in dirty_entries:
            yield from _entry_batches(store, entry)

    mapped = build_key_map(
        dirty_batches(), dirt.first_dirty_offset, dirt.end_offset, key_map, aborted_dirty
    )
    round_end = mapped.end_offset
    entries = _entries_between(kv, sub, topic_id, partition, dirt.log_start_offset, round_end)
    if not entries:
        return None

    # One pass over the partition's batches in offset order, cut into stretches.
    stretches: list[list[ChunkEntry]] = [[]]
    size = 0
    for entry in entries:
        if stretches[-1] and (
            size + entry.length > settings.stretch_bytes
            or len(stretches[-1]) == settings.stretch_entries
        ):
            stretches.append([])
            size = 0
        stretches[-1].append(entry)
        size += entry.length
    stretch_ends = [stretch[-1].last_offset for stretch in stretches]

    def all_batches() -> Iterator[RecordBatchView]:
        for stretch in stretches:
            for entry in stretch:
                yield from _entry_batches(store, entry)

    cleaned = clean(
        all_batches(),
        key_map,
        now_ms=now_ms,
        delete_retention_ms=rules.delete_retention_ms,
        upper_bound=dirt.end_offset,
        aborted=aborted,
        last_batch_of_producers=last_batches,
        stats=stats,
    )
    committed = before = after = 0

    def commit(index: int, results: list[CleanedBatch]) -> bool:
        nonlocal committed, before, after
        stretch = stretches[index]
        kept = [RecordBatchView(r.data) for r in results if r.data is not None]
        removed_markers = [
            r.source.base_offset for r in results if r.data is None and _is_abort_marker(r.source)
        ]
        object_key: str | None = None
        size = 0
        outputs: list[ChunkEntry] = []
        if kept:
            object_key = new_object_key(OUTPUT_PREFIX)
            parts, (location,) = encode_ingest_parts(
                [(topic_id, partition, [b.data for b in kept])]
            )
            outputs = _output_entries(object_key, kept, location.batch_starts, settings.entry_bytes)
            # Written from its pieces (the kept batches where they are), not joined first.
            store.put_parts_sync(object_key, parts, if_absent=True)
            size = sum(len(part) for part in parts)
        faults.point("cleaning.after_upload")
        result = kv.transact_sync(
            partial(
                cleaning_layer.commit_stretch,
                sub=sub,
                topic_id=topic_id,
                partition=partition,
                inputs=stretch,
                object_key=object_key,
                object_size=size,
                outputs=outputs,
                now_ms=now_ms,
                delete_delay_ms=settings.delete_delay_ms,
                removed_abort_markers=removed_markers,
            )
        )
        if not result.committed:
            logger.info("cleaning of partition %d stopped: %s", partition, result.reason)
            return False
        faults.point("cleaning.after_commit")
        committed += 1
        before += sum(e.length for e in stretch)
        after += sum(e.length for e in outputs)
        return True

    # Each stretch is committed once its last batch is cleaned (every entry holds one).
    for index, results in groupby(
        cleaned, key=lambda r: bisect_left(stretch_ends, r.source.base_offset)
    ):
        if not commit(index, list(results)):
            return None
    kv.transact_sync(
        partial(
            cleaning_layer.finish_round,
            sub=sub,
            topic_id=topic_id,
            partition=partition,
            end_offset=round_end,
        )
    )
    return committed, before, after
