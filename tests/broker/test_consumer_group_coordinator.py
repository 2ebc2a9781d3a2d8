"""The coordinator running consumer-protocol (KIP-848) groups beside classic ones, driven
directly on SQLite with a fake clock: what is stored, what another agent loads, the mix
of group kinds, member epochs on offsets, admin answers and timeouts."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker.groups.consumer_machine import HeartbeatRequest
from broker.groups.coordinator import GroupCoordinator
from broker.groups.settings import ConsumerGroupSettings
from metadata import consumer_groups as cstore
from metadata import groups as store
from metadata import topics
from metadata.sqlite_kv import SQLiteKV
from tests.broker.test_group_coordinator import (
    SETTINGS,
    SUB,
    FakeClock,
    PartitionCommit,
    Placement,
    form_group,
    jreq,
    stabilize,
)
from tests.broker.test_group_coordinator import (
    Harness as ClassicHarness,
)

E = ErrorCode
CONSUMER = ConsumerGroupSettings(session_timeout_ms=10_000, heartbeat_interval_ms=1_000)


class Harness(ClassicHarness):
    def __init__(self, kv: SQLiteKV, clock: FakeClock | None = None):
        self.kv = kv
        self.tasks = []
        self.clock = clock or FakeClock()
        self.placement = Placement()
        self.coord = self.coordinator(self.placement)

    def coordinator(self, placement: Placement | None = None) -> GroupCoordinator:
        coord = GroupCoordinator(
            self.kv, SUB, SETTINGS, placement or Placement(), self.clock, CONSUMER
        )
        coord.consumers.topics_cache_seconds = 0
        return coord

    def other_coordinator(self) -> GroupCoordinator:
        return self.coordinator()

    async def create_topic(self, name: str, partitions: int) -> bytes:
        topic_id = uuid.uuid4().bytes
        await self.kv.transact(
            lambda tr: topics.create_topic(tr, SUB, name, topic_id, partitions, {}, 0)
        )
        return topic_id


@pytest.fixture
def kv(tmp_path):
    return SQLiteKV(str(tmp_path / "meta.db"))


@pytest.fixture
def h(kv):
    return Harness(kv)


def join(member: str, *topic_names: str, group: str = "g", **kw) -> HeartbeatRequest:
    return HeartbeatRequest(
        group, member, 0, rebalance_timeout_ms=5_000,
        subscribed_topic_names=topic_names, topic_partitions=(), **kw,
    )  # fmt: skip


def beat(member: str, epoch: int, owned=None, group: str = "g") -> HeartbeatRequest:
    return HeartbeatRequest(group, member, epoch, topic_partitions=owned)


async def hb(coord: GroupCoordinator, req: HeartbeatRequest, version: int = 1):
    return await coord.consumer_heartbeat(req, "client", "/127.0.0.1", version)


def count(answer) -> int:
    return sum(len(ps) for _t, ps in answer.assignment or ())


async def settle(coord: GroupCoordinator, answers: dict[str, object]) -> dict[str, object]:
    """Heartbeat every member, owning what it was given, until nothing changes."""
    for _ in range(10):
        changed = False
        for member, answer in list(answers.items()):
            owned = answer.assignment  # type: ignore[attr-defined]
            new = await hb(coord, beat(member, answer.member_epoch, owned))  # type: ignore[attr-defined]
            assert new.error == E.none, new
            if new.assignment is None:
                new = type(new)(new.error, new.error_message, new.member_id, new.member_epoch,
                                new.heartbeat_interval_ms, owned)  # fmt: skip
            if new != answer:
                changed = True
            answers[member] = new
        if not changed:
            return answers
    raise AssertionError("the group did not settle")


async def test_members_get_an_even_assignment_that_is_stored(h):
    await h.create_topic("t", 6)
    a = await hb(h.coord, join("a", "t"))
    b = await hb(h.coord, join("b", "t"))
    assert a.error == b.error == E.none
    answers = await settle(h.coord, {"a": a, "b": b})
    assert sorted(count(x) for x in answers.values()) == [3, 3]
    stored = await h.kv.read(lambda tr: cstore.get_consumer_group(tr, SUB, "g"))
    assert stored is not None and {m.member_id for m in stored.members} == {"a", "b"}
    held = [p for m in stored.members for p in m.assigned]
    assert len(held) == len(set(held)) == 6


async def test_a_v0_member_gets_an_id_from_the_coordinator(h):
    await h.create_topic("t", 1)
    answer = await hb(h.coord, join("", "t"), version=0)
    assert answer.error == E.none and len(answer.member_id) == 22


async def test_another_coordinator_loads_the_group_and_members_keep_their_assignment(h):
    await h.create_topic("t", 4)
    answers = await settle(
        h.coord, {"a": await hb(h.coord, join("a", "t")), "b": await hb(h.coord, join("b", "t"))}
    )
    h.placement.owned = False
    assert (await hb(h.coord, beat("a", answers["a"].member_epoch))).error == E.not_coordinator
    other = h.other_coordinator()
    for member, answer in answers.items():
        again = await hb(other, beat(member, answer.member_epoch, answer.assignment))
        assert again.error == E.none
        assert again.member_epoch == answer.member_epoch
        assert again.assignment is None or again.assignment == answer.assignment


async def test_a_stale_coordinator_is_fenced_by_the_store(h):
    await h.create_topic("t", 2)
    a = await hb(h.coord, join("a", "t"))
    other = h.other_coordinator()
    assert (await hb(other, join("b", "t"))).error == E.none  # other wrote the group
    stale = await hb(h.coord, join("c", "t"))
    assert stale.error == E.not_coordinator
    assert h.coord.consumers.shell.slot("g").consumer is None
    assert a.error == E.none


async def test_a_classic_group_with_members_refuses_consumer_members_and_back(h):
    await h.create_topic("t", 2)
    joined = await form_group(h, "x")
    await stabilize(h, joined)
    refused = await hb(h.coord, join("a", "t"))
    assert refused.error == E.group_id_not_found
    assert refused.error_message == "Group g is not a consumer group."
    assert (await hb(h.coord, join("a", "t", group="k"))).error == E.none
    classic = await h.coord.join(jreq(client="y", group="k"))
    assert classic.error == E.inconsistent_group_protocol


async def test_an_empty_group_of_either_kind_is_taken_over_with_its_offsets(h):
    await h.create_topic("t", 2)
    simple = [PartitionCommit("t", 0, 42, -1, "")]
    commit = await h.coord.commit_offsets("g", -1, "", None, simple, resolve_topic=_resolver(h))
    assert commit == {("t", 0): E.none}
    assert (await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))) is not None
    a = await hb(h.coord, join("a", "t"))
    assert a.error == E.none
    assert (await h.kv.read(lambda tr: store.get_group(tr, SUB, "g"))) is None
    _err, offsets, _u = await h.coord.fetch_offsets("g", {"t": [0]})
    assert offsets[("t", 0)].offset == 42
    left = await hb(h.coord, beat("a", -1))
    assert left.error == E.none
    box = h.start(h.coord.join, jreq(client="y"))
    await h.until(lambda: h.group() is not None)
    await h.advance(SETTINGS.initial_rebalance_delay_ms * 2)
    assert (await box.get()).error == E.none
    assert (await h.kv.read(lambda tr: cstore.get_consumer_group(tr, SUB, "g"))) is None
    _err, offsets, _u = await h.coord.fetch_offsets("g", {"t": [0]})
    assert offsets[("t", 0)].offset == 42


def _resolver(h: Harness):
    async def resolve(name: str):
        return await h.kv.read(lambda tr: topics.get_topic(tr, SUB, name))

    return resolve


async def test_offset_commit_and_fetch_check_the_member_epoch(h):
    await h.create_topic("t", 2)
    answers = await settle(h.coord, {"a": await hb(h.coord, join("a", "t"))})
    epoch = answers["a"].member_epoch
    part = [PartitionCommit("t", 1, 7, -1, "")]
    resolve = _resolver(h)

    async def commit(member, at, version=9):
        result = await h.coord.commit_offsets(
            "g", at, member, None, part, resolve_topic=resolve, api_version=version
        )
        return result[("t", 1)]

    assert await commit("a", epoch) == E.none
    assert await commit("a", epoch - 1) == E.stale_member_epoch
    assert await commit("a", epoch + 1) == E.stale_member_epoch
    assert await commit("nobody", epoch) == E.unknown_member_id
    assert await commit("a", epoch, version=8) == E.unsupported_version
    assert await commit("", -1) == E.unknown_member_id  # the group has members
    fetch = h.coord.fetch_offsets
    assert (await fetch("g", {"t": [1]}, member_id="a", member_epoch=epoch))[0] == E.none
    assert (await fetch("g", {"t": [1]}, member_id="a", member_epoch=0))[0] == (
        E.stale_member_epoch
    )
    assert (await fetch("g", {"t": [1]}, member_id="z", member_epoch=epoch))[0] == (
        E.unknown_member_id
    )
    error, offsets, _ = await fetch("g", {"t": [1]})
    assert error == E.none and offsets[("t", 1)].offset == 7
    await hb(h.coord, beat("a", -1))
    assert await commit("", -1) == E.none  # an admin's commit to the Empty group


async def test_session_expiry_removes_the_member_and_frees_its_partitions(h):
    await h.create_topic("t", 4)
    answers = await settle(
        h.coord, {"a": await hb(h.coord, join("a", "t")), "b": await hb(h.coord, join("b", "t"))}
    )
    h.clock.t += 6_000
    answers = {
        "a": await hb(h.coord, beat("a", answers["a"].member_epoch, answers["a"].assignment))
    }
    await h.advance(5_000)  # b's session ran out, a's did not
    group = h.coord.slot("g").consumer.group
    assert set(group.members) == {"a"}
    answers = await settle(h.coord, answers)
    assert count(answers["a"]) == 4


async def test_list_describe_and_delete(h):
    await h.create_topic("t", 3)
    await settle(h.coord, {"a": await hb(h.coord, join("a", "t"))})
    listed = {g.group_id: g for g in await h.coord.list_groups()}
    assert listed["g"].group_type == "consumer" and listed["g"].protocol_type == "consumer"
    assert listed["g"].state == "Stable"
    described = await h.coord.consumer_describe("g", 1)
    assert described.error_code == E.none and described.group_state == "Stable"
    assert [m.member_id for m in described.members] == ["a"]
    assert sum(len(t.partitions) for t in described.members[0].assignment.topic_partitions) == 3
    classic = await h.coord.describe("g")
    assert classic.state == "Dead" and classic.error == E.none
    assert await h.coord.delete_group("g") == E.non_empty_group
    await hb(h.coord, beat("a", -1))
    assert {g.group_id: g.state for g in await h.coord.list_groups()}["g"] == "Empty"
    assert await h.coord.delete_group("g") == E.none
    assert (await h.kv.read(lambda tr: cstore.get_consumer_group(tr, SUB, "g"))) is None
    missing = await h.coord.consumer_describe("g", 1)
    assert missing.error_code == E.group_id_not_found


async def test_a_new_topic_matching_a_regex_is_assigned_on_the_next_heartbeat(h):
    await h.create_topic("in-a", 2)
    first = await hb(
        h.coord,
        HeartbeatRequest(
            "g", "a", 0, rebalance_timeout_ms=5_000, subscribed_topic_regex="in-.*",
            topic_partitions=(),
        ),
    )  # fmt: skip
    answers = await settle(h.coord, {"a": first})
    assert count(answers["a"]) == 2
    await h.create_topic("in-b", 3)
    answers = await settle(h.coord, answers)
    assert count(answers["a"]) == 5


async def test_offsets_expire_by_commit_time_except_subscribed_topics(h):
    await h.create_topic("t", 1)
    await h.create_topic("u", 1)
    answers = await settle(h.coord, {"a": await hb(h.coord, join("a", "t"))})
    epoch = answers["a"].member_epoch
    commits = [PartitionCommit("t", 0, 5, -1, ""), PartitionCommit("u", 0, 6, -1, "")]
    resolve = _resolver(h)
    result = await h.coord.commit_offsets(
        "g", epoch, "a", None, commits, resolve_topic=resolve, api_version=9
    )
    assert set(result.values()) == {E.none}
    h.clock.t += SETTINGS.offsets_retention_ms
    answers = await settle(h.coord, answers)  # a's session goes on
    assert await h.coord.expire_offsets() == 1  # u's offset: no member subscribes to u
    _e, offsets, _u = await h.coord.fetch_offsets("g", None)
    assert set(offsets) == {("t", 0)}
    await hb(h.coord, beat("a", -1))
    assert await h.coord.expire_offsets() == 1
    assert (await h.kv.read(lambda tr: cstore.get_consumer_group(tr, SUB, "g"))) is None
    assert h.coord.slot("g") is None or h.coord.slot("g").consumer is None


async def test_offset_delete_refuses_subscribed_topics(h):
    await h.create_topic("t", 1)
    await h.create_topic("u", 1)
    answers = await settle(h.coord, {"a": await hb(h.coord, join("a", "t"))})
    epoch = answers["a"].member_epoch
    commits = [PartitionCommit("t", 0, 5, -1, ""), PartitionCommit("u", 0, 6, -1, "")]
    resolve = _resolver(h)
    await h.coord.commit_offsets(
        "g", epoch, "a", None, commits, resolve_topic=resolve, api_version=9
    )
    error, answers = await h.coord.delete_offsets("g", [("t", 0), ("u", 0)], resolve_topic=resolve)
    assert error == E.none
    assert answers == {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none}
    _e, offsets, _u = await h.coord.fetch_offsets("g", None)
    assert set(offsets) == {("t", 0)}


def test_the_heartbeat_request_is_read_with_topic_ids_as_bytes():
    from broker.handlers import consumer_group_heartbeat, load_all
    from tests.e2e import wire

    registry = load_all()
    assert (registry[68].min_version, registry[68].max_version) == (0, 1)
    assert (registry[69].min_version, registry[69].max_version) == (0, 1)
    topic_id = uuid.uuid4()
    request = wire.request(
        68, 1, group_id="g", member_id="m", member_epoch=3, rebalance_timeout=-1,
        subscribed_topic_names=None, topic_partitions=[{"topic_id": topic_id, "partitions": [2, 0]}],
    )  # fmt: skip
    read = consumer_group_heartbeat._request(request)
    assert read.topic_partitions == ((topic_id.bytes, (2, 0)),)
    assert read.rebalance_timeout_ms == -1 and read.subscribed_topic_names is None
    # v0 has no subscribed_topic_regex field at all.
    request = wire.request(
        68, 0, group_id="g", member_id="m", member_epoch=0, rebalance_timeout=5000,
        subscribed_topic_names=["t"], topic_partitions=[],
    )  # fmt: skip
    read = consumer_group_heartbeat._request(request)
    assert read.subscribed_topic_regex is None and read.subscribed_topic_names == ("t",)


def test_consumer_group_options_are_checked_at_start():
    from broker.cli import config_from_args, parse_serve_args
    from broker.config import BrokerConfig

    with pytest.raises(ValueError, match="unknown assignor"):
        BrokerConfig(group_consumer_assignors=("sticky",))
    with pytest.raises(ValueError, match="below"):
        BrokerConfig(group_consumer_heartbeat_interval_ms=50_000)
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--group-consumer-assignors", "uniform,sticky"])
    _parser, args = parse_serve_args(
        ["serve", "--group-consumer-assignors", "range", "--group-consumer-max-size", "7",
         "--group-consumer-session-timeout-ms", "9000",
         "--group-consumer-heartbeat-interval-ms", "900"]
    )  # fmt: skip
    settings = config_from_args(args).consumer_group_settings
    assert settings == ConsumerGroupSettings(9000, 900, 7, ("range",))
