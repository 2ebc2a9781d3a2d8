"""Coordinator placement: rendezvous hashing moves few keys when agents come and go."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from broker import placement

KEYS = [f"group-{i}" for i in range(6000)]


@dataclass(frozen=True)
class Agent:
    node_id: int


def owners(agents: list[Agent]) -> dict[str, int]:
    return {key: placement.coordinator_for(key, agents).node_id for key in KEYS}


def test_an_agent_leaving_moves_only_the_keys_it_coordinated() -> None:
    agents = [Agent(n) for n in range(5)]
    before = owners(agents)
    after = owners([a for a in agents if a.node_id != 2])
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(before[key] == 2 for key in moved)
    assert len(moved) == sum(1 for owner in before.values() if owner == 2)
    assert abs(len(moved) / len(KEYS) - 1 / 5) < 0.03


def test_an_agent_joining_takes_about_its_share_and_nothing_else_moves() -> None:
    agents = [Agent(n) for n in range(4)]
    before = owners(agents)
    after = owners([*agents, Agent(9)])
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == 9 for key in moved)
    assert abs(len(moved) / len(KEYS) - 1 / 5) < 0.03


def test_keys_spread_evenly_and_the_answer_does_not_depend_on_the_order() -> None:
    agents = [Agent(n) for n in (3, 7, 11, 12)]
    counts = Counter(owners(agents).values())
    assert set(counts) == {3, 7, 11, 12}
    assert all(abs(c / len(KEYS) - 1 / 4) < 0.03 for c in counts.values())
    assert owners(list(reversed(agents))) == owners(agents)


def test_partition_leaders_go_round_the_agents() -> None:
    agents = [Agent(n) for n in range(3)]
    leaders = [placement.leader_for(b"topic", p, agents).node_id for p in range(6)]
    assert sorted(Counter(leaders).values()) == [2, 2, 2]


def test_the_agents_coordinator_moves_about_a_fifth_of_the_keys_when_one_of_five_leaves(
    tmp_path,
) -> None:
    from broker.agent import Agent as BrokerAgent
    from broker.config import BrokerConfig
    from metadata.cluster import Agent as AgentInfo

    agent = BrokerAgent.open(BrokerConfig(data_dir=str(tmp_path)))
    live = [AgentInfo(n, "127.0.0.1", 9092 + n, None, 0) for n in range(5)]
    agent.live = live
    before = {key: agent.coordinator_for(key).node_id for key in KEYS}
    agent.live = [a for a in live if a.node_id != 4]
    after = {key: agent.coordinator_for(key).node_id for key in KEYS}
    moved = sum(before[key] != after[key] for key in KEYS)
    assert moved / len(KEYS) < 0.25, f"{moved} of {len(KEYS)} keys moved"
