"""One agent: the stores it talks to and the little it remembers.

An agent keeps no partition state of its own. It caches topic metadata for a moment
(another agent may change it; every append re-checks in its commit), the list of live
agents (refreshed with its lease) and recently written objects.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import anyio

from broker import placement
from broker.authentication import Authentication
from broker.authorizer import AclAuthorizer
from broker.cleaning import Cleaning, CleaningSettings
from broker.compactor import CompactionProcess, new_compaction
from broker.config import BrokerConfig
from broker.costs import AccountingStore, Ledger
from broker.eventlog import EventLog
from broker.groups import GroupCoordinator
from broker.ingest import MAX_CONCURRENT_FLUSHES, IngestPipeline
from broker.journal import (
    SETTLE_S,
    JournalPipeline,
    JournalSweep,
    ProducerSequences,
    SweepSettings,
)
from broker.lifecycle import Lifecycle, LifecycleSettings
from broker.memory import RequestMemory
from broker.metrics import Meter
from broker.readahead import ReadAhead
from broker.ripcord import Snapshot
from broker.sync import Notifier, Promise
from broker.workers import StoreSpec
from broker.zones import HOME_RECHECK_SECONDS, HomeZones
from metadata import acls, cluster, keys, topics
from metadata import log as log_layer
from metadata.chunk_cache import ChunkCache
from metadata.cluster import Agent as AgentInfo
from metadata.homes import GROUP, TRANSACTION
from metadata.kv import KV, KVError, open_kv
from storage.cache import ObjectCache, RangeReader
from storage.disk_cache import DiskCache
from storage.hedge import HEDGE_THREADS, HedgedPuts
from storage.objectstore import ObjectStore
from storage.threads import ThreadPool

logger = logging.getLogger(__name__)

TOPIC_CACHE_SECONDS = 1.0
WATERMARK_POLL_SECONDS = 0.05
LIVE_AGENTS_SECONDS = 0.5
TRANSACTION_CHECK_SECONDS = 1.0
# How often the other live agents' ports are tried: one that refuses a connection has no
# process listening (killed, or stopped without deregistering) and is left out of the
# agents this one names, long before its lease runs out (`peer_probe_loop`).
PEER_PROBE_SECONDS = 0.25
PEER_PROBE_TIMEOUT_SECONDS = 0.2
# An agent about to name only other agents to a client (a zoned client that reached an
# agent outside its zone, or a coordinator elsewhere) tries their ports first unless
# they answered a probe this recently (`confirm_peers`): a client told only of an agent
# killed a moment ago has nowhere left to ask.
PEER_CONFIRM_SECONDS = 0.05
# How recent the view of the live agents must be for lightning partitions to be answered
# (Agent.view_fresh), at least; a new leader waits SETTLE_S - VIEW_FRESH_SECONDS longer.
VIEW_FRESH_SECONDS = 1.0
# How often the store's ACL version is read (with --authorizer): an ACL written through
# another agent takes effect here within this, plus one reload. One point read: about
# 30 us of SQLite every 0.5 s.
ACL_POLL_SECONDS = 0.5


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class _CachedTopic:
    topic: topics.Topic | None
    fetched_at: float


class Agent:
    def __init__(self, config: BrokerConfig, kv: KV, store: ObjectStore) -> None:
        self.config = config
        self.kv = kv
        self.store = store
        self.sub = keys.cluster_subspace(config.cluster_name)
        self.cache = ObjectCache(config.cache_bytes)
        disk_bytes = config.resolved_disk_cache_bytes
        self.disk_cache = (
            DiskCache(config.resolved_disk_cache_dir, disk_bytes) if disk_bytes > 0 else None
        )
        self.reader = RangeReader(store, self.cache, disk=self.disk_cache)
        # Entries read are used for half the delete delay at most: the objects they name
        # are kept at least that long after compaction or retention re-points them.
        self.chunks = ChunkCache(max_age_s=config.object_delete_delay_ms / 2000)
        self.read_ahead = ReadAhead(
            kv,
            self.sub,
            store,
            self.cache,
            self.chunks,
            topic_name=self.topic_name_of,
            disk=self.disk_cache,
        )
        self.reader.in_flight = self.read_ahead.in_flight
        self.notifier = Notifier()
        self.events = EventLog(logging.getLogger("broker.connection"))
        self.auth = Authentication.from_config(config)
        self.request_memory = RequestMemory(config.queued_max_request_bytes)
        self.meter = Meter(config.zone)
        percentile = config.resolved_put_hedge_percentile
        self.hedge = None if percentile is None else HedgedPuts(store, percentile=percentile)
        self.pipeline = IngestPipeline(
            kv,
            self.sub,
            store,
            self.cache,
            self.notifier,
            flush_interval_ms=config.resolved_flush_interval_ms,
            flush_bytes=config.resolved_flush_bytes,
            # An object the orphan sweep may delete must never be committed after.
            max_commit_delay_ms=config.orphan_min_age_ms // 2,
            flush_when_idle=config.is_local_store,
            hedge=self.hedge,
            meter=self.meter,
            topic_name=self.topic_name_of,
            chunks=self.chunks,
            disk=self.disk_cache,
        )
        self.journal = JournalPipeline(
            kv,
            self.sub,
            store,
            self.cache,
            self.notifier,
            lambda: self.node_id,
            flush_interval_ms=config.resolved_flush_interval_ms,
            flush_bytes=config.resolved_flush_bytes,
            files_per_sequence=config.journal_files_per_sequence,
            sequence_seconds=config.journal_sequence_ms / 1000,
            upload_limit_ms=config.journal_upload_limit_ms,
            hedge=self.hedge,
            meter=self.meter,
            topic_name=self.topic_name_of,
        )
        # A view of the live agents is current for this long (view_fresh): a second, or
        # two lease renewals where they are further apart.
        self.view_fresh_s = max(VIEW_FRESH_SECONDS, 2 * config.lease_renew_ms / 1000)
        self.journal_sweep = JournalSweep(
            kv,
            self.sub,
            store,
            self.notifier,
            self.journal,
            lambda: self.node_id,
            SweepSettings(
                interval_ms=config.journal_sweep_interval_ms,
                idle_ms=config.journal_idle_ms,
                upload_limit_ms=config.journal_upload_limit_ms,
            ),
        )
        self.producer_sequences = ProducerSequences(
            kv,
            self.sub,
            self.journal,
            live_view=lambda: tuple(a.node_id for a in self.live_agents()),
            others_drained=self.journal_sweep.others_drained,
            own_node_id=lambda: self.node_id,
            view_fresh=self.view_fresh,
            outage=self.in_outage,
            settle_s=self.view_fresh_s + SETTLE_S - VIEW_FRESH_SECONDS,
        )
        # The advertised endpoint of each listener, registered with the lease.
        self.endpoints = tuple((e.name, e.host, e.port) for e in config.advertised_endpoints)
        self.node_id = -1
        self.cluster_id = ""
        self.live: list[AgentInfo] = []
        self._live_read_at = 0.0
        self._refusing: set[tuple[int, str, int]] = set()  # (node id, host, port)
        self._probed_at = 0.0  # time.monotonic() when the last full probe round began
        # When the last try of each peer began, and whether it had an answer (refused or
        # accepted); the tries under way.
        self._peer_tried: dict[tuple[int, str, int], tuple[float, bool]] = {}
        self._probing: dict[tuple[int, str, int], Promise[None]] = {}
        # False while the metadata store is unreachable (a lease renewal failed); with
        # --ripcord the agent then answers from what it remembers (broker.ripcord).
        self.metadata_reachable = True
        self._lease_expires_ms = 0  # as last renewed, by this agent's clock
        self._topics_by_name: dict[str, _CachedTopic] = {}
        self._topics_by_id: dict[bytes, _CachedTopic] = {}
        self._watermarks: dict[tuple[bytes, int], int] = {}
        self.homes = HomeZones(kv, self.sub)
        self.consumer_group_settings = config.consumer_group_settings
        self.groups = GroupCoordinator.for_agent(self)
        # None: authorization is off and no request is checked (broker.access).
        self.authorizer: AclAuthorizer | None = (
            AclAuthorizer(
                config.super_users,
                allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found,
            )
            if config.authorizer
            else None
        )
        # One reload at a time: a slow one never puts older ACLs over a newer one's.
        self._acl_reload = anyio.Lock()
        self.lifecycle = Lifecycle(
            self,
            LifecycleSettings(
                retention_check_interval_ms=config.log_retention_check_interval_ms,
                delete_delay_ms=config.object_delete_delay_ms,
                orphan_sweep_interval_ms=config.orphan_sweep_interval_ms,
                orphan_min_age_ms=config.orphan_min_age_ms,
            ),
            forget_cached=self._forget_cached,
        )
        self.compaction = new_compaction(self, config)
        # With --compaction-process the passes run in a process of the agent's own, whose
        # stats stand for self.compaction's (broker.compactor).
        self.compaction_process = (
            CompactionProcess(self, config, self.compaction) if config.compacts_apart else None
        )
        self.cleaning = Cleaning(
            self,
            CleaningSettings(
                enabled=config.log_cleaner_enable,
                backoff_ms=config.log_cleaner_backoff_ms,
                dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
                stretch_bytes=config.compaction_max_job_bytes,
                stretch_entries=config.compaction_max_entries,
                entry_bytes=config.compaction_entry_bytes,
                delete_delay_ms=config.object_delete_delay_ms,
            ),
        )

    @classmethod
    def open(cls, config: BrokerConfig) -> Agent:
        store = StoreSpec.of(config, blocking_store_calls(config)).open()
        if config.inject_put_latency_ms or config.inject_get_latency_ms:
            _warn_injected_latency(config)
        if config.metrics_port:  # each request charged to topics (broker.costs)
            store = AccountingStore(store, Ledger())
        return cls(config, open_kv(config.resolved_metadata_url, threads=ThreadPool), store)

    def _forget_cached(self, object_key: str) -> None:
        """An object deleted from the store: its copies here go too."""
        self.cache.discard(object_key)
        if self.disk_cache is not None:
            self.disk_cache.discard(object_key)

    def topic_name_of(self, topic_id: bytes) -> str:
        """The topic's name as cached here (its id in hex if not cached: a deleted
        topic's objects, or one not seen yet)."""
        cached = self._topics_by_id.get(topic_id)
        if cached is None or cached.topic is None:
            return topic_id.hex()
        return cached.topic.name

    # -- lifecycle -------------------------------------------------------------------

    async def register(self) -> None:
        proposed = uuid.uuid4().bytes.hex()[:22]
        self.cluster_id = await self.kv.transact(
            lambda tr: cluster.ensure_cluster_id(tr, self.sub, proposed)
        )
        await self.renew_lease()

    async def renew_lease(self) -> None:
        cfg = self.config

        def txn(tr):  # type: ignore[no-untyped-def]
            # Each attempt reads the clock: a renewal retried while the store was busy
            # counts its lease from the attempt that commits, not from the first one.
            now = now_ms()
            node_id = cluster.register_agent(
                tr,
                self.sub,
                cfg.advertised,
                cfg.advertised_port,
                cfg.zone,
                now + cfg.lease_ms,
                self.endpoints,
            )
            return node_id, cluster.live_agents(tr, self.sub, now), now

        try:
            self.node_id, live, renewed_ms = await self.kv.transact(txn)
        except KVError:
            if self.metadata_reachable:
                self.metadata_reachable = False
                logger.warning(
                    "metadata store unreachable%s",
                    ": produces go to the journal (Ripcord)" if cfg.ripcord else "",
                )
            raise
        if not self.metadata_reachable:
            self.metadata_reachable = True
            logger.info("metadata store reachable again")
        if 0 < self._lease_expires_ms < renewed_ms:
            logger.warning(
                "lease renewed %d ms after it ran out: the other agents saw this one gone"
                " (renewals every %d ms, lease %d ms)",
                renewed_ms - self._lease_expires_ms,
                cfg.lease_renew_ms,
                cfg.lease_ms,
            )
        self._lease_expires_ms = renewed_ms + cfg.lease_ms
        self.live = sorted(live, key=lambda a: a.node_id)
        self._live_read_at = time.monotonic()

    async def reload_acls(self, *, if_changed: bool = True) -> None:
        """Load the ACLs into the authorizer; if_changed: only if the store's ACL version
        is not the one loaded (a point read)."""
        authorizer = self.authorizer
        if authorizer is None:
            return
        async with self._acl_reload:
            if if_changed:
                version = await self.kv.read(lambda tr: acls.version(tr, self.sub), quick=True)
                if version == authorizer.version:
                    return
            version, bindings = await self.kv.read(lambda tr: acls.load(tr, self.sub))
            authorizer.load(version, bindings)

    async def acl_loop(self) -> None:
        """Keep the authorizer's ACLs those of the store, ACL_POLL_SECONDS behind at most."""
        while True:
            await anyio.sleep(ACL_POLL_SECONDS)
            try:
                await self.reload_acls()
            except KVError as exc:  # the store is unreachable: the ACLs loaded stay
                self.store_failure("ACL reload failed: %s", exc)
            except Exception:
                logger.exception("ACL reload failed")

    async def deregister(self) -> None:
        if self.node_id >= 0:
            node_id = self.node_id
            await self.kv.transact(lambda tr: cluster.deregister_agent(tr, self.sub, node_id))

    async def lease_loop(self) -> None:
        """Renew the lease every lease_renew_ms, counted from when the last renewal began:
        a slow renewal does not put the next one off."""
        interval = self.config.lease_renew_ms / 1000
        due = time.monotonic()
        while True:
            now = time.monotonic()
            due = max(due + interval, now)  # at once after a renewal longer than the interval
            await anyio.sleep(due - now)
            try:
                await self.renew_lease()
            except KVError as exc:  # the metadata store is unavailable: an expected event
                self.store_failure("lease renewal failed: %s", exc)
            except Exception:
                logger.exception("lease renewal failed")

    async def watermark_loop(self) -> None:
        """Wake long-polling fetches when another agent appends to a partition they wait on."""
        while True:
            await anyio.sleep(WATERMARK_POLL_SECONDS)
            waited = [k for k in self.notifier.waited_keys() if isinstance(k, tuple)]
            if not waited:
                continue

            def read(tr, waited=waited):  # type: ignore[no-untyped-def]
                return [log_layer.get_partition(tr, self.sub, tid, p) for tid, p in waited]

            try:
                states = await self.kv.read(read)
            except KVError as exc:
                self.store_failure("watermark poll failed: %s", exc)
                continue
            except Exception:
                logger.exception("watermark poll failed")
                continue
            for key, state in zip(waited, states, strict=True):
                hwm = -1 if state is None else state.high_watermark
                if self._watermarks.get(key) != hwm:
                    self._watermarks[key] = hwm
                    self.notifier.notify(key)

    async def transaction_timeout_loop(self) -> None:
        """Abort the transactions this agent coordinates once they outlive their timeout."""
        from broker.transactions import abort_expired

        while True:
            await anyio.sleep(TRANSACTION_CHECK_SECONDS)
            try:
                await abort_expired(self, self.coordinated_transactions)
            except KVError as exc:
                self.store_failure("transaction timeout check failed: %s", exc)
            except Exception:
                logger.exception("transaction timeout check failed")

    def store_failure(self, message: str, exc: Exception) -> None:
        """Log a background loop's metadata store failure: a warning, or only a debug
        line while the store is known to be unreachable (said once, when found)."""
        level = logging.WARNING if self.metadata_reachable else logging.DEBUG
        logger.log(level, message, exc)

    async def aclose(self) -> None:
        self.compaction.close()
        if self.compaction_process is not None:
            self.compaction_process.close()
        await self.read_ahead.aclose()
        await self.store.aclose()
        await self.kv.aclose()

    # -- topics ----------------------------------------------------------------------

    def _remembered(self, cached: _CachedTopic | None) -> bool:
        """Whether a cached entry, however old, is to be used instead of the store: in
        Ripcord mode, while the store is unreachable."""
        return cached is not None and self.in_outage()

    async def topic(self, name: str, *, fresh: bool = False) -> topics.Topic | None:
        cached = self._topics_by_name.get(name)
        clock = time.monotonic()
        if not fresh and cached is not None and clock - cached.fetched_at < TOPIC_CACHE_SECONDS:
            return cached.topic
        if self._remembered(cached):
            assert cached is not None
            return cached.topic
        topic = await self.kv.read(lambda tr: topics.get_topic(tr, self.sub, name))
        self._cache_topic(name, topic, clock)
        return topic

    async def all_topics(self) -> list[topics.Topic]:
        if self.in_outage():
            return sorted(
                (c.topic for c in self._topics_by_name.values() if c.topic is not None),
                key=lambda t: t.name,
            )
        return await self.kv.read(lambda tr: topics.list_topics(tr, self.sub))

    def _cache_topic(self, name: str, topic: topics.Topic | None, clock: float) -> None:
        entry = _CachedTopic(topic, clock)
        self._topics_by_name[name] = entry
        if topic is not None:
            self._topics_by_id[topic.topic_id] = entry

    def forget_topic(self, name: str) -> None:
        cached = self._topics_by_name.pop(name, None)
        if cached is not None and cached.topic is not None:
            self._topics_by_id.pop(cached.topic.topic_id, None)

    def remember_topic(self, topic: topics.Topic) -> None:
        self._cache_topic(topic.name, topic, time.monotonic())

    async def topic_by_id(self, topic_id: bytes) -> topics.Topic | None:
        cached = self._topics_by_id.get(topic_id)
        if cached is not None and time.monotonic() - cached.fetched_at < TOPIC_CACHE_SECONDS:
            return cached.topic
        if self._remembered(cached):
            assert cached is not None
            return cached.topic
        topic = await self.kv.read(lambda tr: topics.get_topic_by_id(tr, self.sub, topic_id))
        if topic is not None:
            self.remember_topic(topic)
        return topic

    def topic_config(self, topic: topics.Topic, name: str) -> str:
        return self.config.topic_config(topic, name)

    # -- placement -------------------------------------------------------------------

    async def refresh_live_agents(self, max_age: float = LIVE_AGENTS_SECONDS) -> list[AgentInfo]:
        """The live agents, re-read when the last read is older than max_age seconds."""
        clock = time.monotonic()
        if self.in_outage():
            return self.live_agents()  # as last read, less those that refuse connections
        if clock - self._live_read_at >= max_age:
            now = now_ms()
            live = await self.kv.read(lambda tr: cluster.live_agents(tr, self.sub, now))
            self.live = sorted(live, key=lambda a: a.node_id)
            self._live_read_at = clock
        return self.live_agents()

    def live_agents(self) -> list[AgentInfo]:
        if not self.live:
            cfg = self.config
            return [
                AgentInfo(
                    self.node_id, cfg.advertised, cfg.advertised_port, cfg.zone, 0, self.endpoints
                )
            ]
        if not self._refusing:
            return self.live
        return [a for a in self.live if (a.node_id, a.host, a.port) not in self._refusing]

    async def peer_probe_loop(self) -> None:
        """Try a connection to every other live agent's port each PEER_PROBE_SECONDS; an
        agent whose port refuses it is left out of `live_agents` until it accepts one
        again. A refusal says for certain that no process listens there; anything else
        (a timeout, an unreachable host) is left to the lease, and leaves what the last
        answered probe said."""
        while True:
            await anyio.sleep(PEER_PROBE_SECONDS)
            began = time.monotonic()
            for a in self.live:
                if a.node_id != self.node_id:
                    await self._probe((a.node_id, a.host, a.port))
            # Forget the agents gone from the leases (as read now: the view may have been
            # read again during the round).
            peers = {(a.node_id, a.host, a.port) for a in self.live}
            self._refusing &= peers
            for gone in self._peer_tried.keys() - peers:
                del self._peer_tried[gone]
            self._probed_at = began

    async def confirm_peers(self, agents: Iterable[AgentInfo]) -> None:
        """Probe those of `agents` (other than this one) not tried within
        PEER_CONFIRM_SECONDS (PEER_PROBE_SECONDS after a try without an answer), all at
        once: one that refuses is left out of `live_agents` now, instead of at the next
        probe round. For an answer that names only other agents (a zoned client that
        reached an agent outside its zone, a coordinator elsewhere). A peer is probed at
        most once per PEER_CONFIRM_SECONDS however many requests ask; a request that
        finds a probe of it under way waits for that one."""
        now = time.monotonic()
        due = []
        for a in agents:
            peer = (a.node_id, a.host, a.port)
            if a.node_id == self.node_id:
                continue
            tried = self._peer_tried.get(peer)
            if tried is None or now - tried[0] >= (
                PEER_CONFIRM_SECONDS if tried[1] else PEER_PROBE_SECONDS
            ):
                due.append(peer)
        if due:
            async with anyio.create_task_group() as tg:
                for peer in due:
                    tg.start_soon(self._probe, peer)

    async def _probe(self, peer: tuple[int, str, int]) -> None:
        """Try peer's port once (or wait for the try under way) and note what it said."""
        under_way = self._probing.get(peer)
        if under_way is not None:
            await under_way.wait()
            return
        done: Promise[None] = Promise()
        self._probing[peer] = done
        try:
            began = time.monotonic()
            refused = await _refuses(peer[1], peer[2])
            self._peer_tried[peer] = (began, refused is not None)
            if refused and peer not in self._refusing:
                logger.info("agent %d (%s:%d) refuses connections: left out", *peer)
                self._refusing.add(peer)
            elif refused is False:
                self._refusing.discard(peer)
        finally:
            del self._probing[peer]
            done.set(None)

    def view_fresh(self) -> bool:
        """Whether the live agents were read from the store, and every peer probed,
        within view_fresh_s: a change of membership older than that is known here.
        Lightning partitions are answered only while it holds (broker.journal), so that
        an agent slow to learn of a change stops answering for the partitions that
        moved before their new leader begins (SETTLE_S later)."""
        if self.in_outage():
            # No agent can read a change from the store now: the probes are the news.
            return time.monotonic() - self._probed_at < self.view_fresh_s
        oldest = min(self._live_read_at, self._probed_at)
        return time.monotonic() - oldest < self.view_fresh_s

    def in_outage(self) -> bool:
        """Ripcord mode with the metadata store unreachable."""
        return self.config.ripcord and not self.metadata_reachable

    def start_from_snapshot(self, snapshot: Snapshot) -> None:
        """Begin without the metadata store (Ripcord): the node id this agent's address
        had, the cluster id, the agents and the topics as the snapshot has them."""
        cfg = self.config
        node_id = snapshot.node_id_of(cfg.advertised, cfg.advertised_port)
        if node_id is None:
            raise SystemExit(
                f"the metadata store is unreachable and {cfg.advertised}:{cfg.advertised_port}"
                " is not"
                " in the cluster's Ripcord snapshot: an agent new to the cluster can only"
                " start with the store"
            )
        self.node_id = node_id
        self.cluster_id = snapshot.cluster_id
        self.metadata_reachable = False
        self.live = sorted(snapshot.agents, key=lambda a: a.node_id)
        for topic in snapshot.topics:
            self._cache_topic(topic.name, topic, -TOPIC_CACHE_SECONDS)
        logger.warning(
            "metadata store unreachable: started as agent %d from the Ripcord snapshot"
            " (%d topics, %d agents); produces go to the journal",
            node_id,
            len(snapshot.topics),
            len(snapshot.agents),
        )

    def zoned(self) -> bool:
        """Whether any live agent has a zone; if none has, no home zone is read."""
        return any(a.rack is not None for a in self.live_agents())

    def serving_agents(self, zone: str | None) -> list[AgentInfo]:
        """The live agents clients of `zone` are sent to (`broker.placement.serving`)."""
        return list(placement.serving(self.live_agents(), zone))

    async def load_homes(self, kind: int, ids: Iterable[str], *, fresh: bool = False) -> None:
        """Have the home zones of these group (kind GROUP) or transactional ids (kind
        TRANSACTION) at hand for `coordinator_for`: a key found without one is read again
        after HOME_RECHECK_SECONDS, or now if fresh (`broker.zones`)."""
        if self.in_outage() or not self.zoned():
            return
        await self.homes.load(kind, ids, max_age=0.0 if fresh else HOME_RECHECK_SECONDS)

    async def claim_homes(self, kind: int, ids: Iterable[str], zone: str | None) -> None:
        """A client of `zone` looks for the coordinators of `ids`: those without a home
        zone get `zone`, if a live agent is in it; the homes of the others are read."""
        if self.in_outage() or not self.zoned():
            return
        if zone is not None and any(a.rack == zone for a in self.live_agents()):
            await self.homes.claim(kind, ids, zone)
        else:
            await self.homes.load(kind, ids, max_age=0.0)

    def coordinator_for(self, key: str, kind: int = GROUP) -> AgentInfo:
        """The agent that coordinates a group or transactional id: the rendezvous pick
        among the live agents of its home zone, if it has one with a live agent, else
        among all (`broker.placement`); its home as loaded by `load_homes`."""
        live = self.live_agents()
        return placement.coordinator_for(key, placement.serving(live, self.homes.home(kind, key)))

    async def coordinated_transactions(self, transactional_ids: list[str]) -> set[str]:
        """Those of the transactional ids this agent coordinates (their homes read in one
        go first)."""
        await self.load_homes(TRANSACTION, transactional_ids)
        return {
            tid
            for tid in transactional_ids
            if self.coordinator_for(tid, TRANSACTION).node_id == self.node_id
        }

    def leader_for(self, topic_id: bytes, partition: int) -> int:
        """Every agent accepts every partition; clients still want one leader each. This
        is the one every client is given for a lightning partition (broker.describe)."""
        return placement.leader_for(topic_id, partition, self.live_agents()).node_id


async def _refuses(host: str, port: int) -> bool | None:
    """Whether a connection to host:port is refused; None without an answer either way
    within PEER_PROBE_TIMEOUT_SECONDS (a host that drops packets, an event loop held up
    past it) or for another failure (an unreachable host)."""
    try:
        with anyio.fail_after(PEER_PROBE_TIMEOUT_SECONDS):
            stream = await anyio.connect_tcp(host, port)
    except TimeoutError:
        return None
    except OSError as exc:  # anyio gives the refusal as the cause of its own error
        if isinstance(exc, ConnectionRefusedError) or isinstance(
            exc.__cause__, ConnectionRefusedError
        ):
            return True
        return None  # unreachable, or another failure: no answer either way
    # Connecting to a port of the ephemeral range that nothing listens on may connect
    # the socket to itself (TCP simultaneous open): nobody is there.
    try:
        local = stream.extra(anyio.abc.SocketAttribute.local_address)
        remote = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except anyio.TypedAttributeLookupError:
        # The peer accepted and was gone before its address was read (ENOTCONN): it
        # listened a moment ago and does not now, no answer either way.
        return None
    finally:
        await stream.aclose()
    return local == remote


def blocking_store_calls(config: BrokerConfig) -> int:
    """How many blocking object-store calls an agent makes at most at once, each from a
    thread of its own beside the store's async limit: flush uploads, their hedges,
    compaction jobs and the cleaner."""
    hedges = HEDGE_THREADS if config.resolved_put_hedge_percentile is not None else 0
    return MAX_CONCURRENT_FLUSHES + hedges + config.compaction_max_jobs + 1


def _warn_injected_latency(config: BrokerConfig) -> None:
    """Say that the store's PUTs and GETs are delayed (benchmarks and tests only:
    --inject-put-latency-ms, --inject-get-latency-ms; broker.workers.StoreSpec)."""
    put, get = config.inject_put_latency_ms, config.inject_get_latency_ms
    logger.warning(
        "object store latency injected (benchmarks and tests only): PUT %s, GET %s",
        f"median {put[0]:g} ms, p99 {put[1]:g} ms" if put else "none",
        f"median {get[0]:g} ms, p99 {get[1]:g} ms" if get else "none",
    )
