"""The agent's share of the object lifecycle: retention, garbage collection, the orphan
sweep. The metadata side of each step is `metadata.lifecycle`.

Rules:

- Each job runs on one agent at a time, the holder of its lease (`metadata.leases`);
  another agent takes it over when the holder stops renewing. A job's every effect is a
  metadata transaction that checks what it changes, so two agents running it at once
  would only waste work.
- Retention, every `log_retention_check_interval_ms`: for each partition of a topic whose
  cleanup.policy holds "delete", the entries past retention.ms or retention.bytes are
  dropped (Kafka's semantics, see `metadata.lifecycle.apply_retention`) and the log
  start offset moves; entries below the log start offset (DeleteRecords) are dropped for
  every topic.
- Garbage collection, a few times per delete delay: the entries of deleted topics are
  dropped, then every object whose delete delay is over is deleted from the store and
  forgotten. A store error leaves the object queued for the next pass.
- The orphan sweep, every `orphan_sweep_interval_ms`: objects under the prefixes bucketlog
  writes that are older than `orphan_min_age_ms` and that no metadata names are deleted
  (uploads whose commit never came). The produce pipeline never commits an object older
  than half that age, so an object the sweep deletes can never be committed afterwards.
  A journal object (lightning topics) is an orphan only once its sequence has passed its
  number: one still waiting to be sequenced holds answered records.
- Nothing referenced is ever deleted: only queued objects and orphans are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import anyio

from broker import faults
from broker.compaction import OUTPUT_PREFIX
from broker.context import JobAgent
from broker.topic_configs import cleanup_policies
from metadata import journal as journal_layer
from metadata import leases
from metadata import lifecycle as lifecycle_layer
from metadata import topics as topics_layer
from storage.ingest import INGEST_PREFIX
from storage.objectstore import ObjectInfo

logger = logging.getLogger(__name__)

# The prefixes of the objects bucketlog writes: ingest files (storage.ingest.new_object_key)
# and compaction outputs.
OBJECT_PREFIXES = (INGEST_PREFIX, OUTPUT_PREFIX)
SWEEP_BATCH = 500


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    retention_check_interval_ms: int = 300_000
    delete_delay_ms: int = 60_000
    orphan_sweep_interval_ms: int = 600_000
    orphan_min_age_ms: int = 3_600_000

    @property
    def gc_interval_s(self) -> float:
        """Queued objects are looked at a few times per delete delay."""
        return max(0.2, min(10.0, self.delete_delay_ms / 4000))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _limit(value: str) -> int:
    """A retention limit from its config value: -1 (or any negative) keeps everything."""
    number = int(value)
    return lifecycle_layer.NO_LIMIT if number < 0 else number


class Lifecycle:
    def __init__(
        self,
        agent: JobAgent,
        settings: LifecycleSettings,
        *,
        forget_cached: Callable[[str], None] = lambda key: None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._agent = agent
        self.settings = settings
        self._forget_cached = forget_cached
        self._clock = clock
        self.stats: dict[str, int] = {
            "retention_passes": 0,
            "entries_dropped": 0,
            "gc_passes": 0,
            "objects_deleted": 0,
            "bytes_deleted": 0,
            "delete_errors": 0,
            "orphan_sweeps": 0,
            "orphans_deleted": 0,
            "orphan_bytes_deleted": 0,
            # The cluster's tallies as of this agent's last GC pass (metadata.lifecycle).
            "cluster_objects": 0,
            "cluster_object_bytes": 0,
            "cluster_chunk_entries": 0,
        }

    async def run(self) -> None:
        """The three jobs, for the life of the agent (in its root task group)."""
        s = self.settings
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._every, s.retention_check_interval_ms / 1000, self.retention_pass)
            tg.start_soon(self._every, s.gc_interval_s, self.gc_pass)
            tg.start_soon(self._every, s.orphan_sweep_interval_ms / 1000, self.orphan_sweep)

    async def _every(self, interval_s: float, job: Callable[[], Awaitable[int]]) -> None:
        while True:
            await anyio.sleep(interval_s)
            try:
                await job()
            except Exception as exc:  # the store or the metadata store failed: next time
                logger.warning("%s failed, will try again: %s", job.__name__, exc)

    async def _claim(self, job: str, interval_s: float) -> bool:
        agent = self._agent
        now = self._clock()
        duration = int(max(3 * interval_s, 10.0) * 1000)
        node_id = agent.node_id
        return bool(
            await agent.kv.transact(
                lambda tr: leases.claim(tr, agent.sub, job, node_id, now, duration)
            )
        )

    # -- retention ----------------------------------------------------------------------

    async def retention_pass(self) -> int:
        """One pass over every partition; the entries dropped."""
        agent = self._agent
        if not await self._claim("retention", self.settings.retention_check_interval_ms / 1000):
            return 0
        topics = await agent.kv.read(lambda tr: topics_layer.list_topics(tr, agent.sub))
        dropped = 0
        for topic in topics:
            if "delete" in cleanup_policies(agent.topic_config(topic, "cleanup.policy")):
                retention_ms = _limit(agent.topic_config(topic, "retention.ms"))
                retention_bytes = _limit(agent.topic_config(topic, "retention.bytes"))
            else:  # compacted: only what DeleteRecords left below the log start
                retention_ms = retention_bytes = lifecycle_layer.NO_LIMIT
            for partition in range(topic.partitions):
                dropped += await self.retain(
                    topic.topic_id, partition, retention_ms, retention_bytes
                )
        self.stats["retention_passes"] += 1
        return dropped

    async def retain(
        self, topic_id: bytes, partition: int, retention_ms: int, retention_bytes: int
    ) -> int:
        """Retention of one partition, step after step; the entries dropped."""
        agent, delay = self._agent, self.settings.delete_delay_ms
        dropped = 0
        while True:
            step = await agent.kv.transact(
                partial(
                    lifecycle_layer.apply_retention,
                    sub=agent.sub,
                    topic_id=topic_id,
                    partition=partition,
                    now_ms=self._clock(),
                    retention_ms=retention_ms,
                    retention_bytes=retention_bytes,
                    delete_delay_ms=delay,
                )
            )
            dropped += step.dropped
            self.stats["entries_dropped"] += step.dropped
            if step.dropped:
                faults.point("retention.after_step")
            if not step.more:
                return dropped

    # -- garbage collection -------------------------------------------------------------

    async def gc_pass(self) -> int:
        """Drop deleted topics' entries, then delete the objects that are due; the
        objects deleted."""
        agent, delay = self._agent, self.settings.delete_delay_ms
        if not await self._claim("gc", self.settings.gc_interval_s):
            return 0
        for topic_id, partitions in await agent.kv.read(
            lambda tr: lifecycle_layer.deleted_topics(tr, agent.sub)
        ):
            while not await agent.kv.transact(
                partial(
                    lifecycle_layer.reap_deleted_topic,
                    sub=agent.sub,
                    topic_id=topic_id,
                    partitions=partitions,
                    now_ms=self._clock(),
                    delete_delay_ms=delay,
                )
            ):
                pass
        deleted = 0
        while True:
            due = await agent.kv.read(
                partial(
                    lifecycle_layer.due_dead_objects, sub=agent.sub, now_ms=self._clock(), limit=100
                )
            )
            if not due:
                break
            faults.point("gc.before_delete")
            gone = await self._delete_objects([d.object_key for d in due])
            faults.point("gc.after_delete")  # deleted from the store, still queued
            forgotten = [d for d in due if d.object_key in gone]
            if forgotten:
                await agent.kv.transact(
                    partial(lifecycle_layer.forget_deleted, sub=agent.sub, deleted=forgotten)
                )
            deleted += len(forgotten)
            self.stats["objects_deleted"] += len(forgotten)
            self.stats["bytes_deleted"] += sum(d.size for d in forgotten)
            if len(forgotten) < len(due):
                break  # the store failed some: the next pass tries them again
        self.stats["gc_passes"] += 1
        tallies = await agent.kv.read(partial(lifecycle_layer.read_tallies, sub=agent.sub))
        for name, value in tallies.items():
            self.stats[f"cluster_{name}"] = value
        return deleted

    async def _delete_objects(self, object_keys: list[str]) -> set[str]:
        """Delete the objects from the store in one delete_many (one DeleteObjects on S3;
        in a local folder, one hole punched for each run of adjacent packed objects); the
        keys that are gone."""
        try:
            failed = await self._agent.store.delete_many(object_keys)
        except Exception as exc:
            failed = dict.fromkeys(object_keys, exc)
        if failed:
            self.stats["delete_errors"] += len(failed)
            first, why = next(iter(failed.items()))
            logger.warning(
                "deleting %d of %d objects failed (%s: %s)",
                len(failed),
                len(object_keys),
                first,
                why,
            )
        gone = {key for key in object_keys if key not in failed}
        for key in gone:
            self._forget_cached(key)
        return gone

    # -- orphans ------------------------------------------------------------------------

    async def _done_journal_objects(self, cutoff: float) -> list[ObjectInfo]:
        """The journal objects older than `cutoff` whose number their sequence has passed
        (sequenced, or skipped as never answered with success). The others wait to be
        sequenced (broker.journal): answered records, never orphans, however old."""
        agent = self._agent
        listed = [
            (info, parsed)
            for info in await agent.store.list(journal_layer.PREFIX)
            if info.last_modified < cutoff
            and (parsed := journal_layer.parse_key(info.key)) is not None
        ]
        if not listed:
            return []
        nexts = await agent.kv.read(
            partial(
                journal_layer.next_of_each,
                sub=agent.sub,
                sequences={sequence for _info, (sequence, _n) in listed},
            )
        )
        return [info for info, (sequence, n) in listed if n < nexts[sequence]]

    async def orphan_sweep(self) -> int:
        """Delete the old objects that no metadata names; the orphans deleted."""
        agent = self._agent
        if not await self._claim("orphans", self.settings.orphan_sweep_interval_ms / 1000):
            return 0
        cutoff = self._clock() / 1000 - self.settings.orphan_min_age_ms / 1000
        old = [
            info
            for prefix in OBJECT_PREFIXES
            for info in await agent.store.list(prefix)
            if info.last_modified < cutoff
        ]
        old.extend(await self._done_journal_objects(cutoff))
        found = 0
        for i in range(0, len(old), SWEEP_BATCH):
            batch = old[i : i + SWEEP_BATCH]
            names = [info.key for info in batch]
            known = await agent.kv.read(
                partial(lifecycle_layer.known_objects, sub=agent.sub, object_keys=names)
            )
            orphans = [info for info in batch if info.key not in known]
            gone = await self._delete_objects([info.key for info in orphans])
            for info in orphans:
                if info.key in gone:
                    found += 1
                    self.stats["orphans_deleted"] += 1
                    self.stats["orphan_bytes_deleted"] += info.size
        if found:
            logger.info("deleted %d orphan objects (uploads whose commit never came)", found)
        self.stats["orphan_sweeps"] += 1
        return found
