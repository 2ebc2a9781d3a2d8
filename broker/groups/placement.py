"""Which live agent coordinates a group: `Agent.coordinator_for`, a hash of the group id
over the live agents sorted by node id -- the same placement as transactional ids, so
FindCoordinator answers both key types alike. Every agent computes the same answer from
the same list of live agents; when the list changes, groups move, and the agent that
gains one loads it from the metadata store.
"""

from __future__ import annotations

from typing import Protocol

from metadata.cluster import Agent as AgentInfo

GROUP = 0
TRANSACTION = 1
SHARE = 2


class PlacedAgent(Protocol):
    """What placement reads of an agent (`broker.agent.Agent`)."""

    @property
    def node_id(self) -> int: ...

    async def refresh_live_agents(self, max_age: float = ...) -> list[AgentInfo]: ...

    def coordinator_for(self, key: str) -> AgentInfo: ...


class Placement(Protocol):
    async def refresh(self, *, fresh: bool = False) -> None: ...

    def is_local(self, group_id: str) -> bool: ...


class AgentPlacement:
    """Placement as one agent sees it: its live agents, re-read at most twice a second."""

    REFRESH_SECONDS = 0.5

    def __init__(self, agent: PlacedAgent) -> None:
        self._agent = agent

    async def refresh(self, *, fresh: bool = False) -> None:
        await self._agent.refresh_live_agents(max_age=0.0 if fresh else self.REFRESH_SECONDS)

    def is_local(self, group_id: str) -> bool:
        return self._agent.coordinator_for(group_id).node_id == self._agent.node_id
