"""What a request handler may touch: its request's context, and the agent's services.

Rules:

- A handler is `async def handle(request, ctx: HandlerContext) -> response | None`. It
  reaches the agent only through `ctx.agent`, typed `AgentServices`: the stores, the
  caches, the produce pipeline and the coordinators, and the agent's view of topics and
  live agents. Nothing else of the agent (its lease, its loops) is a handler's business.
- Both are Protocols: `broker.agent.Agent` and `broker.connection.RequestContext` are
  what runs, and tests may pass smaller stand-ins.
- The agent's background jobs (retention and garbage collection, compaction, cleaning)
  see it as a `JobAgent`, or a Protocol extending it with the one cache a job uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.eventlog import EventLog
    from broker.groups import GroupCoordinator
    from broker.ingest import IngestPipeline
    from broker.journal import JournalPipeline, ProducerSequences
    from broker.memory import RequestMemory
    from broker.readahead import ReadAhead
    from broker.sync import Notifier
    from metadata import keys, topics
    from metadata.chunk_cache import ChunkCache
    from metadata.cluster import Agent as AgentInfo
    from metadata.kv import KV
    from storage.cache import ObjectCache, RangeReader
    from storage.objectstore import ObjectStore


class JobAgent(Protocol):
    """The agent as a background job sees it: the stores, its node id, topic configs."""

    @property
    def kv(self) -> KV: ...
    @property
    def sub(self) -> keys.Subspace: ...
    @property
    def store(self) -> ObjectStore: ...
    @property
    def node_id(self) -> int: ...
    def topic_config(self, topic: topics.Topic, name: str) -> str: ...


class AgentServices(Protocol):
    """The agent as handlers see it."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...

    # The stores, and the metadata subspace of this cluster.
    @property
    def kv(self) -> KV: ...
    @property
    def sub(self) -> keys.Subspace: ...
    @property
    def store(self) -> ObjectStore: ...

    # Reading: recent objects, ranged reads, chunk entries, reading ahead of a consumer.
    @property
    def cache(self) -> ObjectCache: ...
    @property
    def reader(self) -> RangeReader: ...
    @property
    def chunks(self) -> ChunkCache: ...
    @property
    def read_ahead(self) -> ReadAhead: ...

    # Writing and waiting: the produce pipeline, and the partitions' change notices.
    @property
    def pipeline(self) -> IngestPipeline: ...
    # Lightning topics: answered once durable, sequenced after (broker.journal).
    @property
    def journal(self) -> JournalPipeline: ...
    @property
    def producer_sequences(self) -> ProducerSequences: ...
    @property
    def notifier(self) -> Notifier: ...

    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def request_memory(self) -> RequestMemory: ...

    # Topics, as cached for a moment.
    async def topic(self, name: str, *, fresh: bool = False) -> topics.Topic | None: ...
    async def topic_by_id(self, topic_id: bytes) -> topics.Topic | None: ...
    def remember_topic(self, topic: topics.Topic) -> None: ...
    def forget_topic(self, name: str) -> None: ...
    def topic_config(self, topic: topics.Topic, name: str) -> str: ...

    # Live agents and placement.
    async def refresh_live_agents(self, max_age: float = ...) -> list[AgentInfo]: ...
    def live_agents(self) -> list[AgentInfo]: ...
    def coordinator_for(self, key: str) -> AgentInfo: ...
    def leader_for(self, topic_id: bytes, partition: int) -> int: ...


class HandlerContext(Protocol):
    """One request's context."""

    @property
    def agent(self) -> AgentServices: ...
    @property
    def api_version(self) -> int: ...
    @property
    def correlation_id(self) -> int: ...
    @property
    def client_id(self) -> str | None: ...
    @property
    def peer(self) -> str: ...

    def end_turn(self) -> None:
        """This request has taken effect: the connection's next request may start."""
        ...
