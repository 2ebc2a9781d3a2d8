"""The group coordinator's state machine, driven directly with a fake clock on SQLite.

Timers never fire by themselves here: a test advances the clock and runs what is due.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from broker.groups.classic import GroupState, parse_subscription_topics
from broker.groups.coordinator import (
    Clock,
    GroupCoordinator,
    GroupSettings,
    JoinRequest,
    PartitionCommit,
    SyncRequest,
)
from broker.groups.timer import Timer
from metadata import groups as store
from metadata import keys, topics
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")
E = ErrorCode
SETTINGS = GroupSettings(
    min_session_timeout_ms=100,
    initial_rebalance_delay_ms=100,
    offsets_retention_ms=60_000,
)


class FakeClock(Clock):
    def __init__(self) -> None:
        self.t = 1_000_000

    def now_ms(self) -> int:
        return self.t

    def monotonic_ms(self) -> int:
        return self.t


class Placement:
    def __init__(self) -> None:
        self.owned = True

    async def refresh(self, *group_ids: str, fresh: bool = False) -> None:
        pass

    def is_local(self, group_id: str) -> bool:
        return self.owned


class Box:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None

    async def get(self, within: float = 5) -> Any:
        with anyio.fail_after(within):
            await self.done.wait()
        return self.value


class Harness:
    def __init__(self, kv: SQLiteKV, clock: FakeClock | None = None):
        self.kv = kv
        self.tasks: list[asyncio.Task[None]] = []
        self.clock = clock or FakeClock()
        self.placement = Placement()
        self.coord = GroupCoordinator(kv, SUB, SETTINGS, self.placement, self.clock)

    def other_coordinator(self) -> GroupCoordinator:
        """A second agent's coordinator on the same store (and clock)."""
        return GroupCoordinator(self.kv, SUB, SETTINGS, Placement(), self.clock)

    def start(self, fn: Callable[..., Any], *args: Any) -> Box:
        box = Box()

        async def run() -> None:
            box.value = await fn(*args)
            box.done.set()

        # Plain asyncio tasks: a fixture cannot hold a task group open across the test.
        self.tasks.append(asyncio.ensure_future(run()))
        return box

    async def until(self, condition: Callable[[], bool], within: float = 5) -> None:
        with anyio.fail_after(within):
            while not condition():  # noqa: ASYNC110 -- state changed by other tasks
                await anyio.sleep(0.005)

    async def advance(self, ms: int, coord: GroupCoordinator | None = None) -> None:
        self.clock.t += ms
        await (coord or self.coord).run_due_timers()

    def group(self, coord: GroupCoordinator | None = None) -> Any:
        return (coord or self.coord).loaded_group("g")


@pytest.fixture
def kv(tmp_path):
    return SQLiteKV(str(tmp_path / "meta.db"))


@pytest.fixture
async def h(kv):
    harness = Harness(kv)
    yield harness
    for task in harness.tasks:
        task.cancel()
    await asyncio.gather(*harness.tasks, return_exceptions=True)


def subscription(*topic_names: str) -> bytes:
    out = struct.pack(">hi", 0, len(topic_names))
    for t in topic_names:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def jreq(
    member_id: str = "",
    *,
    client: str = "c",
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"r"),),
    session: int = 10_000,
    rebalance: int = 5_000,
    protocol_type: str = "consumer",
    require_member_id: bool = False,
    group: str = "g",
) -> JoinRequest:
    return JoinRequest(
        group, member_id, instance, client, "/127.0.0.1", session, rebalance, protocol_type,
        protocols, require_known_member_id=require_member_id,
    )  # fmt: skip


def sreq(member_id: str, generation: int, assignments=(), instance=None, **kw) -> SyncRequest:
    return SyncRequest(
        kw.get("group", "g"), generation, member_id, instance, kw.get("protocol_type"),
        kw.get("protocol_name"), tuple(assignments),
    )  # fmt: skip


async def form_group(h: Harness, *clients: str, **kw: Any) -> list[Any]:
    """Members join a new group together; returns their JoinResults (first is leader)."""
    boxes = []
    for i, client in enumerate(clients):
        boxes.append(h.start(h.coord.join, jreq(client=client, **kw)))
        await h.until(lambda i=i: h.group() is not None and len(h.group().members) == i + 1)
    await h.advance(SETTINGS.initial_rebalance_delay_ms * 2)
    await h.advance(SETTINGS.initial_rebalance_delay_ms * 2)
    return [await b.get() for b in boxes]


async def stabilize(h: Harness, joined: list[Any], coord: GroupCoordinator | None = None) -> None:
    coord = coord or h.coord
    leader = next(j for j in joined if j.member_id == j.leader)
    assignments = [(j.member_id, b"assigned-" + j.member_id.encode()) for j in joined]
    boxes = [
        h.start(coord.sync, sreq(j.member_id, j.generation)) for j in joined if j is not leader
    ]
    result = await coord.sync(sreq(leader.member_id, leader.generation, assignments))
    assert result.error == E.none
    for box in boxes:
        assert (await box.get()).error == E.none


# -- the pure parts --------------------------------------------------------------------


def test_timer_keeps_the_last_deadline_per_key():
    timer = Timer()
    fired: list[str] = []

    def cb(name):
        async def run():
            fired.append(name)

        return run

    timer.schedule("a", 100, cb("a1"))
    timer.schedule("b", 50, cb("b"))
    timer.schedule("a", 200, cb("a2"))
    timer.schedule("c", 10, cb("c"))
    timer.cancel("c")
    assert timer.next_deadline() == 50
    assert len(timer.pop_due(150)) == 1
    assert timer.deadline("a") == 200 and len(timer) == 1
    assert timer.pop_due(199) == [] and len(timer.pop_due(200)) == 1
    assert timer.next_deadline() is None


def test_parse_subscription_topics():
    assert parse_subscription_topics(subscription("a", "bb")) == {"a", "bb"}
    assert parse_subscription_topics(b"\x00") is None
    assert parse_subscription_topics(subscription("a")[:-6]) is None


# -- joining ---------------------------------------------------------------------------


async def test_first_join_needs_a_member_id_then_the_initial_delay(h):
    first = await h.coord.join(jreq(client="app", require_member_id=True))
    assert first.error == E.member_id_required and first.member_id.startswith("app-")
    box = h.start(h.coord.join, jreq(first.member_id, require_member_id=True))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    await h.advance(99)
    assert not box.done.is_set()
    await h.advance(1)
    joined = await box.get()
    assert joined.error == E.none and joined.generation == 1
    assert joined.leader == first.member_id and joined.protocol_name == "range"
    assert [m.member_id for m in joined.members] == [first.member_id]
    assert h.group().state is GroupState.COMPLETING_REBALANCE
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert (stored.generation, stored.state) == (1, store.COMPLETING_REBALANCE)


async def test_joins_during_the_initial_delay_extend_it(h):
    a = h.start(h.coord.join, jreq(client="a"))
    await h.until(lambda: h.group() is not None)
    await h.advance(50)
    b = h.start(h.coord.join, jreq(client="b"))
    await h.until(lambda: len(h.group().members) == 2)
    await h.advance(50)  # first delay over, but a member came: one more delay
    assert not a.done.is_set()
    await h.advance(100)
    ra, rb = await a.get(), await b.get()
    assert ra.generation == rb.generation == 1
    assert len(ra.members) == 2 and rb.members == ()


async def test_protocol_is_chosen_by_votes_among_common_ones(h):
    joined = await form_group(h, "a", "b", "c", protocols=(("range", b""), ("roundrobin", b"")))
    assert {j.protocol_name for j in joined} == {"range"}
    # A member that prefers roundrobin does not outvote two that prefer range.
    late = h.start(h.coord.join, jreq(client="d", protocols=(("roundrobin", b""), ("range", b""))))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    rejoined = [h.start(h.coord.join, jreq(j.member_id, protocols=(("range", b""), ("roundrobin", b""))))
                for j in joined]  # fmt: skip
    results = [await b.get() for b in [late, *rejoined]]
    assert {r.protocol_name for r in results} == {"range"}
    assert {r.generation for r in results} == {2}


async def test_only_common_protocols_count(h):
    joined = await form_group(h, "a", protocols=(("range", b""), ("roundrobin", b"")))
    assert joined[0].protocol_name == "range"
    late = h.start(h.coord.join, jreq(client="b", protocols=(("roundrobin", b""),)))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    again = h.start(h.coord.join, jreq(joined[0].member_id, protocols=(("range", b""), ("roundrobin", b""))))  # fmt: skip
    assert (await late.get()).protocol_name == "roundrobin"
    assert (await again.get()).protocol_name == "roundrobin"


async def test_inconsistent_protocols_are_refused(h):
    await form_group(h, "a")
    other_type = await h.coord.join(jreq(client="b", protocol_type="connect"))
    assert other_type.error == E.inconsistent_group_protocol
    nothing_common = await h.coord.join(jreq(client="b", protocols=(("sticky", b""),)))
    assert nothing_common.error == E.inconsistent_group_protocol
    empty = await h.coord.join(jreq(client="x", protocols=(), group="other"))
    assert empty.error == E.inconsistent_group_protocol


async def test_request_checks(h):
    assert (await h.coord.join(jreq(group=""))).error == E.invalid_group_id
    assert (await h.coord.join(jreq(session=99))).error == E.invalid_session_timeout
    assert (await h.coord.join(jreq("who"))).error == E.unknown_member_id
    assert (await h.coord.sync(sreq("who", 1))).error == E.unknown_member_id
    assert await h.coord.heartbeat("g", 1, "who", None) == E.unknown_member_id


# -- syncing and heartbeats ------------------------------------------------------------


async def test_leader_assignment_reaches_every_member_and_is_stored(h):
    joined = await form_group(h, "a", "b", "c")
    leader = joined[0]
    assert leader.member_id == leader.leader and len(leader.members) == 3
    await stabilize(h, joined)
    assert h.group().state is GroupState.STABLE
    for j in joined:
        again = await h.coord.sync(sreq(j.member_id, j.generation))
        assert again.assignment == b"assigned-" + j.member_id.encode()
        assert again.protocol_type == "consumer" and again.protocol_name == "range"
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert stored.state == store.STABLE
    assert {m.member_id: m.assignment for m in stored.members} == {
        j.member_id: b"assigned-" + j.member_id.encode() for j in joined
    }


async def test_sync_and_heartbeat_errors(h):
    joined = await form_group(h, "a", "b")
    a, b = joined
    assert (await h.coord.sync(sreq(a.member_id, 7))).error == E.illegal_generation
    assert (await h.coord.sync(sreq("nobody", 1))).error == E.unknown_member_id
    bad_name = await h.coord.sync(sreq(a.member_id, 1, protocol_name="roundrobin"))
    assert bad_name.error == E.inconsistent_group_protocol
    await stabilize(h, joined)
    assert await h.coord.heartbeat("g", 1, b.member_id, None) == E.none
    assert await h.coord.heartbeat("g", 0, b.member_id, None) == E.illegal_generation
    assert await h.coord.heartbeat("g", 1, "nobody", None) == E.unknown_member_id
    # A third member starts a rebalance: the others hear of it by heartbeat and sync.
    h.start(h.coord.join, jreq(client="c"))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    assert await h.coord.heartbeat("g", 1, b.member_id, None) == E.rebalance_in_progress
    assert (await h.coord.sync(sreq(b.member_id, 1))).error == E.rebalance_in_progress


async def test_session_expiry_removes_the_member_and_rebalances(h):
    joined = await form_group(h, "a", "b", session=1000)
    await stabilize(h, joined)
    a, b = joined
    await h.advance(600)
    assert await h.coord.heartbeat("g", 1, a.member_id, None) == E.none
    await h.advance(600)
    # b sent nothing for 1200 ms: it is gone, the group rebalances.
    assert b.member_id not in h.group().members
    assert await h.coord.heartbeat("g", 1, a.member_id, None) == E.rebalance_in_progress
    assert await h.coord.heartbeat("g", 1, b.member_id, None) == E.unknown_member_id
    rejoined = await h.coord.join(jreq(a.member_id))
    assert rejoined.generation == 2 and [m.member_id for m in rejoined.members] == [a.member_id]
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert [m.member_id for m in stored.members] == [a.member_id]


async def test_members_that_do_not_rejoin_in_time_are_dropped(h):
    joined = await form_group(h, "a", "b", rebalance=2000)
    await stabilize(h, joined)
    a, b = joined
    box = h.start(h.coord.join, jreq(a.member_id, rebalance=2000))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    await h.advance(1000)
    assert await h.coord.heartbeat("g", 1, b.member_id, None) == E.rebalance_in_progress
    await h.advance(1000)  # the rebalance timeout: b never rejoined
    result = await box.get()
    assert result.generation == 2 and [m.member_id for m in result.members] == [a.member_id]


async def test_members_that_do_not_sync_in_time_are_dropped(h):
    joined = await form_group(h, "a", "b", rebalance=2000)
    a, b = joined
    follower = h.start(h.coord.sync, sreq(b.member_id, 1))
    await h.until(lambda: b.member_id not in h.group().pending_sync)
    await h.advance(2000)  # the leader never synced
    assert (await follower.get()).error == E.rebalance_in_progress
    assert a.member_id not in h.group().members
    assert h.group().state is GroupState.PREPARING_REBALANCE


# -- leaving ---------------------------------------------------------------------------


async def test_leave_rebalances_and_the_last_one_empties_the_group(h):
    joined = await form_group(h, "a", "b")
    await stabilize(h, joined)
    a, b = joined
    error, answers = await h.coord.leave("g", [(b.member_id, None), ("nobody", None)])
    assert error == E.none
    assert [e for _m, _i, e in answers] == [E.none, E.unknown_member_id]
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert stored.state == store.PREPARING_REBALANCE
    assert [m.member_id for m in stored.members] == [a.member_id]
    rejoined = await h.coord.join(jreq(a.member_id))
    assert rejoined.generation == 2
    await h.coord.leave("g", [(a.member_id, None)])
    group = h.group()
    assert group.state is GroupState.EMPTY and group.generation == 3
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert (stored.state, stored.generation, stored.members) == (store.EMPTY, 3, ())


async def test_admin_removes_a_static_member_by_instance_id(h):
    joined = await form_group(h, "a", instance="inst-a")
    await stabilize(h, joined)
    error, answers = await h.coord.leave("g", [("", "inst-a"), ("", "inst-x")])
    assert [e for _m, _i, e in answers] == [E.none, E.unknown_member_id]
    assert h.group().state is GroupState.EMPTY


# -- static membership -----------------------------------------------------------------


async def test_static_member_restart_gets_its_place_back_without_a_rebalance(h):
    a = h.start(h.coord.join, jreq(client="a", instance="inst-a"))
    await h.until(lambda: h.group() is not None)
    b = h.start(h.coord.join, jreq(client="b", instance="inst-b"))
    await h.until(lambda: len(h.group().members) == 2)
    await h.advance(200)
    await h.advance(200)
    joined = [await a.get(), await b.get()]
    await stabilize(h, joined)
    old_b = joined[1].member_id
    restarted = await h.coord.join(jreq(client="b", instance="inst-b"))
    assert restarted.error == E.none and restarted.member_id != old_b
    assert restarted.generation == 1 and restarted.leader == joined[0].member_id
    assert h.group().state is GroupState.STABLE
    synced = await h.coord.sync(sreq(restarted.member_id, 1, instance="inst-b"))
    assert synced.assignment == b"assigned-" + old_b.encode()
    # The old incarnation is fenced; the other member never noticed anything.
    assert await h.coord.heartbeat("g", 1, old_b, "inst-b") == E.fenced_instance_id
    assert await h.coord.heartbeat("g", 1, joined[0].member_id, "inst-a") == E.none
    stored = await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))
    assert restarted.member_id in {m.member_id for m in stored.members}


async def test_static_leader_restart_skips_the_assignment(h):
    joined = await form_group(h, "a", instance="inst-a")
    await stabilize(h, joined)
    restarted = await h.coord.join(jreq(client="a", instance="inst-a"))
    assert restarted.leader == restarted.member_id and restarted.skip_assignment
    assert len(restarted.members) == 1
    assert h.group().state is GroupState.STABLE


# -- offsets ---------------------------------------------------------------------------


@pytest.fixture
def topic(kv) -> topics.Topic:
    import uuid

    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 4, {}, 0)
    )


def offsets(topic: topics.Topic, value: int = 5) -> list[PartitionCommit]:
    return [PartitionCommit("t", p, value + p, 0, "m") for p in range(2)]


def resolver(kv: SQLiteKV) -> Callable[[str], Any]:
    async def resolve(name: str) -> topics.Topic | None:
        return await kv.read(lambda tr: topics.get_topic(tr, SUB, name))

    return resolve


async def commit(
    coord: GroupCoordinator, group: str, generation: int, member: str, parts: list[Any], **kw: Any
) -> ErrorCode:
    """Commit through the coordinator; the one error every partition got."""
    answers = await coord.commit_offsets(
        group, generation, member, None, parts, resolve_topic=resolver(coord.kv), **kw
    )
    (error,) = set(answers.values())
    return error


async def test_commit_rules_of_classic_groups(h, topic):
    coord = h.coord
    assert await commit(coord, "simple", -1, "", offsets(topic)) == E.none
    error, got, _unstable = await coord.fetch_offsets("simple", None)
    assert error == E.none and got[("t", 1)].offset == 6
    assert await commit(coord, "nogroup", 3, "m", offsets(topic)) == E.illegal_generation
    assert (
        await commit(coord, "nogroup", 3, "m", offsets(topic), api_version=9)
        == E.group_id_not_found
    )
    joined = await form_group(h, "a", "b")
    a, b = joined
    # Joined but not synced: CompletingRebalance.
    assert await commit(coord, "g", 1, a.member_id, offsets(topic)) == E.rebalance_in_progress
    await stabilize(h, joined)
    assert await commit(coord, "g", 1, a.member_id, offsets(topic)) == E.none
    assert await commit(coord, "g", 2, a.member_id, offsets(topic)) == E.illegal_generation
    assert await commit(coord, "g", 1, "x", offsets(topic)) == E.unknown_member_id
    assert await commit(coord, "g", -1, "", offsets(topic)) == E.unknown_member_id
    # A rebalance starts: members may still commit what they processed in generation 1.
    h.start(coord.join, jreq(client="c"))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    assert await commit(coord, "g", 1, b.member_id, offsets(topic, 50)) == E.none
    _error, got, _unstable = await coord.fetch_offsets("g", {"t": [0, 1]})
    assert {k: v.offset for k, v in got.items()} == {("t", 0): 50, ("t", 1): 51}


async def test_offsets_retention_for_empty_and_simple_groups(h, topic):
    coord = h.coord
    await commit(coord, "simple", -1, "", offsets(topic))
    joined = await form_group(h, "a")
    await stabilize(h, joined)
    await commit(coord, "g", 1, joined[0].member_id, offsets(topic))
    await h.advance(50_000)
    await coord.leave("g", [(joined[0].member_id, None)])  # Empty from now on
    assert await coord.expire_offsets() == 0
    await h.advance(10_000)  # the simple group's offsets are 60 s old
    assert await coord.expire_offsets() == 2
    assert (await coord.describe("simple")).state == "Dead"
    assert (await coord.fetch_offsets("g", None))[1] != {}
    await h.advance(50_000)  # "g" has been Empty for 60 s
    assert await coord.expire_offsets() == 2
    assert (await coord.describe("g")).state == "Dead"
    assert await h.kv.read(lambda tr: store.list_groups(tr, SUB)) == []


async def test_stable_consumer_group_keeps_offsets_of_subscribed_topics(h, topic):
    joined = await form_group(h, "a", protocols=(("range", subscription("t")),))
    await stabilize(h, joined)
    await commit(h.coord, "g", 1, joined[0].member_id, offsets(topic))
    await h.advance(120_000)
    await h.coord.heartbeat("g", 1, joined[0].member_id, None)
    assert await h.coord.expire_offsets() == 0


async def test_delete_groups_and_offsets(h, topic):
    coord = h.coord
    assert await coord.delete_group("nope") == E.group_id_not_found
    joined = await form_group(h, "a", protocols=(("range", subscription("t")),))
    await stabilize(h, joined)
    await commit(coord, "g", 1, joined[0].member_id, offsets(topic))
    assert await coord.delete_group("g") == E.non_empty_group
    error, answers = await coord.delete_offsets(
        "g", [("t", 0), ("u", 0)], resolve_topic=resolver(h.kv)
    )
    assert error == E.none
    assert answers == {
        ("t", 0): E.group_subscribed_to_topic,
        ("u", 0): E.unknown_topic_or_partition,
    }
    await coord.leave("g", [(joined[0].member_id, None)])
    error, answers = await coord.delete_offsets("g", [("t", 0)], resolve_topic=resolver(h.kv))
    assert answers == {("t", 0): E.none}
    assert sorted((await coord.fetch_offsets("g", None))[1]) == [("t", 1)]
    assert await coord.delete_group("g") == E.none
    assert (await coord.fetch_offsets("g", None))[1] == {}
    assert (await coord.describe("g")).state == "Dead"
    assert await coord.delete_offsets("g", [], resolve_topic=resolver(h.kv)) == (
        E.group_id_not_found,
        {},
    )


async def test_offset_delete_in_a_non_consumer_group_with_members(h, topic):
    joined = await form_group(h, "a", protocol_type="connect")
    await stabilize(h, joined)
    error, _answers = await h.coord.delete_offsets("g", [("t", 0)], resolve_topic=resolver(h.kv))
    assert error == E.non_empty_group


# -- describe and list -----------------------------------------------------------------


async def test_describe_and_list(h):
    joined = await form_group(h, "a", "b", protocols=(("range", b"meta"),))
    described = await h.coord.describe("g")
    assert described.state == "CompletingRebalance" and described.protocol_data == ""
    assert {m.metadata for m in described.members} == {b""}
    await stabilize(h, joined)
    described = await h.coord.describe("g")
    assert (described.state, described.protocol_type, described.protocol_data) == (
        "Stable",
        "consumer",
        "range",
    )
    assert {m.metadata for m in described.members} == {b"meta"}
    assert {m.client_id for m in described.members} == {"a", "b"}
    listed = await h.coord.list_groups()
    assert [(g.group_id, g.protocol_type, g.state, g.group_type) for g in listed] == [
        ("g", "consumer", "Stable", "classic")
    ]
    h.placement.owned = False
    assert await h.coord.list_groups() == []
    assert (await h.coord.describe("g")).error == E.not_coordinator


# -- several agents --------------------------------------------------------------------


async def test_losing_the_group_answers_parked_requests_not_coordinator(h):
    joined = await form_group(h, "a", "b")
    await stabilize(h, joined)
    parked = h.start(h.coord.join, jreq(joined[0].member_id))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    h.placement.owned = False
    await h.coord.check_ownership()
    assert (await parked.get()).error == E.not_coordinator
    assert h.group() is None
    assert await h.coord.heartbeat("g", 1, joined[1].member_id, None) == E.not_coordinator


async def test_new_coordinator_loads_the_group_and_members_carry_on(h, topic):
    joined = await form_group(h, "a", "b")
    await stabilize(h, joined)
    await commit(h.coord, "g", 1, joined[0].member_id, offsets(topic, 77))
    other = h.other_coordinator()
    for j in joined:
        assert await other.heartbeat("g", 1, j.member_id, None) == E.none
    group = other.loaded_group("g")
    assert group.state is GroupState.STABLE and group.leader_id == joined[0].member_id
    synced = await other.sync(sreq(joined[1].member_id, 1))
    assert synced.assignment == b"assigned-" + joined[1].member_id.encode()
    assert (await other.fetch_offsets("g", {"t": [0, 1]}))[1][("t", 0)].offset == 77
    assert await commit(other, "g", 1, joined[1].member_id, offsets(topic)) == E.none


async def test_a_group_loaded_mid_rebalance_rebalances(h):
    joined = await form_group(h, "a", "b", rebalance=2000)
    await stabilize(h, joined)
    await h.coord.leave("g", [(joined[1].member_id, None)])
    other = h.other_coordinator()
    assert await other.heartbeat("g", 1, joined[0].member_id, None) == E.rebalance_in_progress
    rejoined = await other.join(jreq(joined[0].member_id, rebalance=2000))
    assert rejoined.error == E.none and rejoined.generation == 2


async def test_a_stale_coordinator_is_fenced(h, topic):
    joined = await form_group(h, "a", "b", "c")
    await stabilize(h, joined)
    a, b, c = joined
    other = h.other_coordinator()
    # The other agent takes the group over and writes it (c leaves) ...
    assert await other.heartbeat("g", 1, a.member_id, None) == E.none
    await other.leave("g", [(c.member_id, None)])
    # ... so the first agent's next write of its stale copy is refused, and it lets go.
    error, _answers = await h.coord.leave("g", [(b.member_id, None)])
    assert error == E.not_coordinator and h.group() is None
    # Generation 1 is still the stored one: commits for it are fine anywhere.
    assert await commit(h.coord, "g", 1, a.member_id, offsets(topic)) == E.none
    # The other agent completes generation 2; a commit for generation 1 through a copy
    # that missed it is fenced by the stored generation.
    rejoined = [other.join(jreq(j.member_id)) for j in (a, b)]
    boxes = [h.start(lambda r=r: r) for r in rejoined]
    results = [await box.get() for box in boxes]
    assert {r.generation for r in results} == {2}
    assert h.group().generation == 1  # loaded again by the commit above, before generation 2
    assert await commit(h.coord, "g", 1, a.member_id, offsets(topic, 9)) == E.not_coordinator
    assert h.group() is None
    _e, got, _u = await other.fetch_offsets("g", {"t": [0, 1]})
    assert got[("t", 0)].offset == 5


async def test_requests_act_on_a_group_in_the_order_they_arrive(h, topic):
    """Two pipelined commits from one connection: the later one wins even if the first
    is slow, as Kafka handles a connection's requests one after another."""
    resolve = resolver(h.kv)

    async def slow(name: str) -> Any:
        await anyio.sleep(0.1)
        return await resolve(name)

    tasks = [
        asyncio.ensure_future(
            h.coord.commit_offsets(
                "g", -1, "", None, [PartitionCommit("t", 0, offset, -1, None)],
                resolve_topic=resolver_,
            )
        )
        for offset, resolver_ in ((10, slow), (20, resolve))
    ]  # fmt: skip
    await asyncio.gather(*tasks)
    _error, got, _unstable = await h.coord.fetch_offsets("g", {"t": [0, 1]})
    assert got[("t", 0)].offset == 20


async def test_a_join_sent_again_answers_both(h):
    first = await h.coord.join(jreq(client="a", require_member_id=True))
    member_id = first.member_id
    one = h.start(h.coord.join, jreq(member_id, require_member_id=True))
    await h.until(lambda: h.group().state is GroupState.PREPARING_REBALANCE)
    two = h.start(h.coord.join, jreq(member_id, require_member_id=True))
    await h.until(lambda: len(h.group().members[member_id].superseded_joins) == 1)
    await h.advance(100)
    r1, r2 = await one.get(), await two.get()
    assert r1 == r2 and r1.generation == 1
    assert h.group().awaiting_join_count == 0


async def test_offsets_held_by_an_open_transaction_are_unstable(h, topic):
    from metadata import txns

    await commit(h.coord, "g", -1, "", offsets(topic))
    await h.kv.transact(
        lambda tr: txns.put_pending_offset(tr, SUB, "tx-1", "g", "t", 1, 99, 0, None)
    )
    error, got, unstable = await h.coord.fetch_offsets("g", {"t": [0, 1, 2]}, require_stable=True)
    assert (error, sorted(got), unstable) == (E.none, [("t", 0), ("t", 1)], {("t", 1)})
    assert (await h.coord.fetch_offsets("g", None, require_stable=True))[2] == {("t", 1)}
    assert (await h.coord.fetch_offsets("g", None))[2] == set()
