"""The agent's share of compaction: jobs that merge small objects into large ones.

The metadata side (plans, claims, the re-pointing commit) is `metadata.compaction`.

Rules:

- Every `interval_ms` an agent plans and runs jobs until none is left: level-1 jobs (up
  to `max_inputs` ingest files into one object, once that many or the job's limits are
  reached or the oldest is twice `min_age_ms` old; an ingest file whose every entry
  holds `promote_entry_bytes` or more enters level 1 as it is instead, in the claim's
  transaction) first, then level-2 jobs (a partition's level-1 entries, from up to
  `l2_max_inputs` objects, into a run of a new object, which the partitions next to it
  in its topic, half due, share while their runs fit whole; once they hold
  `max_job_bytes`, come from `l2_max_inputs` objects or have waited `l2_max_wait_ms`, or
  the topic's retention span if that is shorter); at most `max_jobs` at once. Any agent
  runs any job: a plan claims its inputs in the metadata store, and a dead agent's
  claims expire after `lease_ms`. A plan reads and decides outside SQLite's writer lock:
  level 1 reads on a snapshot and then claims what is still free; level 2 is worked out
  on a snapshot and written only if what it read is unchanged (metadata.optimistic),
  else run again inside the transaction. Produce commits wait for the writer lock's
  longest holds, and a level-2 plan inside it held it up to 54 ms
  (integration/bench/README.md, 28th pass).
- A job reads its input entries (whole objects this agent has in its cache, otherwise
  ranged GETs, one per run of nearby entries of an object, `reads_at_once` of them under
  way at once), builds one object in the
  ingest-file format (one chunk per partition, the batches byte for byte in offset
  order), uploads it if-absent under "compacted/", and only then commits. Reading,
  building and uploading run in a worker process at a lower priority (broker.workers;
  `workers="process"`, the agent's default) or in a worker thread of the agent
  (`workers="thread"`); the worker's CPU time is the job's. With --compaction-process
  all of this class runs in a process of the agent's own (broker.compactor), the
  agent's "agent" being that process's view of it (its cache empty). A worker process is given
  the cached inputs only when the store is remote: a local folder's are in the page
  cache, and copying them to the worker would cost the agent more than the read.
- With a pace for the workers' large writes (--compaction-write-bytes-per-s), a
  level-1 job whose oldest input waited longer than `unpaced_after_ms` is written
  unpaced (storage.objectstore.unpaced), and so is every job after it until a level-1
  job's inputs are younger: a pace never leaves compaction behind for good.
- A job reads an input the agent's disk cache holds (storage.disk_cache) from there:
  the ingest files the flushes left there (broker.ingest), the inputs of level-2 jobs
  before it. A level-2 job GETs any other input whole, once, into that folder, which
  then keeps it, rather than a range of its own partitions' entries: the jobs of the
  input's other partitions read it from the disk. When each group of partitions' job
  read its own range of every input (an ingest file holds all the flush's partitions)
  the agent made 1,106 GETs per GB produced on S3; with these reads, 27
  (integration/bench/README.md, 53rd and 54th passes). Level-1 jobs never fill the
  folder: they take their inputs whole, once.
- Every input entry's bytes are walked batch by batch before the upload: the batches
  must hold exactly the entry's offsets, or the job fails and nothing is committed.
- An output not committed within half of `orphan_min_age_ms` after its upload began is
  never committed (the orphan sweep could have deleted it): it is recorded dead at once,
  as is the output of a job whose commit found an input changed. A dropped job ends the
  pass: the next one plans from what changed.
- A failure (the object store, the metadata store, an entry whose bytes are not what it
  says) is logged and ends the pass; the job's claims are left to expire, so that its
  inputs wait `lease_ms` before they are tried again while later passes plan others (an
  input that cannot be read never blocks compaction). Killed anywhere, a job leaves
  claims that expire, an upload the orphan sweep deletes, or a committed job whose
  inputs garbage collection deletes after the delete delay: never a lost record.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio

from broker import faults
from broker.context import JobAgent
from broker.topic_configs import cleanup_policies
from metadata import compaction as compaction_layer
from metadata import keys
from metadata import topics as topics_layer
from metadata.compaction import L1Selection, Limits, Plan
from metadata.kv import OptimisticCounts, Transaction
from metadata.log import ChunkEntry
from protocol.records import iter_batches
from storage.cache import ObjectCache
from storage.disk_cache import DiskCache, read_spans, temporary_path, write_whole
from storage.ingest import encode_ingest_parts, new_object_key
from storage.objectstore import ObjectStore, unpaced

if TYPE_CHECKING:
    from broker.workers import WorkerPool

logger = logging.getLogger(__name__)

OUTPUT_PREFIX = "compacted/"
# Entries of one object closer than this are read with one GET (the gap is read too).
READ_GAP = 64 * 1024
# Level-1 selections one plan makes at most while each finds only objects to promote.
PROMOTING_SELECTIONS = 8

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    enabled: bool = True
    interval_ms: int = 5_000
    min_age_ms: int = 30_000
    # With a pace for the workers' writes: a level-1 job whose oldest input waited longer
    # is written unpaced, and so are the jobs after it until a level-1 job's inputs are
    # younger (compaction is behind). None: no pace.
    unpaced_after_ms: int | None = None
    max_inputs: int = 32
    max_job_bytes: int = 64 * 1024 * 1024
    max_entries: int = 2_000
    entry_bytes: int = 256 * 1024
    promote_entry_bytes: int = 128 * 1024  # 0: never (metadata.compaction.promote_l1)
    max_jobs: int = 1
    reads_at_once: int = 1  # a job's GETs under way at once
    workers: str = "thread"  # or "process": the agent's pool (given to Compaction)
    lease_ms: int = 120_000
    retention_span_percent: int = 5
    l2_max_inputs: int = 256
    l2_max_wait_ms: int = 600_000
    cleaner_enabled: bool = True  # compacted topics' level 2 is their cleaner's
    # Job commits worked out on a snapshot (metadata.optimistic): where compaction has a
    # process of its own, whose interpreter the extra work does not take from requests.
    commit_on_snapshot: bool = False
    # From the object lifecycle.
    delete_delay_ms: int = 60_000
    orphan_min_age_ms: int = 3_600_000

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_inputs,
            self.max_job_bytes,
            self.max_entries,
            self.l2_max_inputs,
            self.promote_entry_bytes,
        )


@dataclass(slots=True)
class CompactionStats:
    passes: int = 0
    l1_jobs: int = 0  # committed
    l2_jobs: int = 0
    l1_dropped: int = 0  # an input changed before the commit
    # Level-0 objects that entered level 1 as they were, every entry already of
    # promote_entry_bytes or more (metadata.compaction.promote_l1): no bytes written.
    l1_promoted: int = 0
    l2_dropped: int = 0
    failures: int = 0
    bytes_read: int = 0  # GET from the store, gaps included
    bytes_cached: int = 0  # of inputs still in this agent's cache
    bytes_from_disk: int = 0  # of inputs in this agent's disk cache (level 2)
    bytes_written: int = 0
    entries_replaced: int = 0
    entries_written: int = 0
    cpu_seconds: float = 0.0  # of the jobs' workers
    unpaced_jobs: int = 0  # written at the disk's pace: compaction was behind
    # Level-2 plans and job commits worked out on a snapshot that had changed by their
    # check (or that read their own writes), run again under the lock.
    l2_plans_rerun: int = 0
    commits_rerun: int = 0
    commits_on_snapshot: int = 0  # applied as worked out on a snapshot (commit_on_snapshot)
    # Level-2 plans worked out again on a new snapshot after a change (not under the lock).
    l2_plans_retried: int = 0


class CompactionAgent(JobAgent, Protocol):
    """What compaction needs of its agent: its object and disk caches too."""

    @property
    def cache(self) -> ObjectCache: ...

    # Its disk cache (storage.disk_cache), or None.
    disk_cache: DiskCache | None


@dataclass(frozen=True, slots=True)
class Spool:
    """A job's use of the agent's disk cache: the inputs it holds (object key -> file),
    and (`fill`) the folder the others are written into whole, for the cache to adopt."""

    kept: dict[str, str]
    directory: str
    fill: bool = True  # else the others are read in ranges, as without a disk cache


@dataclass(frozen=True, slots=True)
class _Built:
    """An uploaded output: its size, where each partition's chunk starts, and the cost."""

    size: int
    chunk_starts: list[int]
    bytes_read: int  # GET from the store, gaps included
    bytes_cached: int  # taken from objects in the cache
    cpu_seconds: float
    bytes_from_disk: int = 0  # read from the disk cache's files
    # Inputs GET whole and written for the disk cache to adopt: (object key, file, size).
    spooled: tuple[tuple[str, str, int], ...] = ()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read_spans(entries: list[ChunkEntry]) -> list[tuple[int, int]]:
    """[start, end) ranges covering an object's entries, nearby ones together."""
    spans: list[tuple[int, int]] = []
    for entry in sorted(entries, key=lambda e: e.start):
        end = entry.start + entry.length
        if spans and entry.start - spans[-1][1] <= READ_GAP:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((entry.start, end))
    return spans


def _batches(entry: ChunkEntry, data: memoryview) -> list[memoryview]:
    """The entry's batches, which must hold exactly its offsets."""
    batches = []
    offsets = 0
    for view in iter_batches(data):
        batches.append(view.data)
        offsets += view.last_offset_delta + 1
    if len(batches) != entry.batch_count or offsets != entry.last_offset - entry.base_offset + 1:
        raise ValueError(
            f"{entry.object_key} [{entry.start}, +{entry.length}) holds {len(batches)} batches "
            f"of {offsets} offsets, not the entry's {entry.batch_count} of offsets "
            f"{entry.base_offset}-{entry.last_offset}"
        )
    return batches


def _run_all(
    call: Callable[..., T], args: Sequence[tuple[Any, ...]], at_once: int
) -> tuple[list[T], float]:
    """`call(*each)` for each of `args`, in their order, `at_once` at a time; and the CPU
    seconds of the threads that ran them other than the caller's. Each runs in a copy of
    the caller's context, as the caller's own would (broker.costs' charges). A failure is
    raised once no call runs any more."""
    if at_once <= 1 or len(args) <= 1:
        return [call(*each) for each in args], 0.0
    context = contextvars.copy_context()

    def run(each: tuple[Any, ...]) -> tuple[T, float]:
        started = time.thread_time()
        result = context.copy().run(call, *each)
        return result, time.thread_time() - started

    with concurrent.futures.ThreadPoolExecutor(min(at_once, len(args))) as pool:
        got = list(pool.map(run, args))  # on a failure, the block waits for the others
    return [result for result, _cpu in got], sum(cpu for _result, cpu in got)


def _get_all(
    store: ObjectStore, spans: list[tuple[str, int, int]], at_once: int
) -> tuple[list[memoryview], float]:
    """The spans' bytes, in their order, read `at_once` at a time (`_run_all`)."""
    return _run_all(store.get_view_sync, spans, at_once)


def _spool_all(
    store: ObjectStore, object_keys: list[str], directory: str, at_once: int
) -> tuple[list[tuple[str, str, int]], float]:
    """Each object GET whole into a file of its own in `directory`, `at_once` at a time:
    (object key, file, size) in their order, and the CPU seconds as `_run_all`'s. On a
    failure no file is left."""
    paths = [temporary_path(directory, key) for key in object_keys]
    try:
        sizes, cpu = _run_all(
            partial(write_whole, store), list(zip(object_keys, paths, strict=True)), at_once
        )
    except BaseException:
        _unlink_all(paths)
        raise
    return list(zip(object_keys, paths, sizes, strict=True)), cpu


def _adopt_all(disk: DiskCache, spooled: Iterable[tuple[str, str, int]]) -> None:
    for object_key, path, size in spooled:
        disk.adopt(object_key, path, size)


def _unlink_all(paths: Iterable[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _picklable(data: bytes | memoryview) -> bytes:
    """The bytes of a cached object, without a copy where it is a view of bytes whole
    (an S3 store's get_view)."""
    if isinstance(data, memoryview):
        whole = data.obj
        if isinstance(whole, bytes) and len(whole) == data.nbytes:
            return whole
        return bytes(data)
    return data


def build_output(
    store: ObjectStore,
    plan: Plan,
    cached: Mapping[str, bytes | memoryview],
    output_key: str,
    paced: bool = True,
    reads_at_once: int = 1,
    spool: Spool | None = None,
) -> _Built:
    """Read the plan's entries, `reads_at_once` GETs at a time (with a `spool`: from the
    files it holds, and the other inputs GET whole into files for it), and write its
    output object (`paced`: no faster than the store's pace for large writes, if it has
    one); in a worker thread or process. A job that fails leaves no file it wrote."""
    started = time.thread_time()
    by_object: dict[str, list[ChunkEntry]] = {}
    for e in plan.entries:
        by_object.setdefault(e.entry.object_key, []).append(e.entry)
    kept = spool.kept if spool is not None else {}
    spooled: list[tuple[str, str, int]] = []
    spool_cpu = 0.0
    if spool is not None and spool.fill:
        wholes = [key for key in by_object if key not in cached and key not in kept]
        spooled, spool_cpu = _spool_all(store, wholes, spool.directory, reads_at_once)
    files = {**kept, **{key: path for key, path, _size in spooled}}
    try:
        size, chunk_starts, read = _build_output(
            store, plan, by_object, cached, files, output_key, paced, reads_at_once
        )
    except BaseException:
        _unlink_all(path for _key, path, _size in spooled)
        raise
    return _Built(
        size,
        chunk_starts,
        read.store + sum(size for _key, _path, size in spooled),
        read.cached,
        time.thread_time() - started + read.readers_cpu + spool_cpu,
        sum(n for key, n in read.by_file.items() if key in kept),
        tuple(spooled),
    )


@dataclass(slots=True)
class _Read:
    """Where a job's bytes came from."""

    store: int = 0  # ranged GETs, gaps included
    cached: int = 0  # objects in the memory cache
    by_file: dict[str, int] = field(default_factory=dict)  # object key -> bytes of its file
    readers_cpu: float = 0.0  # of the threads that read ranges, other than the caller's


def _build_output(
    store: ObjectStore,
    plan: Plan,
    by_object: dict[str, list[ChunkEntry]],
    cached: Mapping[str, bytes | memoryview],
    files: Mapping[str, str],
    output_key: str,
    paced: bool,
    reads_at_once: int,
) -> tuple[int, list[int], _Read]:
    """build_output's reads and upload, the inputs taken from `cached`, else from
    `files` (object key -> a file of the whole object), else with ranged GETs: the
    output's size, where each partition's chunk starts in it, and the reads."""
    read = _Read()
    pieces: dict[tuple[str, int], memoryview] = {}  # (object, entry start) -> its bytes

    def cut(object_key: str, start: int, end: int, data: memoryview) -> None:
        for entry in by_object[object_key]:
            if start <= entry.start < end:
                at = entry.start - start
                pieces[(object_key, entry.start)] = data[at : at + entry.length]

    spans: list[tuple[str, int, int]] = []
    for object_key, entries in by_object.items():
        whole = cached.get(object_key)
        if whole is not None:
            for entry in entries:
                pieces[(object_key, entry.start)] = memoryview(whole)[
                    entry.start : entry.start + entry.length
                ]
                read.cached += entry.length
            continue
        object_spans = _read_spans(entries)
        path = files.get(object_key)
        from_file = read_spans(path, object_spans) if path is not None else None
        if from_file is None:  # none, or gone from the disk since: a GET of each range
            spans += ((object_key, start, end) for start, end in object_spans)
            continue
        for (start, end), data in zip(object_spans, from_file, strict=True):
            cut(object_key, start, end, memoryview(data))
        read.by_file[object_key] = sum(len(data) for data in from_file)
    # The job holds every piece until its output is written either way: reading several
    # at once holds no more, and waits one GET's latency per `reads_at_once` spans.
    views, read.readers_cpu = _get_all(store, spans, reads_at_once)
    for (object_key, start, end), view in zip(spans, views, strict=True):
        read.store += len(view)
        cut(object_key, start, end, view)
    chunks = []
    for topic_id, partition, entries in plan.partitions():
        batches: list[bytes | memoryview] = []
        for entry in entries:
            piece = pieces[(entry.object_key, entry.start)]
            if len(piece) != entry.length:
                raise ValueError(f"{entry.object_key} ends inside [{entry.start}, +{entry.length})")
            batches += _batches(entry, piece)
        chunks.append((topic_id, partition, batches))
    # Written from its pieces: the batches go from the inputs (mapped) to the file's
    # buffer without a joined copy of the whole output in between.
    parts, locations = encode_ingest_parts(chunks)
    with contextlib.nullcontext() if paced else unpaced():
        store.put_parts_sync(output_key, parts, if_absent=True)
    return sum(len(part) for part in parts), [loc.start for loc in locations], read


def _prepare_commit(
    sub: keys.Subspace,
    plan: Plan,
    output_key: str,
    size: int,
    chunk_starts: list[int],
    entry_bytes: int,
) -> compaction_layer.PreparedCommit:
    """The output's entries and its commit, worked out before the transaction."""
    outputs = compaction_layer.output_entries(plan, output_key, chunk_starts, entry_bytes)
    return compaction_layer.prepare_commit(sub, plan, output_key, size, outputs)


class Compaction:
    def __init__(
        self,
        agent: CompactionAgent,
        settings: CompactionSettings,
        pool: WorkerPool | None = None,
    ) -> None:
        if (pool is None) != (settings.workers == "thread"):
            raise ValueError(f"compaction workers {settings.workers!r} with pool {pool!r}")
        self._agent = agent
        self.settings = settings
        self._pool = pool
        self._slots = anyio.Semaphore(max(1, settings.max_jobs))
        self._threads = anyio.CapacityLimiter(max(1, settings.max_jobs))
        self._l2_after: tuple[bytes, int] | None = None  # the partition planned last
        self._l2_plans = OptimisticCounts()
        self._behind = False  # the last level-1 job's oldest input waited too long
        self._commits = OptimisticCounts()
        self.stats = CompactionStats()

    async def run(self) -> None:
        """Passes for the life of the agent (in its root task group), if enabled."""
        if not self.settings.enabled:
            return
        while True:
            await anyio.sleep(self.settings.interval_ms / 1000)
            try:
                await self.run_pass()
            except Exception as exc:  # the metadata store failed: next time
                logger.warning("compaction pass failed, will try again: %s", exc)

    async def run_pass(self) -> int:
        """Plan and run jobs until none is left (or one fails or is dropped); the jobs
        committed."""
        spans, cleaned = await self._spans()
        committed = 0
        failed = False  # or dropped

        async def job(plan: Plan) -> None:
            nonlocal committed, failed
            try:
                if await self.run_job(plan):
                    committed += 1
                else:
                    failed = True  # dropped: plan again in the next pass
            except Exception as exc:  # its claims expire: a back-off for its inputs
                failed = True
                self.stats.failures += 1
                logger.warning("compaction job of %d objects failed: %s", len(plan.input_keys), exc)
            finally:
                self._slots.release()

        async with anyio.create_task_group() as tg:
            while not failed:
                await self._slots.acquire()
                try:
                    plan = await self._plan(spans, cleaned)
                except BaseException:
                    self._slots.release()
                    raise
                if plan is None or failed:
                    self._slots.release()
                    if plan is not None:
                        await self._release(plan)
                    break
                tg.start_soon(job, plan)
        self.stats.passes += 1
        return committed

    async def _spans(self) -> tuple[dict[bytes, int], set[bytes]]:
        """Per topic with time retention, the span of timestamps a level-2 object may cover;
        and the compacted topics, whose level 2 is their cleaner's."""
        agent = self._agent
        topics = await agent.kv.read(lambda tr: topics_layer.list_topics(tr, agent.sub))
        spans = {}
        cleaned = set()
        for topic in topics:
            policy = cleanup_policies(agent.topic_config(topic, "cleanup.policy"))
            retention_ms = int(agent.topic_config(topic, "retention.ms") or -1)
            if "delete" in policy and retention_ms >= 0:
                spans[topic.topic_id] = retention_ms * self.settings.retention_span_percent // 100
            if "compact" in policy and self.settings.cleaner_enabled:
                cleaned.add(topic.topic_id)
        return spans, cleaned

    async def _plan(self, spans: dict[bytes, int], cleaned: set[bytes]) -> Plan | None:
        agent, s = self._agent, self.settings
        now, node_id = _now_ms(), agent.node_id
        # Read what to take without the write lock (produce commits wait for it), then
        # claim it in a short transaction; objects promoted as they are (no job) leave
        # room for the next selection to find more.
        plan: Plan | None = None
        for _ in range(PROMOTING_SELECTIONS):
            selection = await agent.kv.read(
                lambda tr: compaction_layer.select_l1(tr, agent.sub, now, s.min_age_ms, s.limits)
            )
            if not (selection.chosen or selection.dropped or selection.promoted):
                break
            if selection.chosen:
                await self._start_workers()
            promoted, plan = await agent.kv.transact(
                partial(self._claim_l1, selection=selection, node_id=node_id, now=now)
            )
            self.stats.l1_promoted += promoted
            if plan is not None or not promoted:
                break
        if plan is None:
            after = self._l2_after
            # Worked out on a snapshot: the writer lock is held only to check what the
            # plan read and to write its claims (metadata.optimistic).
            plan = await agent.kv.transact_optimistic(
                lambda tr: compaction_layer.plan_l2(
                    tr,
                    agent.sub,
                    node_id,
                    now,
                    s.limits,
                    s.lease_ms,
                    spans,
                    cleaned,
                    max_wait_ms=s.l2_max_wait_ms,
                    after=after,
                ),
                self._l2_plans,
            )
            self.stats.l2_plans_rerun = self._l2_plans.changed + self._l2_plans.overlapped
            self.stats.l2_plans_retried = self._l2_plans.retried
            if plan is not None and plan.level_one_rows:
                self._l2_after = plan.level_one_rows[-1][:2]  # the next plan starts after it
        return plan

    def _claim_l1(
        self, tr: Transaction, *, selection: L1Selection, node_id: int, now: int
    ) -> tuple[int, Plan | None]:
        sub = self._agent.sub
        promoted = compaction_layer.promote_l1(tr, sub, selection, now)
        plan = compaction_layer.claim_l1(tr, sub, selection, node_id, now, self.settings.lease_ms)
        return promoted, plan

    async def _start_workers(self) -> None:
        """Start the worker processes once there is work (an agent that never compacts
        has none), before the claim: level-1 jobs do not hold their inputs while they
        start. (A level-2 job found first starts them itself.)"""
        if self._pool is None or self._pool.started:
            return
        try:
            await self._pool.warm()
        except Exception as exc:  # the first job tries again
            logger.warning("compaction's worker processes did not start: %s", exc)

    async def _release(self, plan: Plan) -> None:
        agent = self._agent
        node_id = agent.node_id
        try:
            await agent.kv.transact(
                lambda tr: compaction_layer.release(tr, agent.sub, plan, node_id)
            )
        except Exception as exc:  # the claims expire by themselves
            logger.warning("giving up a compaction job's claims failed: %s", exc)

    def _paced(self, plan: Plan, now_ms: int | None = None) -> bool:
        """Whether the plan's output is written at the store's pace: not once a level-1
        job's oldest input has waited longer than `unpaced_after_ms`, nor any job after
        it until a level-1 job's inputs are younger again (a level-2 job's inputs are
        meant to wait; the level-1 jobs tell whether compaction keeps up)."""
        if self.settings.unpaced_after_ms is None:
            return True
        if plan.level == 1 and plan.queued:
            oldest = min(created_ms for created_ms, _key in plan.queued)
            waited = (_now_ms() if now_ms is None else now_ms) - oldest
            self._behind = waited > self.settings.unpaced_after_ms
        return not self._behind

    async def run_job(self, plan: Plan) -> bool:
        """Read, build, upload and commit one planned job; whether it was committed."""
        agent, s = self._agent, self.settings
        faults.point("compaction.after_plan")
        cached = {
            key: data
            for key in plan.input_keys
            if key in agent.cache and (data := agent.cache.get(key)) is not None
        }
        output_key = new_object_key(OUTPUT_PREFIX)
        disk = agent.disk_cache
        spool = None
        if disk is not None:
            # A worker process reads an input from the disk rather than be sent it from
            # memory (a copy through a pipe costs the agent's process more than the
            # worker's read of the file); the agent's own threads read memory first.
            wanted = [k for k in plan.input_keys if self._pool is not None or k not in cached]
            kept = {key: path for key in wanted if (path := disk.path_of(key))}
            # Level 1's inputs are ingest files, taken whole by the one job: read from
            # the disk where the flush left them there, never filled into it.
            spool = Spool(kept, disk.directory, fill=plan.level == compaction_layer.L2)
        paced = self._paced(plan)
        if not paced:
            self.stats.unpaced_jobs += 1
        upload_began = anyio.current_time()
        built: _Built
        if self._pool is not None:
            from broker.workers import add_spent

            if not self._pool.spec.remote:
                cached = {}
            else:  # sent to the worker process: a view is not picklable, bytes are
                on_disk = spool.kept if spool is not None else {}
                cached = {k: _picklable(v) for k, v in cached.items() if k not in on_disk}
            built, spent = await self._pool.run(
                build_output, plan, cached, output_key, paced, s.reads_at_once, spool
            )
            add_spent(agent.store, spent)
        else:
            built = await anyio.to_thread.run_sync(
                partial(
                    build_output,
                    agent.store,
                    plan,
                    cached,
                    output_key,
                    paced,
                    s.reads_at_once,
                    spool,
                ),
                limiter=self._threads,
            )
        if disk is not None and built.spooled:
            await anyio.to_thread.run_sync(_adopt_all, disk, built.spooled)
        self.stats.bytes_read += built.bytes_read
        self.stats.bytes_cached += built.bytes_cached
        self.stats.bytes_from_disk += built.bytes_from_disk
        self.stats.bytes_written += built.size
        self.stats.cpu_seconds += built.cpu_seconds
        faults.point("compaction.after_upload")
        if anyio.current_time() - upload_began > s.orphan_min_age_ms / 2000:
            logger.warning("not committing compaction output %s: too late", output_key)
            await agent.kv.transact(
                partial(
                    compaction_layer.discard_output,
                    sub=agent.sub,
                    object_key=output_key,
                    size=built.size,
                    level=plan.level,
                    now_ms=_now_ms(),
                )
            )
            await self._release(plan)
            self._count_dropped(plan)
            return False
        # The commit's keys and values, worked out in a thread: not on the event loop,
        # and not inside the transaction (SQLite's writer lock held meanwhile).
        prepared = await anyio.to_thread.run_sync(
            partial(
                _prepare_commit,
                agent.sub,
                plan,
                output_key,
                built.size,
                built.chunk_starts,
                s.entry_bytes,
            )
        )
        commit = partial(
            compaction_layer.commit_prepared,
            sub=agent.sub,
            prepared=prepared,
            node_id=agent.node_id,
            now_ms=_now_ms(),
            delete_delay_ms=s.delete_delay_ms,
        )
        if s.commit_on_snapshot:
            # SQLite's writer lock held to check and write, not to compare thousands of
            # entries meanwhile. Not in the agent's process: there the work twice over
            # cost the requests more than the shorter holds saved them (bench README,
            # twenty-ninth pass).
            result = await agent.kv.transact_optimistic(commit, self._commits)
            self.stats.commits_rerun = self._commits.changed + self._commits.overlapped
            self.stats.commits_on_snapshot = self._commits.applied
        else:
            result = await agent.kv.transact(commit)
        faults.point("compaction.after_commit")
        if not result.committed:
            logger.info("compaction job dropped: %s", result.reason)
            self._count_dropped(plan)
            return False
        if plan.level == compaction_layer.L1:
            self.stats.l1_jobs += 1
        else:
            self.stats.l2_jobs += 1
        self.stats.entries_replaced += len(plan.entries)
        self.stats.entries_written += len(prepared.outputs)
        return True

    def close(self) -> None:
        """Stop the worker processes (a job still running there is abandoned)."""
        if self._pool is not None:
            self._pool.close()

    def _count_dropped(self, plan: Plan) -> None:
        if plan.level == compaction_layer.L1:
            self.stats.l1_dropped += 1
        else:
            self.stats.l2_dropped += 1
