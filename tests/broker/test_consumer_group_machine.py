"""The consumer group machine (KIP-848) driven by simulated members: joins, revocation before
reassignment, leaving, timeouts, static members, regex subscriptions, topic changes, and
the errors Apache Kafka answers; a seeded property test checks that no partition is ever
held by two members and that every partition is assigned once heartbeats converge.

A simulated member does what a client does: it sends its owned partitions with every
heartbeat, and when an answer carries an assignment it gives up what is not in it and takes
what is (so a revocation is acknowledged by its next heartbeat).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from broker.groups.actions import CancelTimeout, Persist, Respond, ScheduleTimeout
from broker.groups.consumer import (
    ConsumerGroup,
    ConsumerGroupState,
    MemberState,
    by_topic,
    describe,
    from_topics,
    listed_state,
)
from broker.groups.consumer_machine import (
    ConsumerGroupMachine,
    Heartbeat,
    HeartbeatAnswer,
    HeartbeatRequest,
    Load,
    RebalanceExpired,
    SessionExpired,
    Transition,
    rebalance_key,
    session_key,
)
from broker.groups.settings import ConsumerGroupSettings

E = ErrorCode
SETTINGS = ConsumerGroupSettings()
MACHINE = ConsumerGroupMachine(SETTINGS)
GROUP = "g"
NOW = 1_000_000
ORDERS = b"\x07" * 16
TOPICS = {"orders": (ORDERS, 12)}


@dataclass
class Client:
    member_id: str
    names: tuple[str, ...] | None = ("orders",)
    regex: str | None = None
    instance_id: str | None = None
    assignor: str | None = None
    epoch: int = 0
    owned: frozenset[tuple[bytes, int]] = field(default_factory=frozenset)

    def request(self, epoch: int | None = None) -> HeartbeatRequest:
        epoch = self.epoch if epoch is None else epoch
        joining = epoch == 0
        return HeartbeatRequest(
            GROUP,
            self.member_id,
            epoch,
            instance_id=self.instance_id,
            rebalance_timeout_ms=60_000 if joining else -1,
            subscribed_topic_names=self.names if joining else None,
            subscribed_topic_regex=self.regex if joining else None,
            server_assignor=self.assignor if joining else None,
            topic_partitions=by_topic(self.owned) if not joining else (),
        )


class Driver:
    """The group as the coordinator holds it, and the transitions so far."""

    def __init__(self, machine: ConsumerGroupMachine = MACHINE) -> None:
        self.machine = machine
        self.group: ConsumerGroup | None = None
        self.topics = dict(TOPICS)
        self.last: Transition = Transition(None)

    def send(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        self.last = self.machine.handle(self.group, Heartbeat(request, self.topics), NOW)
        self.group = self.last.group
        respond = self.last.actions[-1]
        assert isinstance(respond, Respond)
        if self.group is not None:
            check_no_partition_held_twice(self.group)
        return respond.answer

    def beat(self, client: Client, epoch: int | None = None) -> HeartbeatAnswer:
        answer = self.send(client.request(epoch))
        if answer.error is E.none:
            client.epoch = answer.member_epoch
            if answer.assignment is not None:
                client.owned = from_topics(answer.assignment)
        return answer

    def event(self, event) -> Transition:
        self.last = self.machine.handle(self.group, event, NOW)
        self.group = self.last.group
        return self.last

    def converge(
        self, clients: list[Client], rounds: int = 10, state=ConsumerGroupState.STABLE
    ) -> None:
        for _ in range(rounds):
            for c in clients:
                assert self.beat(c).error is E.none
        assert self.group is not None and self.group.state is state


def check_no_partition_held_twice(group: ConsumerGroup) -> None:
    seen: dict[tuple[bytes, int], str] = {}
    for m in group.members.values():
        assert not (m.assigned & m.pending_revocation), m
        for tp in m.owned:
            assert tp not in seen, f"{tp} held by {seen[tp]} and {m.member_id}"
            seen[tp] = m.member_id


def all_partitions(topic: bytes = ORDERS, count: int = 12) -> frozenset[tuple[bytes, int]]:
    return frozenset((topic, p) for p in range(count))


def actions_of(t: Transition, kind: type) -> list:
    return [a for a in t.actions if isinstance(a, kind)]


# -- joining and reconciling -------------------------------------------------------------


def test_three_members_on_twelve_partitions_reach_a_stable_even_assignment():
    d = Driver()
    clients = [Client(m) for m in ("a", "b", "c")]
    d.converge(clients)
    g = d.group
    assert g.group_epoch == g.assignment_epoch == 3  # one bump per join
    assert sorted(len(c.owned) for c in clients) == [4, 4, 4]
    assert frozenset().union(*(c.owned for c in clients)) == all_partitions()
    for c in clients:
        assert c.epoch == 3 and g.members[c.member_id].assigned == c.owned


def test_the_first_join_is_answered_with_its_assignment_after_it_is_persisted():
    d = Driver()
    answer = d.beat(Client("a"))
    assert answer.member_epoch == 1 and answer.heartbeat_interval_ms == 5_000
    assert from_topics(answer.assignment) == all_partitions()
    kinds = [type(a) for a in d.last.actions]
    assert kinds[0] is Persist and kinds[-1] is Respond
    assert ScheduleTimeout(SessionExpired("a"), 45_000) in d.last.actions
    assert ConsumerGroup.from_stored(actions_of(d.last, Persist)[0].group) == d.group


def test_a_member_joining_mid_way_gets_partitions_only_once_they_are_revoked():
    d = Driver()
    a, b = Client("a"), Client("b")
    d.converge([a, b])
    before = {"a": a.owned, "b": b.owned}
    c = Client("c")
    first = d.beat(c)
    # The target gives c four partitions, but a and b still hold them all.
    assert first.member_epoch == 3 and from_topics(first.assignment) == frozenset()
    assert d.group.members["c"].state is MemberState.UNRELEASED_PARTITIONS
    revoke = d.beat(a)
    member_a = d.group.members["a"]
    assert member_a.state is MemberState.UNREVOKED_PARTITIONS and revoke.member_epoch == 2
    assert len(member_a.pending_revocation) == 2 and a.owned == member_a.assigned
    assert a.owned <= before["a"]  # what stays with a never stopped
    assert ScheduleTimeout(RebalanceExpired("a", 2), 60_000) in d.last.actions
    # c cannot get a's revoked partitions until a says it gave them up.
    d.beat(c)
    assert not (c.owned & member_a.pending_revocation)
    ack = d.beat(a)
    assert ack.member_epoch == 3 and d.group.members["a"].state is MemberState.STABLE
    assert CancelTimeout(rebalance_key("a")) in d.last.actions
    d.beat(c)
    assert member_a.pending_revocation <= c.owned
    d.converge([a, b, c])
    assert sorted(len(x.owned) for x in (a, b, c)) == [4, 4, 4]
    assert a.owned <= before["a"] and b.owned <= before["b"]


def test_a_stable_member_that_sends_nothing_new_gets_no_assignment():
    d = Driver()
    a = Client("a")
    d.converge([a])
    answer = d.send(HeartbeatRequest(GROUP, "a", a.epoch))
    assert answer.error is E.none and answer.assignment is None
    assert actions_of(d.last, Persist) == []


def test_a_member_one_epoch_behind_with_a_subset_of_its_partitions_goes_on():
    d = Driver()
    a = Client("a")
    d.converge([a])
    b = Client("b")
    d.beat(b)  # epoch 2; a is asked to revoke
    d.beat(a)
    d.beat(a)  # a reaches epoch 2 ...
    assert a.epoch == 2
    # ... but suppose it never got that answer: it comes back with epoch 1.
    late = d.send(HeartbeatRequest(GROUP, "a", 1, topic_partitions=by_topic(a.owned)))
    assert late.error is E.none and late.member_epoch == 2


# -- leaving -----------------------------------------------------------------------------


def test_leaving_with_epoch_minus_one_frees_its_partitions_for_the_others():
    d = Driver()
    a, b, c = Client("a"), Client("b"), Client("c")
    d.converge([a, b, c])
    epoch = d.group.group_epoch
    answer = d.send(HeartbeatRequest(GROUP, "c", -1))
    assert (answer.error, answer.member_id, answer.member_epoch) == (E.none, "c", -1)
    assert "c" not in d.group.members and d.group.group_epoch == epoch + 1
    assert CancelTimeout(session_key("c")) in d.last.actions
    assert isinstance(d.last.actions[0], Persist)
    d.converge([a, b])
    assert sorted(len(x.owned) for x in (a, b)) == [6, 6]


def test_a_static_member_leaving_with_minus_two_keeps_its_assignment_and_gets_it_back():
    d = Driver()
    a, s = Client("a"), Client("s-1", instance_id="inst")
    d.converge([a, s])
    kept = s.owned
    epoch = d.group.group_epoch
    answer = d.send(HeartbeatRequest(GROUP, "s-1", -2, instance_id="inst"))
    assert answer.member_epoch == -2 and d.group.members["s-1"].member_epoch == -2
    assert d.group.group_epoch == epoch and d.group.members["s-1"].assigned == kept
    # The others do not take its partitions meanwhile; the group waits for it, as Kafka's
    # does: a member at epoch -2 is not reconciled.
    d.converge([a], state=ConsumerGroupState.RECONCILING)
    assert not (a.owned & kept)
    # The instance restarts with a new member id, within its session.
    back = Client("s-2", instance_id="inst")
    answer = d.beat(back)
    assert answer.error is E.none and back.owned == kept
    assert "s-1" not in d.group.members and d.group.group_epoch == epoch
    assert CancelTimeout(session_key("s-1")) in d.last.actions
    d.converge([a, back])
    assert back.owned == kept


def test_a_static_instance_still_in_use_is_unreleased_and_a_stale_one_fenced():
    d = Driver()
    s = Client("s-1", instance_id="inst")
    d.converge([s])
    other = Client("s-2", instance_id="inst")
    assert d.beat(other).error is E.unreleased_instance_id
    fenced = d.send(HeartbeatRequest(GROUP, "s-2", 1, instance_id="inst", topic_partitions=()))
    assert fenced.error is E.fenced_instance_id
    unknown = d.send(HeartbeatRequest(GROUP, "x", 1, instance_id="nobody", topic_partitions=()))
    assert unknown.error is E.unknown_member_id


# -- timeouts ----------------------------------------------------------------------------


def test_a_session_that_runs_out_removes_the_member_and_bumps_the_group_epoch():
    d = Driver()
    a, b = Client("a"), Client("b")
    d.converge([a, b])
    epoch = d.group.group_epoch
    t = d.event(SessionExpired("b"))
    assert "b" not in d.group.members and d.group.group_epoch == epoch + 1
    assert isinstance(t.actions[0], Persist)
    assert CancelTimeout(rebalance_key("b")) in t.actions
    assert d.group.state is ConsumerGroupState.ASSIGNING
    d.converge([a])
    assert a.owned == all_partitions()


def test_a_static_member_gone_with_minus_two_is_removed_when_its_session_runs_out():
    d = Driver()
    a, s = Client("a"), Client("s-1", instance_id="inst")
    d.converge([a, s])
    d.send(HeartbeatRequest(GROUP, "s-1", -2, instance_id="inst"))
    d.event(SessionExpired("s-1"))
    d.converge([a])
    assert a.owned == all_partitions()
    back = Client("s-2", instance_id="inst")
    d.beat(back)
    assert "s-2" in d.group.members  # a new static member, not a replacement


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced():
    d = Driver()
    a = Client("a")
    d.converge([a])
    b = Client("b")
    d.beat(b)
    d.beat(a)
    assert d.group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    stale = d.event(RebalanceExpired("a", 0))  # scheduled at another epoch: nothing
    assert stale.group == d.group and actions_of(stale, Persist) == []
    d.event(RebalanceExpired("a", 1))
    assert "a" not in d.group.members
    assert d.beat(a).error is E.unknown_member_id
    d.converge([b])
    assert b.owned == all_partitions()


def test_load_gives_back_the_group_and_restarts_its_timers():
    d = Driver()
    a = Client("a")
    d.converge([a])
    b = Client("b")
    d.beat(b)
    d.beat(a)  # a is UNREVOKED_PARTITIONS
    stored = d.group.to_stored()
    t = MACHINE.handle(None, Load(stored), NOW)
    assert t.group == d.group
    assert ScheduleTimeout(SessionExpired("a"), 45_000) in t.actions
    assert ScheduleTimeout(SessionExpired("b"), 45_000) in t.actions
    assert ScheduleTimeout(RebalanceExpired("a", 1), 60_000) in t.actions


# -- errors ------------------------------------------------------------------------------


def test_epochs_that_do_not_match_are_fenced():
    d = Driver()
    a = Client("a")
    d.converge([a])
    ahead = d.send(HeartbeatRequest(GROUP, "a", a.epoch + 1, topic_partitions=()))
    assert ahead.error is E.fenced_member_epoch
    d.beat(Client("b"))
    d.beat(a)
    d.beat(a)  # a is at epoch 2, previous epoch 1
    behind = d.send(
        HeartbeatRequest(GROUP, "a", 0 + 1, topic_partitions=by_topic(all_partitions()))
    )
    assert behind.error is E.fenced_member_epoch  # owns more than it is assigned
    older = d.send(
        HeartbeatRequest(
            GROUP,
            "a",
            0,
            rebalance_timeout_ms=1,
            subscribed_topic_names=("orders",),
            topic_partitions=(),
        )
    )
    assert older.error is E.fenced_member_epoch


def test_unknown_members_and_groups():
    d = Driver()
    assert (
        d.send(HeartbeatRequest(GROUP, "a", 1, topic_partitions=())).error is E.group_id_not_found
    )
    assert d.send(HeartbeatRequest(GROUP, "a", -1)).error is E.group_id_not_found
    d.converge([Client("a")])
    assert d.send(HeartbeatRequest(GROUP, "z", 1, topic_partitions=())).error is E.unknown_member_id
    assert d.send(HeartbeatRequest(GROUP, "z", -1)).error is E.unknown_member_id


def test_an_assignor_that_does_not_exist_is_refused_and_one_that_does_is_used():
    d = Driver()
    answer = d.beat(Client("a", assignor="sticky"))
    assert answer.error is E.unsupported_assignor and d.group is None
    assert "uniform, range" in answer.error_message
    a, b = Client("a", assignor="range"), Client("b", assignor="range")
    d.topics = {"orders": (ORDERS, 12), "refunds": (b"\x08" * 16, 12)}
    a.names = b.names = ("orders", "refunds")
    d.converge([a, b])
    # range co-partitions: the same partition numbers of both topics to the same member.
    numbers = {c.member_id: {p for t, p in c.owned if t == ORDERS} for c in (a, b)}
    for c in (a, b):
        assert {p for t, p in c.owned if t != ORDERS} == numbers[c.member_id]


def test_a_regex_that_does_not_compile_or_is_not_re2_is_refused():
    d = Driver()
    for regex in ("orders-(", r"(o)\1", "(?=o)rders"):
        answer = d.beat(Client("a", names=None, regex=regex))
        assert answer.error is E.invalid_regular_expression, regex
    assert d.group is None


def test_malformed_joins_are_invalid_requests():
    d = Driver()
    base = dict(rebalance_timeout_ms=1000, subscribed_topic_names=("orders",), topic_partitions=())
    bad = [
        {**base, "rebalance_timeout_ms": -1},
        {**base, "topic_partitions": None},
        {**base, "topic_partitions": ((ORDERS, (0,)),)},
        {**base, "subscribed_topic_names": ()},
        {**base, "instance_id": " "},
    ]
    for fields in bad:
        assert d.send(HeartbeatRequest(GROUP, "a", 0, **fields)).error is E.invalid_request
    assert d.send(HeartbeatRequest(GROUP, "", 0, **base)).error is E.invalid_request
    assert d.send(HeartbeatRequest(GROUP, "a", -3)).error is E.invalid_request
    assert d.send(HeartbeatRequest(GROUP, "a", -2)).error is E.invalid_request
    assert d.group is None


def test_the_group_has_a_maximum_size():
    d = Driver(ConsumerGroupMachine(ConsumerGroupSettings(max_size=2)))
    d.converge([Client("a"), Client("b")])
    assert d.beat(Client("c")).error is E.group_max_size_reached
    assert set(d.group.members) == {"a", "b"}


# -- topics that change ------------------------------------------------------------------


def test_a_regex_subscription_picks_up_a_topic_created_later():
    d = Driver()
    a = Client("a", names=None, regex="orders-.*")
    d.topics = {"orders-eu": (b"\x01" * 16, 2), "other": (b"\x09" * 16, 3)}
    d.converge([a])
    assert a.owned == all_partitions(b"\x01" * 16, 2)
    epoch = d.group.group_epoch
    d.topics["orders-us"] = (b"\x02" * 16, 2)
    d.converge([a])
    assert d.group.group_epoch == epoch + 1
    assert a.owned == all_partitions(b"\x01" * 16, 2) | all_partitions(b"\x02" * 16, 2)


def test_more_partitions_give_a_new_target_assignment():
    d = Driver()
    a, b = Client("a"), Client("b")
    d.converge([a, b])
    epoch = d.group.group_epoch
    d.topics = {"orders": (ORDERS, 16)}
    d.converge([a, b])
    assert d.group.group_epoch == d.group.assignment_epoch == epoch + 1
    assert a.owned | b.owned == all_partitions(count=16)
    assert sorted(len(x.owned) for x in (a, b)) == [8, 8]


# -- the property ------------------------------------------------------------------------


def test_random_joins_leaves_and_heartbeats_never_hold_a_partition_twice():
    rng = random.Random(848)
    for _round in range(12):
        d = Driver()
        d.topics = {"orders": (ORDERS, rng.randint(1, 12)), "audit": (b"\x05" * 16, 4)}
        clients: dict[str, Client] = {}
        serial = 0
        for _step in range(120):
            roll = rng.random()
            if roll < 0.15 or not clients:
                serial += 1
                names = rng.choice([("orders",), ("orders", "audit"), ("audit",)])
                static = f"i{serial % 3}" if rng.random() < 0.3 else None
                c = Client(f"m{serial}", names=names, instance_id=static)
                if d.beat(c).error is E.none:
                    clients[c.member_id] = c
            elif roll < 0.22:
                c = clients.pop(rng.choice(sorted(clients)))
                d.send(HeartbeatRequest(GROUP, c.member_id, -1, instance_id=c.instance_id))
            elif roll < 0.27:
                member_id = rng.choice(sorted(clients))
                d.event(SessionExpired(member_id))
                clients.pop(member_id)
            elif roll < 0.30:
                d.topics["orders"] = (ORDERS, d.topics["orders"][1] + 1)
            else:
                c = clients[rng.choice(sorted(clients))]
                if d.beat(c).error is not E.none:
                    clients.pop(c.member_id)  # fenced: it would rejoin as a new member
            if d.group is not None:
                check_no_partition_held_twice(d.group)
        # Heartbeats converge: every subscribed partition is assigned once, evenly enough.
        if clients:
            d.converge(list(clients.values()), rounds=8)
            held = [tp for c in clients.values() for tp in c.owned]
            assert len(held) == len(set(held))
            subscribed = {n for c in clients.values() for n in c.names}
            expected = frozenset().union(*(all_partitions(*d.topics[n]) for n in subscribed))
            assert set(held) == expected
            for c in clients.values():
                assert d.group.members[c.member_id].assigned == c.owned


# -- ConsumerGroupDescribe and ListGroups ------------------------------------------------


def test_describe_shows_epochs_members_and_both_assignments():
    d = Driver()
    a = Client("a", instance_id="inst-a", assignor="range")
    d.converge([a])
    b = Client("b")
    d.beat(b)  # b is waiting for partitions a still holds
    names = {ORDERS: "orders"}
    described = describe(d.group, GROUP, names, "uniform", version=1)
    assert described.error_code is E.none and described.group_state == "Reconciling"
    assert (described.group_epoch, described.assignment_epoch) == (2, 2)
    assert described.assignor_name == "range"
    by_id = {m.member_id: m for m in described.members}
    assert by_id["a"].instance_id == "inst-a" and by_id["a"].member_type == 1
    current = {p for tp in by_id["a"].assignment.topic_partitions for p in tp.partitions}
    target = {p for tp in by_id["a"].target_assignment.topic_partitions for p in tp.partitions}
    assert current == set(range(12)) and len(target) == 6
    assert by_id["b"].assignment.topic_partitions == ()
    assert by_id["a"].assignment.topic_partitions[0].topic_name == "orders"
    v0 = describe(d.group, GROUP, names, "uniform", version=0)
    assert not hasattr(v0.members[0], "member_type")
    missing = describe(None, "nope", names, "uniform")
    assert missing.error_code is E.group_id_not_found


def test_listed_states_are_kafkas():
    d = Driver()
    assert listed_state(None) == "Dead"
    a = Client("a")
    d.converge([a])
    assert listed_state(d.group) == "Stable"
    d.beat(Client("b"))
    assert listed_state(d.group) == "Reconciling"
    d.event(SessionExpired("b"))
    assert listed_state(d.group) == "Assigning"
    d.send(HeartbeatRequest(GROUP, "a", -1))
    assert listed_state(d.group) == "Empty"
