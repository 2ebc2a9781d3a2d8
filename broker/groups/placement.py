"""Which live agent coordinates a group: `Agent.coordinator_for`, a hash of the group id
over the live agents sorted by node id -- the same placement as transactional ids, so
FindCoordinator answers both key types alike. Every agent computes the same answer from
the same list of live agents; when the list changes, groups move, and the agent that
gains one loads it from the metadata store.

With zones, the hash is over the live agents of the group's home zone (`broker.zones`):
`refresh` loads the homes of the groups the caller is about to ask `is_local` of.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from metadata.cluster import Agent as AgentInfo
from metadata.homes import GROUP, TRANSACTION

__all__ = ["GROUP", "SHARE", "TRANSACTION", "AgentPlacement", "PlacedAgent", "Placement"]

SHARE = 2


class PlacedAgent(Protocol):
    """What placement reads of an agent (`broker.agent.Agent`)."""

    @property
    def node_id(self) -> int: ...

    async def refresh_live_agents(self, max_age: float = ...) -> list[AgentInfo]: ...

    async def load_homes(self, kind: int, ids: Iterable[str], *, fresh: bool = ...) -> None: ...

    def coordinator_for(self, key: str, kind: int = ...) -> AgentInfo: ...


class Placement(Protocol):
    async def refresh(self, *group_ids: str, fresh: bool = False) -> None:
        """Read the live agents again if they are old (now if fresh), and the home zones
        of these groups."""
        ...

    def is_local(self, group_id: str) -> bool: ...


class AgentPlacement:
    """Placement as one agent sees it: its live agents, re-read at most twice a second."""

    REFRESH_SECONDS = 0.5

    def __init__(self, agent: PlacedAgent) -> None:
        self._agent = agent

    async def refresh(self, *group_ids: str, fresh: bool = False) -> None:
        await self._agent.refresh_live_agents(max_age=0.0 if fresh else self.REFRESH_SECONDS)
        if group_ids:
            await self._agent.load_homes(GROUP, group_ids, fresh=fresh)

    def is_local(self, group_id: str) -> bool:
        return self._agent.coordinator_for(group_id, GROUP).node_id == self._agent.node_id
