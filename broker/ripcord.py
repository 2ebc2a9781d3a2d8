"""Ripcord mode (`bucketlog serve --ripcord`): produce on while the metadata store is down.

While the agent's metadata store is unreachable (its lease cannot be renewed), every
topic's produces take the lightning path (broker.journal): answered once durable in the
journal, sequenced when the store is back. What answering a produce needs is kept:

- in memory: topics (ids, partition counts, configs) as last read, and the live agents;
- in the object store, as a snapshot (`SNAPSHOT_KEY`), rewritten by every agent when it
  changes, so that an agent can even *start* while the store is down: it takes its node
  id (by its advertised address), the cluster id, the topics and the agents from it.

The rest (fetches, offsets, groups, transactions, admin) needs the store and is answered
with retriable errors until it is back. Nothing needs a restart when it is: the lease
loop finds the store again, and the journal's committer and sweep sequence the backlog.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from metadata import cluster, topics
from metadata.cluster import Agent as AgentInfo
from metadata.kv import KVError
from storage.objectstore import ObjectNotFoundError, ObjectStoreError

if TYPE_CHECKING:
    from broker.agent import Agent

logger = logging.getLogger(__name__)

SNAPSHOT_KEY = "ripcord/snapshot.json"
SNAPSHOT_SECONDS = 5.0
_VERSION = 1


class SnapshotError(Exception):
    """The snapshot in the object store cannot be read."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    cluster_id: str
    agents: tuple[AgentInfo, ...]  # lease_expires_ms is 0: leases are not kept
    topics: tuple[topics.Topic, ...]

    def node_id_of(self, host: str, port: int) -> int | None:
        for agent in self.agents:
            if (agent.host, agent.port) == (host, port):
                return agent.node_id
        return None


def encode(snapshot: Snapshot) -> bytes:
    document = {
        "version": _VERSION,
        "cluster_id": snapshot.cluster_id,
        "agents": [
            {
                "node_id": a.node_id,
                "host": a.host,
                "port": a.port,
                "rack": a.rack,
                "listeners": [list(endpoint) for endpoint in a.listeners],
            }
            for a in sorted(snapshot.agents, key=lambda a: a.node_id)
        ],
        "topics": [
            {
                "id": t.topic_id.hex(),
                "name": t.name,
                "partitions": t.partitions,
                "configs": dict(sorted(t.configs.items())),
            }
            for t in sorted(snapshot.topics, key=lambda t: t.name)
        ],
    }
    return json.dumps(document, sort_keys=True).encode()


def decode(data: bytes) -> Snapshot:
    try:
        document = json.loads(data)
        if document.get("version") != _VERSION:
            raise SnapshotError(f"unknown snapshot version {document.get('version')!r}")
        return Snapshot(
            cluster_id=str(document["cluster_id"]),
            agents=tuple(
                AgentInfo(
                    int(a["node_id"]),
                    str(a["host"]),
                    int(a["port"]),
                    a["rack"],
                    0,
                    tuple((str(n), str(h), int(p)) for n, h, p in a.get("listeners", ())),
                )
                for a in document["agents"]
            ),
            topics=tuple(
                topics.Topic(
                    bytes.fromhex(t["id"]),
                    str(t["name"]),
                    int(t["partitions"]),
                    {str(k): str(v) for k, v in t["configs"].items()},
                )
                for t in document["topics"]
            ),
        )
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"malformed snapshot: {exc}") from None


async def read_snapshot(agent: Agent) -> Snapshot | None:
    """The snapshot in the object store; None if there is none."""
    try:
        data = await agent.store.get(SNAPSHOT_KEY)
    except ObjectNotFoundError:
        return None
    return decode(data)


def _read_for_snapshot(agent: Agent) -> Any:
    now = int(time.time() * 1000)

    def read(tr: Any) -> tuple[list[AgentInfo], list[topics.Topic]]:
        return cluster.live_agents(tr, agent.sub, now), topics.list_topics(tr, agent.sub)

    return read


async def snapshot_loop(agent: Agent) -> None:
    """Rewrite the snapshot whenever what it holds changed (checked every
    SNAPSHOT_SECONDS while the store is reachable)."""
    written = b""
    while True:
        if agent.metadata_reachable:
            written = await _write_snapshot(agent, written)
        await anyio.sleep(SNAPSHOT_SECONDS)


async def _write_snapshot(agent: Agent, written: bytes) -> bytes:
    """Write the snapshot if it differs from `written`; what the store now holds."""
    try:
        live, all_topics = await agent.kv.read(_read_for_snapshot(agent))
    except KVError:
        return written  # the lease loop notices and says so
    data = encode(Snapshot(agent.cluster_id, tuple(live), tuple(all_topics)))
    if data == written:
        return written
    try:
        await agent.store.put(SNAPSHOT_KEY, data)
    except ObjectStoreError as exc:
        logger.warning("writing the Ripcord snapshot failed: %s", exc)
        return written
    return data
