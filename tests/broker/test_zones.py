"""Zone-aware routing (broker.zones, broker.placement.serving): the client.id convention,
leaders and coordinators within a zone, home zones, and the requests-by-zone counter."""

from __future__ import annotations

import socket
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from prometheus_client.core import Metric

from broker import placement, zones
from broker.metrics import CLIENT_ZONE_LABELS, OTHER_ZONE, AgentCollector, Meter
from metadata import cluster, homes, keys
from metadata.cluster import Agent as AgentInfo

KEYS = [f"group-{i}" for i in range(3000)]


@dataclass(frozen=True)
class Agent:
    node_id: int
    rack: str | None


# Nine agents, three in each zone, their node ids interleaved across zones.
AGENTS = [Agent(n, "abc"[n % 3]) for n in range(9)]


# -- the client.id convention ----------------------------------------------------------


@pytest.mark.parametrize(
    ("client_id", "zone"),
    [
        ("bucketlog_az=b", "b"),
        ("myapp,bucketlog_az=us-east-1a", "us-east-1a"),
        ("bucketlog_az=us-east-1a,myapp", "us-east-1a"),
        ("myapp bucketlog_az=eu-west-1c rest", "eu-west-1c"),
        ("svc-bucketlog_az=a", "a"),  # anywhere in the client.id
        ("bucketlog_az=a,bucketlog_az=b", "a"),  # the first mark counts
        ("bucketlog_az=", None),  # an empty value names no zone
        ("bucketlog_az=,b", None),
        ("myapp", None),
        ("BUCKETLOG_AZ=a", None),  # the mark is lower case
        ("", None),
        (None, None),
    ],
)
def test_a_client_names_its_zone_in_its_client_id(client_id: str | None, zone: str | None) -> None:
    assert zones.client_zone(client_id) == zone


def test_a_connection_parses_its_client_id_again_only_when_it_changes(monkeypatch) -> None:
    parsed: list[str | None] = []

    def counting(client_id: str | None) -> str | None:
        parsed.append(client_id)
        return "z" if client_id else None

    monkeypatch.setattr(zones, "client_zone", counting)
    client = zones.ClientZone()
    for _ in range(100):
        assert client.of("app,bucketlog_az=z") == "z"
    assert client.of("other") == "z"  # counting says z for any id
    assert client.of("other") == "z"
    assert parsed == ["app,bucketlog_az=z", "other"]


# -- leaders -----------------------------------------------------------------------------


def leaders(topic_id: bytes, partitions: int, zone: str | None, agents: list[Agent]) -> list[int]:
    serving = placement.serving(agents, zone)
    return [placement.leader_for(topic_id, p, serving).node_id for p in range(partitions)]


def test_a_zoned_clients_leaders_are_its_zones_agents_evenly_and_in_order() -> None:
    for zone, nodes in (("a", [0, 3, 6]), ("b", [1, 4, 7]), ("c", [2, 5, 8])):
        picked = leaders(b"topic-1", 12, zone, AGENTS)
        assert set(picked) == set(nodes)
        assert sorted(Counter(picked).values()) == [4, 4, 4]
        # Consecutive partitions go to consecutive agents of the zone, by node id.
        first = nodes.index(picked[0])
        assert picked == [nodes[(first + p) % 3] for p in range(12)]
        # The same whatever order the agents are listed in: sorted by node id first.
        assert leaders(b"topic-1", 12, zone, sorted(AGENTS, key=lambda a: a.node_id)) == picked


def test_a_zone_without_agents_and_an_unzoned_client_get_every_agent() -> None:
    everyone = leaders(b"topic-2", 18, None, AGENTS)
    assert sorted(Counter(everyone).values()) == [2] * 9
    assert leaders(b"topic-2", 18, "nowhere", AGENTS) == everyone
    # A zone whose agents are all gone: every live agent.
    survivors = [a for a in AGENTS if a.rack != "b"]
    assert set(leaders(b"topic-2", 18, "b", survivors)) == {a.node_id for a in survivors}


def test_without_zones_placement_is_what_it_was() -> None:
    unzoned = [Agent(n, None) for n in range(4)]
    assert placement.serving(unzoned, "b") == unzoned
    assert placement.serving(unzoned, None) == unzoned


# -- coordinators ----------------------------------------------------------------------


def coordinators(home: str | None, agents: list[Agent]) -> dict[str, int]:
    serving = placement.serving(agents, home)
    return {key: placement.coordinator_for(key, serving).node_id for key in KEYS}


def test_a_key_with_a_home_is_coordinated_in_its_home_zone_evenly() -> None:
    picked = coordinators("b", AGENTS)
    counts = Counter(picked.values())
    assert set(counts) == {1, 4, 7}
    assert all(abs(c / len(KEYS) - 1 / 3) < 0.04 for c in counts.values())
    assert coordinators("b", list(reversed(AGENTS))) == picked


def test_a_key_whose_home_has_no_live_agent_is_coordinated_as_without_a_home() -> None:
    survivors = [a for a in AGENTS if a.rack != "b"]
    assert coordinators("b", survivors) == coordinators(None, survivors)
    assert set(coordinators("b", survivors).values()) == {a.node_id for a in survivors}


# -- the agent: home zones loaded, claimed, used by every ownership check ------------------


class NoReads:
    """A metadata store that fails the test if it is read."""

    async def read(self, fn: Any, **_kw: Any) -> Any:
        raise AssertionError("the metadata store was read")

    async def transact(self, fn: Any) -> Any:
        raise AssertionError("the metadata store was written")


@pytest.fixture
def agent(tmp_path):
    from broker.agent import Agent as BrokerAgent
    from broker.config import BrokerConfig

    agent = BrokerAgent.open(BrokerConfig(data_dir=str(tmp_path), zone="a"))
    agent.node_id = 0
    yield agent
    anyio.run(agent.aclose)


def set_live(agent: Any, *zones_of: str | None, gone: tuple[int, ...] = ()) -> list[AgentInfo]:
    """Make agents of these zones, node ids 0, 1, ... but those `gone`, the live agents in
    the store and in the agent's view."""
    live = [
        AgentInfo(n, "127.0.0.1", 9092 + n, z, 2**62)
        for n, z in enumerate(zones_of)
        if n not in gone
    ]
    return _register(agent, live)


def _register(agent: Any, live: list[AgentInfo]) -> list[AgentInfo]:
    """These agents, and only these, live in the store and in the agent's view."""

    def register(tr: Any) -> None:
        tr.clear_range(*agent.sub.range(keys.AGENT))
        for info in live:
            cluster.renew_lease(tr, agent.sub, info)

    agent.kv.transact_sync(register)
    agent.live = live
    return live


def test_the_first_zoned_client_to_ask_gives_a_key_its_home_for_good(agent) -> None:
    from broker.groups.placement import AgentPlacement

    set_live(agent, "a", "b", "c", "a", "b", "c")
    in_b = {1, 4}

    async def scenario() -> None:
        # A group no agent of zone b would coordinate without a home.
        group = next(k for k in KEYS if agent.coordinator_for(k).node_id not in in_b)
        await agent.claim_homes(homes.GROUP, [group], "b")
        assert agent.coordinator_for(group).node_id in in_b
        # A later client of another zone does not move it.
        await agent.claim_homes(homes.GROUP, [group], "c")
        assert agent.coordinator_for(group).node_id in in_b
        # A transactional id of the same name is another key: no home yet.
        assert agent.homes.home(homes.TRANSACTION, group) is None

        # Another agent on the same store, that never saw the claim, agrees once it has
        # loaded the group's home, as its ownership checks do before they answer.
        from broker.agent import Agent as BrokerAgent

        other = BrokerAgent(agent.config, agent.kv, agent.store)
        await other.refresh_live_agents()
        assert other.live == agent.live
        other.node_id = agent.coordinator_for(group).node_id
        assert not AgentPlacement(other).is_local(group)  # the hash over every agent
        await AgentPlacement(other).refresh(group)
        assert AgentPlacement(other).is_local(group)

    anyio.run(scenario)


def test_a_client_of_a_zone_without_agents_gives_no_home(agent) -> None:
    set_live(agent, "a", "b", "c")

    async def scenario() -> None:
        before = agent.coordinator_for("lonely").node_id
        await agent.claim_homes(homes.GROUP, ["lonely"], "nowhere")
        await agent.claim_homes(homes.GROUP, ["lonely"], None)
        stored = await agent.kv.read(lambda tr: homes.get(tr, agent.sub, homes.GROUP, "lonely"))
        assert stored is None
        assert agent.coordinator_for("lonely").node_id == before

    anyio.run(scenario)


def test_a_key_whose_home_zone_lost_its_agents_moves_to_the_others(agent) -> None:
    set_live(agent, "a", "b", "c")

    async def scenario() -> None:
        await agent.claim_homes(homes.TRANSACTION, ["txn-1"], "b")
        assert agent.coordinator_for("txn-1", homes.TRANSACTION).node_id == 1
        set_live(agent, "a", "b", "c", gone=(1,))
        expected = placement.coordinator_for("txn-1", agent.live).node_id
        assert agent.coordinator_for("txn-1", homes.TRANSACTION).node_id == expected
        agent.node_id = expected
        assert await agent.coordinated_transactions(["txn-1"]) == {"txn-1"}

    anyio.run(scenario)


def test_the_transaction_timeout_check_reads_the_home_before_it_answers(agent) -> None:
    set_live(agent, "a", "b", "c")

    async def scenario() -> None:
        # A transactional id claimed for zone b through another agent, unseen here.
        tid = next(k for k in KEYS if placement.coordinator_for(k, agent.live).node_id != 1)
        await agent.kv.transact(lambda tr: homes.claim(tr, agent.sub, homes.TRANSACTION, tid, "b"))
        agent.node_id = 1
        assert await agent.coordinated_transactions([tid]) == {tid}
        agent.node_id = placement.coordinator_for(tid, agent.live).node_id
        assert await agent.coordinated_transactions([tid]) == set()

    anyio.run(scenario)


def test_no_agent_with_a_zone_means_no_home_is_read_or_written(agent) -> None:
    set_live(agent, None, None, None)
    agent.homes = zones.HomeZones(NoReads(), agent.sub)  # type: ignore[arg-type]

    async def scenario() -> None:
        await agent.claim_homes(homes.GROUP, ["g"], "b")
        await agent.load_homes(homes.GROUP, ["g"], fresh=True)
        assert (
            agent.coordinator_for("g").node_id == placement.coordinator_for("g", agent.live).node_id
        )

    anyio.run(scenario)


def test_a_key_without_a_home_is_read_again_only_after_half_a_second(agent, monkeypatch) -> None:
    set_live(agent, "a", "b")
    reads = []
    read = agent.kv.read

    async def counting(fn: Any, **kw: Any) -> Any:
        reads.append(1)
        return await read(fn, **kw)

    monkeypatch.setattr(agent.kv, "read", counting)
    clock = [100.0]
    agent.homes = zones.HomeZones(agent.kv, agent.sub, clock=lambda: clock[0])

    async def scenario() -> None:
        await agent.load_homes(homes.GROUP, ["g"])
        await agent.load_homes(homes.GROUP, ["g"])
        assert len(reads) == 1
        clock[0] += zones.HOME_RECHECK_SECONDS
        await agent.load_homes(homes.GROUP, ["g"])
        assert len(reads) == 2
        await agent.load_homes(homes.GROUP, ["g"], fresh=True)
        assert len(reads) == 3
        # A home, once read, is never read again.
        await agent.claim_homes(homes.GROUP, ["g"], "b")
        clock[0] += 60
        await agent.load_homes(homes.GROUP, ["g"], fresh=True)
        assert len(reads) == 3

    anyio.run(scenario)


def test_many_keys_are_loaded_with_one_range_read(agent) -> None:
    set_live(agent, "a", "b")
    ids = [f"g{i}" for i in range(zones.POINT_READS + 5)]

    async def scenario() -> None:
        await agent.kv.transact(
            lambda tr: [homes.claim(tr, agent.sub, homes.GROUP, g, "b") for g in ids[::2]]
        )
        await agent.load_homes(homes.GROUP, ids)
        assert [agent.homes.home(homes.GROUP, g) for g in ids] == [
            "b" if i % 2 == 0 else None for i in range(len(ids))
        ]

    anyio.run(scenario)


def test_the_home_cache_is_bounded() -> None:
    cache = zones.HomeZones(NoReads(), None, limit=3)  # type: ignore[arg-type]
    cache._learn(homes.GROUP, ["a", "b", "c", "d"], {"a": "z", "b": "z", "c": "z", "d": "z"}, 0.0)
    assert [cache.home(homes.GROUP, k) for k in "abcd"] == [None, "z", "z", "z"]


# -- the requests-by-zone counter ----------------------------------------------------------


def by_zone(meter: Meter) -> dict[tuple[str, str, str], float]:
    families: list[Metric] = list(AgentCollector(dict, meter).collect())
    (family,) = [f for f in families if f.name == "bucketlog_requests_by_zone"]
    return {
        (s.labels["agent_zone"], s.labels["client_zone"], s.labels["api"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


def test_requests_are_counted_by_agent_zone_and_client_zone() -> None:
    meter = Meter("a")
    for _ in range(3):
        meter.zone_request("b", "Produce")
    meter.zone_request(None, "Metadata")
    meter.zone_request("a", "Fetch")
    assert by_zone(meter) == {
        ("a", "b", "Produce"): 3,
        ("a", "", "Metadata"): 1,
        ("a", "a", "Fetch"): 1,
    }
    assert by_zone(Meter(None)) == {}
    unzoned = Meter(None)
    unzoned.zone_request(None, "Fetch")
    assert by_zone(unzoned) == {("", "", "Fetch"): 1}


def test_client_zones_past_the_limit_are_counted_together() -> None:
    meter = Meter("a")
    for i in range(CLIENT_ZONE_LABELS + 10):
        meter.zone_request(f"made-up-{i}", "Metadata")
    meter.zone_request("made-up-0", "Metadata")
    counted = by_zone(meter)
    assert len(counted) == CLIENT_ZONE_LABELS + 1
    assert counted["a", OTHER_ZONE, "Metadata"] == 10
    assert counted["a", "made-up-0", "Metadata"] == 2


# -- an agent killed a moment ago is not the only one named --------------------------------


@dataclass
class _Ctx:
    """A request's context as the handlers read it."""

    agent: Any
    client_zone: str | None
    api_version: int
    client_id: str | None = "app,bucketlog_az=b"
    principal: str = "User:ANONYMOUS"
    peer: str = "127.0.0.1:50000"
    listener: str = "PLAINTEXT"
    session: Any = None
    correlation_id: int = 1

    def end_turn(self) -> None:
        pass


def _peers_one_dead(agent: Any, listening: socket.socket) -> list[AgentInfo]:
    """This agent (node 0, zone a); node 1 of zone b, whose port nothing listens on (as
    after a kill -9 before its lease ran out); node 2 of zone c, listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    live = [
        AgentInfo(0, "127.0.0.1", agent.config.port, "a", 2**62),
        AgentInfo(1, "127.0.0.1", dead_port, "b", 2**62),
        AgentInfo(2, "127.0.0.1", listening.getsockname()[1], "c", 2**62),
    ]
    return _register(agent, live)


@pytest.fixture
def listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)  # the kernel accepts probes into the backlog
        yield s


def _metadata(agent: Any, zone: str | None) -> Any:
    from broker.handlers.metadata import handle as metadata
    from tests.e2e.wire import request

    asked = request(
        3, 12, topics=[], allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )  # fmt: skip
    return anyio.run(metadata, asked, _Ctx(agent, zone, 12))


def _counting_probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import broker.agent as agent_module

    probed: list[int] = []  # the ports tried
    real = agent_module._refuses

    async def refuses(host: str, port: int) -> bool | None:
        probed.append(port)
        return await real(host, port)

    monkeypatch.setattr(agent_module, "_refuses", refuses)
    return probed


def test_a_zoned_client_elsewhere_is_not_sent_only_to_its_zones_dead_agent(
    agent, listening, monkeypatch
) -> None:
    live = _peers_one_dead(agent, listening)
    probed = _counting_probes(monkeypatch)
    # A client of the agent's own zone, or of none, is answered without a probe.
    assert [b.node_id for b in _metadata(agent, "a").brokers] == [0]
    assert [b.node_id for b in _metadata(agent, None).brokers] == [0, 1, 2]
    assert probed == []
    assert [a.node_id for a in agent.serving_agents("b")] == [1]  # as the leases say
    assert sorted(b.node_id for b in _metadata(agent, "b").brokers) == [0, 2]
    assert probed == [live[1].port]
    # Within PEER_CONFIRM_SECONDS the answer stands; zone c's agent is tried once.
    assert [b.node_id for b in _metadata(agent, "c").brokers] == [2]
    assert [b.node_id for b in _metadata(agent, "c").brokers] == [2]
    assert probed == [live[1].port, live[2].port]


def test_requests_that_find_a_probe_under_way_wait_for_it(agent, monkeypatch) -> None:
    import broker.agent as agent_module

    live = set_live(agent, "a", "b", "c")
    tries: list[int] = []
    release = anyio.Event()

    async def refuses(host: str, port: int) -> bool | None:
        tries.append(port)
        await release.wait()
        return port == live[1].port

    monkeypatch.setattr(agent_module, "_refuses", refuses)

    async def scenario() -> list[set[int]]:
        seen: list[set[int]] = []

        async def ask() -> None:
            await agent.confirm_peers(live)
            seen.append({a.node_id for a in agent.live_agents()})

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            assert sorted(tries) == [live[1].port, live[2].port]  # both at once, once
            release.set()
        return seen

    assert anyio.run(scenario) == [{0, 2}] * 5


def test_a_coordinator_that_refuses_connections_is_not_named(agent, listening) -> None:
    from broker.handlers.find_coordinator import handle as find_coordinator
    from tests.e2e.wire import request

    _peers_one_dead(agent, listening)

    async def scenario() -> list[int]:
        # Keys zone b's agent would coordinate, its zone their home.
        wanted = [k for k in KEYS[:200] if agent.coordinator_for(k).node_id == 1][:3]
        await agent.claim_homes(homes.GROUP, wanted, "b")
        assert {agent.coordinator_for(k).node_id for k in wanted} == {1}
        answer = await find_coordinator(
            request(10, 4, key_type=0, coordinator_keys=wanted), _Ctx(agent, "b", 4)
        )
        return [c.node_id for c in answer.coordinators]

    named = anyio.run(scenario)
    assert len(named) == 3 and 1 not in named


def test_a_probe_without_an_answer_leaves_what_the_last_answer_said(agent, monkeypatch) -> None:
    import broker.agent as agent_module

    live = set_live(agent, "a", "b")
    answers = iter([True, None, None, False, None])
    seen: list[bool] = []

    async def refuses(host: str, port: int) -> bool | None:
        return next(answers)

    monkeypatch.setattr(agent_module, "_refuses", refuses)
    monkeypatch.setattr(agent_module, "PEER_CONFIRM_SECONDS", 0.0)
    monkeypatch.setattr(agent_module, "PEER_PROBE_SECONDS", 0.0)

    async def scenario() -> None:
        for _ in range(5):
            await agent.confirm_peers(live)
            seen.append(1 in {a.node_id for a in agent.live_agents()})

    anyio.run(scenario)
    # refused: out; timed out twice: still out; accepted: back; timed out: still back
    assert seen == [False, False, False, True, True]


def test_a_peer_gone_between_accept_and_its_address_is_no_answer(monkeypatch) -> None:
    """A peer killed just after it accepted the probe: the socket is reset before the
    probe reads its addresses (ENOTCONN). That is no answer either way, not a failure of
    the request that asked (a FindCoordinator that failed so under agent kills)."""
    import broker.agent as agent_module

    connect = anyio.connect_tcp
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        async def connect_then_reset(host: str, port: int) -> Any:
            stream = await connect(host, port)
            accepted, _ = server.accept()  # in the backlog already
            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            accepted.close()  # a reset, as from a process killed
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            for _ in range(200):
                try:
                    raw.getpeername()
                except OSError:
                    return stream
                await anyio.sleep(0.01)
            pytest.fail("the reset did not arrive in 2 s")

        monkeypatch.setattr(anyio, "connect_tcp", connect_then_reset)
        assert anyio.run(agent_module._refuses, *server.getsockname()) is None
