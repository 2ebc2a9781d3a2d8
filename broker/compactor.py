"""Compaction in a process of its own beside the agent (`--compaction-process`).

Compaction's metadata work (reading its plans, working out its commits' keys and
values, running the transactions) is interpreter work. In the agent it takes turns with
the produce path for the GIL and the event loop, and on SQLite for the writer lock as
well: in the soak (integration/bench/README.md, twenty-eighth and twenty-ninth passes)
produce p99 was 41.5-50.5 ms with compaction in the agent, 30.0-41.0 with it in
another agent, 22.0 without it. In a process of its own it shares the cores and the
writer lock only.

Rules:

- The process is the agent's: started once the metadata holds compaction work (a
  level-0 object waiting, or a partition with level-1 entries; an agent that never
  compacts never starts it), watched every second, started again `RESTART_PAUSE_S`
  after it died, and ended with the agent (SIGTERM at close; PR_SET_PDEATHSIG when the
  agent is killed, as for compaction's worker processes).
- It runs `broker.compaction.Compaction` as the agent would (the same settings, its
  own worker processes for the builds), with its own connections to the metadata store
  and the object store, under the agent's node id (shared memory, set again by the
  agent every second, as its lease renewals may change it). Killed anywhere, it leaves
  what a killed agent's compaction leaves: claims that expire, an upload the orphan
  sweep deletes, or a committed job whose inputs garbage collection deletes.
- Its counters come back through a pipe once a second, when they moved: its compaction
  stats stand for the agent's (the stats file, /metrics), going on from those of the
  processes before it, and its object-store requests and metadata store counters
  (transactions; checkpoints, as its SQLite store runs them too) are added to the
  agent's, so that metrics and benchmarks count the same work wherever it runs.
- The agent's object cache is not the process's. With a remote store compaction would
  GET recent ingest files the agent still holds, so the option is on by default with a
  local folder only (whose reads come from the page cache either way).
- A fault point (broker.faults) reached in the process kills the agent too, as kill -9
  of the agent does.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from broker import faults, logformat
from broker.compaction import Compaction, CompactionSettings, CompactionStats
from broker.costs import AccountingStore, Ledger
from broker.workers import Spent, StoreSpec, WorkerPool, add_spent, moved, start_child
from metadata import compaction as compaction_layer
from metadata import keys, topics
from metadata.kv import KV, open_kv
from storage.cache import ObjectCache
from storage.disk_cache import DiskCache
from storage.objectstore import ObjectStore
from storage.threads import ThreadPool

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from broker.config import BrokerConfig
    from broker.context import JobAgent

logger = logging.getLogger(__name__)

WATCH_S = 1.0  # how often the agent looks at the process and takes its counters
RESTART_PAUSE_S = 5.0


def compaction_settings(config: BrokerConfig, *, apart: bool = False) -> CompactionSettings:
    """The config's settings (`apart`: for compaction's own process)."""
    return CompactionSettings(
        enabled=config.compaction,
        interval_ms=config.compaction_interval_ms,
        min_age_ms=config.resolved_compaction_min_age_ms,
        unpaced_after_ms=(
            config.compaction_unpaced_after_ms if config.compaction_write_bytes_per_s else None
        ),
        max_inputs=config.compaction_max_inputs,
        max_job_bytes=config.compaction_max_job_bytes,
        max_entries=config.compaction_max_entries,
        entry_bytes=config.compaction_entry_bytes,
        promote_entry_bytes=config.compaction_promote_entry_bytes,
        max_jobs=config.compaction_max_jobs,
        reads_at_once=config.compaction_reads_at_once,
        workers=config.compaction_workers,
        lease_ms=config.compaction_lease_ms,
        retention_span_percent=config.compaction_retention_span_percent,
        l2_max_inputs=config.compaction_l2_max_inputs,
        l2_max_wait_ms=config.compaction_l2_max_wait_ms,
        cleaner_enabled=config.log_cleaner_enable,
        delete_delay_ms=config.object_delete_delay_ms,
        orphan_min_age_ms=config.orphan_min_age_ms,
        commit_on_snapshot=apart,
    )


def new_compaction(agent: Any, config: BrokerConfig, *, apart: bool = False) -> Compaction:
    """Compaction with the config's settings and workers, for the agent or (`apart`) its
    process."""
    pool = None
    if config.compaction_workers == "process":
        spec = StoreSpec.of(config, blocking_calls=2, worker=True)
        pool = WorkerPool(spec, config.compaction_max_jobs, config.compaction_worker_nice)
    return Compaction(agent, compaction_settings(config, apart=apart), pool)


@dataclass(slots=True)
class ProcessStats:
    starts: int = 0
    exits: int = 0  # ended without the agent asking (killed, crashed)
    running: int = 0  # a gauge: 1 while it runs
    cpu_seconds: float = 0.0  # of the processes (their workers' are the jobs')


@dataclass(frozen=True, slots=True)
class _Report:
    """The process's compaction stats, and what it asked of the stores since the last."""

    stats: CompactionStats
    spent: Spent
    metadata: dict[str, int]
    cpu_seconds: float  # of the process, all its threads


class CompactionProcess:
    """The agent's side: starts, watches and ends the process, and takes its counters."""

    def __init__(self, agent: JobAgent, config: BrokerConfig, compaction: Compaction) -> None:
        self._agent = agent
        self._config = config
        self._compaction = compaction  # whose stats the process's stand for
        self._ended = CompactionStats()  # those of the processes that ended, summed
        self._ended_cpu = 0.0
        self._context = multiprocessing.get_context("spawn")
        self._node_id: Any = self._context.Value("q", -1, lock=False)  # a c_long, shared
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self.stats = ProcessStats()

    async def run(self) -> None:
        """For the life of the agent (in its root task group)."""
        pause = self._config.compaction_interval_ms / 1000  # RESTART_PAUSE_S once started
        while True:
            if self._process is None:
                await anyio.sleep(pause)
                try:
                    if self.stats.starts or await self._work_waits():
                        self._start()
                        pause = RESTART_PAUSE_S
                except Exception as exc:  # the metadata store, or no process to be had
                    logger.warning("compaction process not started, will try again: %s", exc)
                continue
            await anyio.sleep(WATCH_S)
            self._node_id.value = self._agent.node_id
            self._receive()
            if not self._process.is_alive():
                self._receive()
                self._ended = dataclasses.replace(self._compaction.stats)
                self._ended_cpu = self.stats.cpu_seconds
                self.stats.exits += 1
                self.stats.running = 0
                logger.warning(
                    "compaction process %s ended (exit code %s): starting it again in %.0f s",
                    self._process.pid,
                    self._process.exitcode,
                    RESTART_PAUSE_S,
                )
                self._drop()

    async def _work_waits(self) -> bool:
        agent = self._agent
        return await agent.kv.read(lambda tr: compaction_layer.has_work(tr, agent.sub))

    def _start(self) -> None:
        self._node_id.value = self._agent.node_id
        ours, theirs = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_main,
            args=(self._config, self._node_id, theirs, os.getpid(), logformat.configured),
            name="bucketlog-compaction",
        )
        process.start()
        theirs.close()  # the process's end: EOF here once it ends
        self._process, self._conn = process, ours
        self.stats.starts += 1
        self.stats.running = 1
        logger.info("compaction process %s started", process.pid)

    def _receive(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            while conn.poll():
                report: _Report = conn.recv()
                self._compaction.stats = _sum(self._ended, report.stats)
                self.stats.cpu_seconds = self._ended_cpu + report.cpu_seconds
                add_spent(self._agent.store, report.spent)
                counters = getattr(self._agent.kv, "stats", None)
                if isinstance(counters, dict):
                    for name, value in report.metadata.items():
                        counters[name] = counters.get(name, 0) + value
        except (EOFError, OSError):  # it ended: the watch sees it
            pass

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def close(self) -> None:
        """End the process (a job under way is abandoned, as by a killed agent)."""
        process = self._process
        if process is not None:
            process.terminate()
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
            self.stats.running = 0
            self._drop()


def _sum(a: CompactionStats, b: CompactionStats) -> CompactionStats:
    """Counters that go on from those of an earlier process (they never go down)."""
    return CompactionStats(
        **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)}
    )


# -- in the process ----------------------------------------------------------------------


class _Helper:
    """The agent as compaction in its process sees it (a JobAgent with a cache)."""

    def __init__(self, config: BrokerConfig, kv: KV, store: ObjectStore, node_id: Any) -> None:
        self.config = config
        self.kv = kv
        self.store = store
        self.sub = keys.cluster_subspace(config.cluster_name)
        self._node_id = node_id
        self.cache = ObjectCache(0)  # the agent's is in the agent
        self.disk_cache: DiskCache | None = None  # the agent's own

    @property
    def node_id(self) -> int:
        return int(self._node_id.value)

    def topic_config(self, topic: topics.Topic, name: str) -> str:
        return self.config.topic_config(topic, name)

    async def all_topics(self) -> list[topics.Topic]:
        return await self.kv.read(lambda tr: topics.list_topics(tr, self.sub))


def _main(
    config: BrokerConfig,
    node_id: Any,
    conn: Connection,
    agent_pid: int,
    log_setup: tuple[str, str],
) -> None:
    start_child(agent_pid)
    logformat.configure(*log_setup)
    faults.kill_agent_too(agent_pid)
    anyio.run(_serve, config, node_id, conn)


async def _serve(config: BrokerConfig, node_id: Any, conn: Connection) -> None:
    kv = open_kv(config.resolved_metadata_url, threads=ThreadPool)
    # Blocking calls: one per job at once (with thread workers; process workers open
    # the store themselves).
    spec = StoreSpec.of(config, blocking_calls=config.compaction_max_jobs, worker=True)
    store = AccountingStore(spec.open(), Ledger())
    compaction = new_compaction(_Helper(config, kv, store, node_id), config, apart=True)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(compaction.run)
            tg.start_soon(_report_loop, compaction, store, kv, conn)
    finally:
        compaction.close()
        await store.aclose()
        await kv.aclose()


async def _report_loop(
    compaction: Compaction, store: AccountingStore, kv: KV, conn: Connection
) -> None:
    """Every WATCH_S, what moved since the last report (counted from totals: a request
    recorded by a worker thread meanwhile is in the next one)."""
    store_stats: dict[str, int] = getattr(store.inner, "stats", {})
    metadata: dict[str, int] = getattr(kv, "stats", {})
    sent_stats = CompactionStats()
    sent_requests: dict[tuple[str, str], float] = {}
    sent_sizes: dict[tuple[str, str], float] = {}
    sent_store, sent_metadata = dict(store_stats), dict(metadata)
    while True:
        await anyio.sleep(WATCH_S)
        stats = dataclasses.replace(compaction.stats)
        requests, sizes = store.ledger.copy()
        store_now, metadata_now = dict(store_stats), dict(metadata)
        spent = Spent(
            moved(sent_requests, requests),
            moved(sent_sizes, sizes),
            moved(sent_store, store_now),
        )
        moved_metadata = moved(sent_metadata, metadata_now)
        if stats == sent_stats and not (
            spent.requests or spent.bytes or spent.stats or moved_metadata
        ):
            continue
        conn.send(_Report(stats, spent, moved_metadata, time.process_time()))
        sent_stats, sent_requests, sent_sizes = stats, requests, sizes
        sent_store, sent_metadata = store_now, metadata_now
