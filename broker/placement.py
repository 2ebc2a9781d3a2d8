"""Which live agent does what: pure functions of the live agents, the same on every agent.

Rules:

- Every agent accepts every partition and can coordinate any group or transactional id;
  placement only says which agent clients are sent to. Every agent computes the same
  answer from the same list of live agents.
- Coordinators (of groups and transactional ids) are placed by rendezvous hashing
  (highest random weight): each agent gets a weight for the key, a hash of the key and
  its node id, and the heaviest wins. When an agent joins or leaves, only the keys it
  wins or won move, about 1/N of them, instead of most of them as with a hash mod N.
- Partition leaders are spread evenly instead: consecutive partitions of a topic go to
  consecutive agents.
- Zones (broker.zones): both picks are made among the agents `serving` a zone, the live
  agents of that zone sorted by node id, or every live agent when none is in it; the
  spread within a zone is as even and as deterministic as over every agent.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Protocol, TypeVar


class HasNodeId(Protocol):
    @property
    def node_id(self) -> int: ...


class HasZone(HasNodeId, Protocol):
    @property
    def rack(self) -> str | None: ...  # the agent's zone, registered as its rack


A = TypeVar("A", bound=HasNodeId)
Z = TypeVar("Z", bound=HasZone)


def weight(key: str, node_id: int) -> int:
    """The rendezvous weight of node_id for key: 64 bits of a hash of both."""
    digest = hashlib.blake2b(f"{node_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def coordinator_for(key: str, agents: Sequence[A]) -> A:
    """The agent that coordinates `key` (a group id or a transactional id)."""
    if not agents:
        raise ValueError("no live agents")
    return max(agents, key=lambda agent: weight(key, agent.node_id))


def leader_for(topic_id: bytes, partition: int, agents: Sequence[A]) -> A:
    """The agent named leader of a partition; agents are sorted by node id."""
    if not agents:
        raise ValueError("no live agents")
    return agents[(zlib.crc32(topic_id) + partition) % len(agents)]


def serving(agents: Sequence[Z], zone: str | None) -> Sequence[Z]:
    """The agents that serve clients of `zone`: those in it, or all when none is (or when
    zone is None). Keeps the agents' order."""
    if zone is None:
        return agents
    in_zone = [agent for agent in agents if agent.rack == zone]
    return in_zone or agents
