"""The classic group machine as a table: (group, event) -> (new group, actions).

Every row names the state it starts in, the event, the exact group that results and the
exact actions the coordinator must run. Rows whose actions persist the group are run the
other way too: the stored form, loaded by a coordinator that takes the group over, gives
back the same stored form, and the group starts Empty, Stable, or (when the store says a
rebalance was under way) rebalancing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.groups.actions import CancelTimeout, CancelTimeouts, Persist, Respond, ScheduleTimeout
from broker.groups.classic import (
    ClassicGroup,
    GroupState,
    JoinedMember,
    JoinRequest,
    JoinResult,
    Member,
    Members,
    SyncRequest,
    SyncResult,
)
from broker.groups.classic_machine import (
    JOIN_TIMEOUT_KEY,
    SYNC_TIMEOUT_KEY,
    AnswerJoin,
    AnswerSync,
    ClassicGroupMachine,
    Deleted,
    Heartbeat,
    HeartbeatExpired,
    InitialDelayExpired,
    JoinGroup,
    JoinTimeout,
    LeaveGroup,
    Load,
    OffsetCommit,
    ParkJoin,
    ParkSync,
    SyncGroup,
    SyncTimeout,
    Unload,
    check_join,
)
from broker.groups.settings import GroupSettings
from metadata import groups as groups_layer

E = ErrorCode
EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)
SETTINGS = GroupSettings(initial_rebalance_delay_ms=3_000, new_member_join_timeout_ms=300_000)
MACHINE = ClassicGroupMachine(SETTINGS)
BEFORE = 10_000  # when the group entered its state
NOW = 50_000
SESSION, REBALANCE = 10_000, 5_000
R = (("range", b"r"),)
RR = (("roundrobin", b"rr"),)
BOTH = (("range", b"r"), ("roundrobin", b"rr"))


# -- building groups, events and actions -------------------------------------------------


def m(
    member_id: str,
    *,
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = R,
    assignment: bytes = b"",
    joining: bool = False,
    syncing: bool = False,
    new: bool = False,
    session: int = SESSION,
    rebalance: int = REBALANCE,
) -> Member:
    return Member(
        member_id, instance, "client", "/10.0.0.1", rebalance, session, "consumer", protocols,
        assignment, joining, syncing, new,
    )  # fmt: skip


_PREVIOUS = {EMPTY: PREPARING, PREPARING: STABLE, COMPLETING: PREPARING, STABLE: COMPLETING}


def g(state: GroupState, *members: Member, **kw: Any) -> ClassicGroup:
    """A group of generation 1 with protocol range, led by its first member."""
    fields: dict[str, Any] = {
        "state_timestamp_ms": BEFORE,
        "generation": 1,
        "protocol_type": "consumer",
        "protocol_name": "range" if members else None,
        "leader_id": members[0].member_id if members else None,
        "previous_state": _PREVIOUS.get(state, STABLE),
    }
    fields.update(kw)
    for name in ("pending_join", "pending_sync"):
        fields[name] = frozenset(fields.get(name, ()))
    return ClassicGroup("g", state, members=Members(members), **fields)


def moved(group: ClassicGroup, state: GroupState, **kw: Any) -> ClassicGroup:
    """The group after a transition to `state` at NOW."""
    return replace(group, state=state, previous_state=group.state, state_timestamp_ms=NOW, **kw)


def join(
    member_id: str = "",
    *,
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = R,
    protocol_type: str = "consumer",
    v4: bool = True,
    v9: bool = True,
    new_id: str = "n",
) -> JoinGroup:
    request = JoinRequest(
        "g", member_id, instance, "client", "/10.0.0.1", SESSION, REBALANCE, protocol_type,
        protocols, require_known_member_id=v4, supports_skip_assignment=v9,
    )  # fmt: skip
    return JoinGroup(request, "" if member_id else new_id)


def sync(
    member_id: str,
    generation: int = 1,
    assignments: tuple[tuple[str, bytes], ...] = (),
    *,
    instance: str | None = None,
    protocol_type: str | None = "consumer",
    protocol_name: str | None = "range",
) -> SyncGroup:
    return SyncGroup(
        SyncRequest("g", generation, member_id, instance, protocol_type, protocol_name, assignments)
    )


def joined(
    member_id: str,
    generation: int,
    leader: str,
    members: tuple[Member, ...] = (),
    *,
    protocol_name: str | None = "range",
    skip: bool = False,
) -> JoinResult:
    return JoinResult(
        E.none,
        member_id=member_id,
        generation=generation,
        protocol_type="consumer",
        protocol_name=protocol_name,
        leader=leader,
        skip_assignment=skip,
        members=tuple(JoinedMember(x.member_id, x.group_instance_id, b"r") for x in members),
    )


def synced(assignment: bytes) -> SyncResult:
    return SyncResult(E.none, "consumer", "range", assignment)


def hb(member_id: str, ms: int = SESSION) -> ScheduleTimeout:
    return ScheduleTimeout(HeartbeatExpired(member_id), ms)


def no_hb(member_id: str) -> CancelTimeout:
    return CancelTimeout(HeartbeatExpired(member_id).key)


def persist(group: ClassicGroup, **kw: Any) -> Persist:
    return Persist(group.to_stored(**kw))


def leave_answer(*answers: tuple[str, str | None, ErrorCode]) -> Respond[Any]:
    return Respond((E.none, answers))


NO_SYNC = CancelTimeout(SYNC_TIMEOUT_KEY)
NO_JOIN = CancelTimeout(JOIN_TIMEOUT_KEY)
JOIN_TIMEOUT = ScheduleTimeout(JoinTimeout(), REBALANCE)


@dataclass(frozen=True)
class Row:
    name: str
    group: ClassicGroup | None
    event: Any
    after: ClassicGroup | None
    actions: tuple[Any, ...]


# -- the groups the rows start from ------------------------------------------------------

A, B, C = m("a", assignment=b"A"), m("b", assignment=b"B"), m("c", assignment=b"C")
STABLE_AB = g(STABLE, A, B)
STABLE_AB_STATIC = g(
    STABLE, m("a", instance="ia", assignment=b"A"), m("b", instance="ib", assignment=b"B")
)
COMPLETING_AB = g(COMPLETING, m("a"), m("b"), pending_sync={"a", "b"})
PREPARING_A_REJOINED = g(PREPARING, m("a", joining=True), m("b"), m("c"))
INITIAL = g(PREPARING, m("a", joining=True, new=True), previous_state=EMPTY, generation=0,
            protocol_name=None)  # fmt: skip
EMPTY_G1 = g(EMPTY, generation=1, subscribed_topics=frozenset())
DEAD_AB = g(DEAD, A, B)


def _rows_join() -> list[Row]:
    rows = []
    created = ClassicGroup("g", state_timestamp_ms=NOW)
    rows.append(Row("no group x new member, member id required", None, join(),
        replace(created, pending_join=frozenset({"n"})),
        (hb("n"), Respond(JoinResult(E.member_id_required, member_id="n")))))  # fmt: skip
    rows.append(Row("no group x known member id", None, join("x"), None,
        (Respond(JoinResult(E.unknown_member_id, member_id="x")),)))  # fmt: skip
    first = replace(
        created,
        state=PREPARING,
        previous_state=EMPTY,
        protocol_type="consumer",
        leader_id="n",
        members=Members([m("n", joining=True, new=True)]),
    )
    rows.append(Row("no group x new member, no member id required (v0-v3)", None,
        join(v4=False), first,
        (ParkJoin("n"), hb("n", 300_000), NO_SYNC,
         ScheduleTimeout(InitialDelayExpired(3_000, 2_000), 3_000))))  # fmt: skip
    pending = replace(EMPTY_G1, pending_join=frozenset({"p"}))
    rows.append(Row("Empty x pending member joins with its id", pending, join("p"),
        moved(EMPTY_G1, PREPARING, leader_id="p", members=Members([m("p", joining=True, new=True)])),
        (ParkJoin("p"), hb("p", 300_000), NO_SYNC,
         ScheduleTimeout(InitialDelayExpired(3_000, 2_000), 3_000))))  # fmt: skip
    rows.append(Row("Empty x unknown member id", EMPTY_G1, join("x"), EMPTY_G1,
        (Respond(JoinResult(E.unknown_member_id, member_id="x")),)))  # fmt: skip
    rows.append(Row("Empty x member without protocols", EMPTY_G1, join(protocols=()), EMPTY_G1,
        (Respond(JoinResult(E.inconsistent_group_protocol)),)))  # fmt: skip
    rows.append(Row("PreparingRebalance (initial delay) x new member (v0-v3)", INITIAL,
        join(v4=False),
        replace(INITIAL, members=INITIAL.members.put(m("n", joining=True, new=True)),
                new_member_added=True),
        (ParkJoin("n"), hb("n", 300_000))))  # fmt: skip
    rows.append(Row("PreparingRebalance x new member, member id required", PREPARING_A_REJOINED,
        join(), replace(PREPARING_A_REJOINED, pending_join=frozenset({"n"})),
        (hb("n"), Respond(JoinResult(E.member_id_required, member_id="n")))))  # fmt: skip
    rows.append(Row("PreparingRebalance x known member rejoins, another still missing",
        PREPARING_A_REJOINED, join("b"),
        replace(PREPARING_A_REJOINED,
                members=PREPARING_A_REJOINED.members.put(m("b", joining=True))),
        (ParkJoin("b"),)))  # fmt: skip
    # The last member rejoins: the join completes, generation 2 is stored, then answered.
    two = g(PREPARING, m("a", joining=True), m("b"))
    gen2 = replace(two, members=Members([m("a"), m("b")]), generation=2, state=COMPLETING,
                   previous_state=PREPARING, state_timestamp_ms=NOW,
                   pending_sync=frozenset({"a", "b"}))  # fmt: skip
    rows.append(Row("PreparingRebalance x last member rejoins: join completes", two, join("b"),
        gen2,
        (ParkJoin("b"), NO_JOIN, persist(replace(gen2, pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 2, "a", (A, B))), hb("a"),
         AnswerJoin("b", joined("b", 2, "a")), hb("b"),
         ScheduleTimeout(SyncTimeout(2), REBALANCE))))  # fmt: skip
    rows.append(Row("CompletingRebalance x follower with the same protocols: answer again",
        COMPLETING_AB, join("b"), COMPLETING_AB, (Respond(joined("b", 1, "a")),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x leader with the same protocols: members again",
        COMPLETING_AB, join("a"), COMPLETING_AB,
        (Respond(joined("a", 1, "a", (A, B))),)))  # fmt: skip
    syncing = g(COMPLETING, m("a", assignment=b"old"), m("b", syncing=True), pending_sync={"a"})
    rows.append(Row("CompletingRebalance x member with other protocols: rebalance",
        syncing, join("b", protocols=BOTH),
        moved(syncing, PREPARING, pending_sync=frozenset(),
              members=Members([m("a"), m("b", protocols=BOTH, joining=True)])),
        (ParkJoin("b"), AnswerSync("b", SyncResult(E.rebalance_in_progress)), hb("b"),
         NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("Stable x leader rejoins: rebalance", STABLE_AB, join("a"),
        moved(STABLE_AB, PREPARING, members=Members([replace(A, awaiting_join=True), B])),
        (ParkJoin("a"), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("Stable x follower with the same protocols: current generation",
        STABLE_AB, join("b"), STABLE_AB, (Respond(joined("b", 1, "a")),)))  # fmt: skip
    rows.append(Row("Stable x follower with other protocols: rebalance", STABLE_AB,
        join("b", protocols=BOTH),
        moved(STABLE_AB, PREPARING,
              members=Members([A, replace(B, protocols=BOTH, awaiting_join=True)])),
        (ParkJoin("b"), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("Stable x new member, no member id required: rebalance", STABLE_AB,
        join(v4=False),
        moved(STABLE_AB, PREPARING,
              members=Members([A, B, m("n", joining=True, new=True)])),
        (ParkJoin("n"), hb("n", 300_000), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("Stable x new member without a common protocol", STABLE_AB,
        join(protocols=RR), STABLE_AB,
        (Respond(JoinResult(E.inconsistent_group_protocol)),)))  # fmt: skip
    rows.append(Row("Stable x new member of another protocol type", STABLE_AB,
        join(protocol_type="connect"), STABLE_AB,
        (Respond(JoinResult(E.inconsistent_group_protocol)),)))  # fmt: skip
    rows.append(Row("Stable x known member without a common protocol", STABLE_AB,
        join("b", protocols=RR), STABLE_AB,
        (Respond(JoinResult(E.inconsistent_group_protocol, member_id="b")),)))  # fmt: skip
    rows.append(Row("Stable x unknown member id", STABLE_AB, join("x"), STABLE_AB,
        (Respond(JoinResult(E.unknown_member_id, member_id="x")),)))  # fmt: skip
    rows.append(Row("Dead x join", DEAD_AB, join("a"), DEAD_AB,
        (Respond(JoinResult(E.coordinator_not_available, member_id="a")),)))  # fmt: skip
    return rows


def _rows_static_join() -> list[Row]:
    rows = []
    s = STABLE_AB_STATIC
    a, b = s.members["a"], s.members["b"]
    rows.append(Row("Stable x new static member: rebalance", s, join(instance="ic", new_id="c1"),
        moved(s, PREPARING,
              members=s.members.put(m("c1", instance="ic", joining=True, new=True))),
        (ParkJoin("c1"), hb("c1", 300_000), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    # The leader's instance restarts: its place, stored at once, and no rebalance (v9: the
    # leader is told to skip the assignment).
    a2 = replace(a, member_id="a2")
    after = replace(s, leader_id="a2", members=Members([b, a2]))
    rows.append(Row("Stable x static leader rejoins, same protocols (v9)", s,
        join(instance="ia", new_id="a2"), after,
        (no_hb("a"), hb("a2"), ParkJoin("a2"),
         persist(replace(after, members=Members([b, replace(a2, awaiting_join=True)]))),
         AnswerJoin("a2", joined("a2", 1, "a2", (b, a2), skip=True)))))  # fmt: skip
    b2 = replace(b, member_id="b2")
    after = replace(s, members=Members([a, b2]))
    rows.append(Row("Stable x static follower rejoins, same protocols (v5-v8)", s,
        join(instance="ib", new_id="b2", v9=False), after,
        (no_hb("b"), hb("b2"), ParkJoin("b2"),
         persist(replace(after, members=Members([a, replace(b2, awaiting_join=True)]))),
         AnswerJoin("b2", joined("b2", 1, "a")))))  # fmt: skip
    # v5-v8: a restarted static leader is told the old leader id, so it does not assign.
    rows.append(Row("Stable x static leader rejoins (v5-v8): told the old leader", s,
        join(instance="ia", new_id="a2", v9=False),
        replace(s, leader_id="a2", members=Members([b, a2])),
        (no_hb("a"), hb("a2"), ParkJoin("a2"),
         persist(replace(s, leader_id="a2",
                         members=Members([b, replace(a2, awaiting_join=True)]))),
         AnswerJoin("a2", joined("a2", 1, "a")))))  # fmt: skip
    other = (("roundrobin", b"rr"), ("range", b"r"))
    b2 = replace(b, member_id="b2", protocols=other)
    after = replace(s, members=Members([a, b2]))
    rows.append(Row("Stable x static member rejoins, other protocols, same vote: no rebalance",
        s, join(instance="ib", new_id="b2", protocols=other), after,
        (no_hb("b"), hb("b2"), ParkJoin("b2"),
         persist(replace(after, members=Members([a, replace(b2, awaiting_join=True)]))),
         AnswerJoin("b2", joined("b2", 1, "a")))))  # fmt: skip
    both = g(STABLE, m("a", instance="ia", protocols=BOTH, assignment=b"A"),
             m("b", instance="ib", protocols=BOTH, assignment=b"B"))  # fmt: skip
    rows.append(Row("Stable x static member rejoins, other protocols win the vote: rebalance",
        both, join(instance="ib", new_id="b2", protocols=RR),
        moved(both, PREPARING, members=Members(
            [both.members["a"], replace(both.members["b"], member_id="b2", protocols=RR,
                                        awaiting_join=True)])),
        (no_hb("b"), hb("b2"), ParkJoin("b2"), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    c = g(COMPLETING, m("a", instance="ia"), m("b", instance="ib", syncing=True),
          pending_sync={"a"})  # fmt: skip
    rows.append(Row("CompletingRebalance x static member rejoins: rebalance", c,
        join(instance="ia", new_id="a2"),
        moved(c, PREPARING, leader_id="a2", pending_sync=frozenset(), members=Members(
            [m("b", instance="ib"), m("a2", instance="ia", joining=True)])),
        (no_hb("a"), hb("a2"), ParkJoin("a2"),
         AnswerSync("b", SyncResult(E.rebalance_in_progress)), hb("b"), NO_SYNC,
         JOIN_TIMEOUT)))  # fmt: skip
    # The old incarnation still has a JoinGroup parked: it is fenced.
    p = g(PREPARING, m("a", instance="ia", joining=True), m("b", instance="ib"))
    rows.append(Row("PreparingRebalance x static member replaced while parked", p,
        join(instance="ia", new_id="a2"),
        replace(p, leader_id="a2", members=Members(
            [m("b", instance="ib"), m("a2", instance="ia", joining=True)])),
        (AnswerJoin("a", JoinResult(E.fenced_instance_id, member_id="a")), no_hb("a"),
         hb("a2"), ParkJoin("a2"))))  # fmt: skip
    rows.append(Row("Stable x old member id of a replaced static member: fenced", s,
        join("a-old", instance="ia"), s,
        (Respond(JoinResult(E.fenced_instance_id, member_id="a-old")),)))  # fmt: skip
    rows.append(Row("Stable x static member id with an unknown instance", s,
        join("a", instance="ix"), s,
        (Respond(JoinResult(E.unknown_member_id, member_id="a")),)))  # fmt: skip
    return rows


def _rows_sync() -> list[Row]:
    rows = []
    c = COMPLETING_AB
    rows.append(Row("no group x sync", None, sync("a"), None,
        (Respond(SyncResult(E.unknown_member_id)),)))  # fmt: skip
    rows.append(Row("Empty x sync", EMPTY_G1, sync("a"), EMPTY_G1,
        (Respond(SyncResult(E.unknown_member_id)),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x follower before the leader: parked", c, sync("b"),
        replace(c, members=c.members.put(m("b", syncing=True)), pending_sync=frozenset({"a"})),
        (ParkSync("b"),)))  # fmt: skip
    waiting = replace(c, members=c.members.put(m("b", syncing=True)),
                      pending_sync=frozenset({"a"}))  # fmt: skip
    assigned = moved(
        waiting,
        STABLE,
        pending_sync=frozenset(),
        members=Members([m("a", assignment=b"A"), m("b", assignment=b"B")]),
    )
    rows.append(Row("CompletingRebalance x leader after the follower: stored, then everyone",
        waiting, sync("a", 1, (("a", b"A"), ("b", b"B"))), assigned,
        (ParkSync("a"), NO_SYNC,
         persist(replace(waiting, members=waiting.members.put(m("a", syncing=True))),
                 state=STABLE, assignments={"a": b"A", "b": b"B"}),
         AnswerSync("a", synced(b"A")), hb("a"), AnswerSync("b", synced(b"B")), hb("b"))))  # fmt: skip
    first = moved(
        c, STABLE, pending_sync=frozenset({"b"}), members=Members([m("a", assignment=b"A"), m("b")])
    )
    rows.append(Row("CompletingRebalance x leader first, no assignment for one member", c,
        sync("a", 1, (("a", b"A"),)), first,
        (ParkSync("a"),
         persist(replace(c, members=c.members.put(m("a", syncing=True)),
                         pending_sync=frozenset({"b"})),
                 state=STABLE, assignments={"a": b"A", "b": b""}),
         AnswerSync("a", synced(b"A")), hb("a"))))  # fmt: skip
    rows.append(Row("Stable x follower after the leader: its assignment", first, sync("b"),
        replace(first, pending_sync=frozenset()), (Respond(synced(b"")),)))  # fmt: skip
    rows.append(Row("Stable x follower again", STABLE_AB, sync("b"), STABLE_AB,
        (Respond(synced(b"B")),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x unknown member", c, sync("x"), c,
        (Respond(SyncResult(E.unknown_member_id)),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x illegal generation", c, sync("b", 7), c,
        (Respond(SyncResult(E.illegal_generation)),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x inconsistent protocol type", c,
        sync("b", protocol_type="connect"), c,
        (Respond(SyncResult(E.inconsistent_group_protocol)),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x inconsistent protocol name", c,
        sync("b", protocol_name="roundrobin"), c,
        (Respond(SyncResult(E.inconsistent_group_protocol)),)))  # fmt: skip
    rows.append(Row("CompletingRebalance x no protocol named (v0-v4)", c,
        sync("b", protocol_type=None, protocol_name=None),
        replace(c, members=c.members.put(m("b", syncing=True)), pending_sync=frozenset({"a"})),
        (ParkSync("b"),)))  # fmt: skip
    rows.append(Row("PreparingRebalance x sync: rebalance in progress", PREPARING_A_REJOINED,
        sync("b"), PREPARING_A_REJOINED,
        (Respond(SyncResult(E.rebalance_in_progress)),)))  # fmt: skip
    rows.append(Row("Stable x sync of a fenced static member", STABLE_AB_STATIC,
        sync("a-old", instance="ia"), STABLE_AB_STATIC,
        (Respond(SyncResult(E.fenced_instance_id)),)))  # fmt: skip
    rows.append(Row("Dead x sync", DEAD_AB, sync("a"), DEAD_AB,
        (Respond(SyncResult(E.coordinator_not_available)),)))  # fmt: skip
    return rows


def _rows_heartbeat() -> list[Row]:
    rows = []
    rows.append(Row("no group x heartbeat", None, Heartbeat(1, "a"), None,
        (Respond(E.unknown_member_id),)))  # fmt: skip
    rows.append(Row("Empty x heartbeat", EMPTY_G1, Heartbeat(1, "a"), EMPTY_G1,
        (Respond(E.unknown_member_id),)))  # fmt: skip
    rows.append(Row("PreparingRebalance x heartbeat: rebalance in progress",
        PREPARING_A_REJOINED, Heartbeat(1, "b"), PREPARING_A_REJOINED,
        (hb("b"), Respond(E.rebalance_in_progress))))  # fmt: skip
    rows.append(Row("CompletingRebalance x heartbeat", COMPLETING_AB, Heartbeat(1, "b"),
        COMPLETING_AB, (hb("b"), Respond(E.none))))  # fmt: skip
    rows.append(Row("Stable x heartbeat", STABLE_AB, Heartbeat(1, "b"), STABLE_AB,
        (hb("b"), Respond(E.none))))  # fmt: skip
    rows.append(Row("Stable x heartbeat of another generation", STABLE_AB, Heartbeat(0, "b"),
        STABLE_AB, (Respond(E.illegal_generation),)))  # fmt: skip
    rows.append(Row("Stable x heartbeat of an unknown member", STABLE_AB, Heartbeat(1, "x"),
        STABLE_AB, (Respond(E.unknown_member_id),)))  # fmt: skip
    rows.append(Row("Stable x heartbeat of a fenced static member", STABLE_AB_STATIC,
        Heartbeat(1, "a-old", "ia"), STABLE_AB_STATIC, (Respond(E.fenced_instance_id),)))  # fmt: skip
    rows.append(Row("Dead x heartbeat", DEAD_AB, Heartbeat(1, "a"), DEAD_AB,
        (Respond(E.coordinator_not_available),)))  # fmt: skip
    return rows


def _rows_leave() -> list[Row]:
    rows = []
    s = STABLE_AB
    rows.append(Row("no group x leave", None, LeaveGroup((("a", None), ("", "ia"))), None,
        (leave_answer(("a", None, E.unknown_member_id), ("", "ia", E.unknown_member_id)),)))  # fmt: skip
    after = moved(s, PREPARING, members=Members([A]))
    rows.append(Row("Stable x dynamic member leaves: rebalance, stored", s,
        LeaveGroup((("b", None),)), after,
        (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after),
         leave_answer(("b", None, E.none)))))  # fmt: skip
    one = g(STABLE, A)
    gone = moved(one, EMPTY, members=Members(), leader_id=None, generation=2,
                 protocol_name=None, subscribed_topics=frozenset())  # fmt: skip
    rows.append(Row("Stable x the last member leaves: Empty, next generation stored", one,
        LeaveGroup((("a", None),)),
        replace(gone, previous_state=PREPARING),
        (no_hb("a"), NO_SYNC, NO_JOIN, persist(replace(gone, previous_state=PREPARING)),
         leave_answer(("a", None, E.none)))))  # fmt: skip
    st = STABLE_AB_STATIC
    after = moved(st, PREPARING, members=Members([st.members["a"]]))
    rows.append(Row("Stable x static member removed by instance id", st,
        LeaveGroup((("", "ib"),)), after,
        (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after),
         leave_answer(("", "ib", E.none)))))  # fmt: skip
    rows.append(Row("Stable x static member leaves with its member id", st,
        LeaveGroup((("b", "ib"),)), after,
        (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after),
         leave_answer(("b", "ib", E.none)))))  # fmt: skip
    three = g(STABLE, A, B, C)
    after = moved(three, PREPARING, members=Members([A, C]))
    rows.append(Row("Stable x a batch with mixed results", three,
        LeaveGroup((("b", None), ("x", None), ("", "ix"), ("c", "ic"))), after,
        (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after),
         leave_answer(("b", None, E.none), ("x", None, E.unknown_member_id),
                      ("", "ix", E.unknown_member_id), ("c", "ic", E.unknown_member_id)))))  # fmt: skip
    rows.append(Row("Stable x only unknown members: nothing changes", s,
        LeaveGroup((("x", None),)), s, (leave_answer(("x", None, E.unknown_member_id)),)))  # fmt: skip
    pending = replace(EMPTY_G1, pending_join=frozenset({"p"}))
    rows.append(Row("Empty x pending member leaves", pending, LeaveGroup((("p", None),)),
        EMPTY_G1, (no_hb("p"), leave_answer(("p", None, E.none)))))  # fmt: skip
    c = g(COMPLETING, m("a", syncing=True), m("b"), pending_sync={"b"})
    after = moved(c, PREPARING, members=Members([m("a")]), pending_sync=frozenset())
    rows.append(Row("CompletingRebalance x follower leaves: the leader's sync is told", c,
        LeaveGroup((("b", None),)), after,
        (no_hb("b"), AnswerSync("a", SyncResult(E.rebalance_in_progress)), hb("a"), NO_SYNC,
         JOIN_TIMEOUT, persist(after), leave_answer(("b", None, E.none)))))  # fmt: skip
    p = g(PREPARING, m("a", joining=True), m("b"), m("c", joining=True))
    gen2 = replace(p, generation=2, state=COMPLETING, previous_state=PREPARING,
                   state_timestamp_ms=NOW, members=Members([m("a"), m("c")]),
                   pending_sync=frozenset({"a", "c"}))  # fmt: skip
    rows.append(Row("PreparingRebalance x the member that did not rejoin leaves: join completes",
        p, LeaveGroup((("b", None),)), gen2,
        (no_hb("b"), NO_JOIN,
         persist(replace(gen2, members=Members([m("a", joining=True), m("c", joining=True)]),
                         pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 2, "a", (A, C))), hb("a"),
         AnswerJoin("c", joined("c", 2, "a")), hb("c"),
         ScheduleTimeout(SyncTimeout(2), REBALANCE), leave_answer(("b", None, E.none)))))  # fmt: skip
    parked = g(PREPARING, m("a", joining=True), m("b", joining=True), m("c"))
    after = replace(parked, members=Members([m("b", joining=True), m("c")]), leader_id="b")
    rows.append(Row("PreparingRebalance x a parked member leaves: its JoinGroup is answered",
        parked, LeaveGroup((("a", None),)), after,
        (no_hb("a"), AnswerJoin("a", JoinResult(E.unknown_member_id)), persist(after),
         leave_answer(("a", None, E.none)))))  # fmt: skip
    rows.append(Row("Dead x leave", DEAD_AB, LeaveGroup((("a", None),)), DEAD_AB,
        (Respond((E.coordinator_not_available, ())),)))  # fmt: skip
    return rows


def _rows_timeouts() -> list[Row]:
    rows = []
    s = STABLE_AB
    after = moved(s, PREPARING, members=Members([A]))
    rows.append(Row("Stable x session of a member expires: removed, rebalance, stored", s,
        HeartbeatExpired("b"), after, (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after))))  # fmt: skip
    p = g(PREPARING, m("a", joining=True), m("b"), m("c", joining=True))
    gen2 = replace(p, generation=2, state=COMPLETING, previous_state=PREPARING,
                   state_timestamp_ms=NOW, members=Members([m("a"), m("c")]),
                   pending_sync=frozenset({"a", "c"}))  # fmt: skip
    rows.append(Row("PreparingRebalance x session of the last missing member expires", p,
        HeartbeatExpired("b"), gen2,
        (no_hb("b"), NO_JOIN,
         persist(replace(gen2, members=Members([m("a", joining=True), m("c", joining=True)]),
                         pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 2, "a", (A, C))), hb("a"),
         AnswerJoin("c", joined("c", 2, "a")), hb("c"),
         ScheduleTimeout(SyncTimeout(2), REBALANCE))))  # fmt: skip
    rows.append(Row("PreparingRebalance x parked member's session: no heartbeat needed",
        PREPARING_A_REJOINED, HeartbeatExpired("a"), PREPARING_A_REJOINED, ()))  # fmt: skip
    new = g(PREPARING, m("a", joining=True), m("n", joining=True, new=True), m("c"))
    after = replace(new, members=Members([m("a", joining=True), m("c")]))
    rows.append(Row("PreparingRebalance x new member did not finish joining in time", new,
        HeartbeatExpired("n"), after,
        (no_hb("n"), AnswerJoin("n", JoinResult(E.unknown_member_id)), persist(after))))  # fmt: skip
    pending = replace(EMPTY_G1, pending_join=frozenset({"p"}))
    rows.append(Row("Empty x pending member never came back", pending, HeartbeatExpired("p"),
        EMPTY_G1, ()))  # fmt: skip
    rows.append(Row("Stable x expiry of a member that is gone", s, HeartbeatExpired("x"), s,
        ()))  # fmt: skip
    grown = replace(INITIAL, new_member_added=True)
    rows.append(Row("PreparingRebalance x initial delay over, a member came: wait again",
        grown, InitialDelayExpired(3_000, 2_000), INITIAL,
        (ScheduleTimeout(InitialDelayExpired(2_000, 0), 2_000),)))  # fmt: skip
    first = replace(INITIAL, generation=1, protocol_name="range", state=COMPLETING,
                    previous_state=PREPARING, state_timestamp_ms=NOW,
                    members=Members([m("a")]), pending_sync=frozenset({"a"}))  # fmt: skip
    rows.append(Row("PreparingRebalance x initial delay over: the first generation", INITIAL,
        InitialDelayExpired(3_000, 2_000), first,
        (NO_JOIN, persist(replace(first, members=INITIAL.members, pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 1, "a", (A,))), hb("a"),
         ScheduleTimeout(SyncTimeout(1), REBALANCE))))  # fmt: skip
    rows.append(Row("PreparingRebalance x delay over with no time left: the first generation",
        grown, InitialDelayExpired(2_000, 0), replace(first, new_member_added=True),
        (NO_JOIN, persist(replace(first, members=INITIAL.members, pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 1, "a", (A,))), hb("a"),
         ScheduleTimeout(SyncTimeout(1), REBALANCE))))  # fmt: skip
    static = g(PREPARING, m("a", joining=True), m("b"), m("s", instance="is"))
    gen2 = replace(static, generation=2, state=COMPLETING, previous_state=PREPARING,
                   state_timestamp_ms=NOW, members=Members([m("a"), m("s", instance="is")]),
                   pending_sync=frozenset({"a", "s"}))  # fmt: skip
    rows.append(Row("PreparingRebalance x rebalance timeout: dynamic laggards dropped, static kept",
        static, JoinTimeout(), gen2,
        (NO_JOIN, no_hb("b"),
         persist(replace(gen2, members=Members([m("a", joining=True), m("s", instance="is")]),
                         pending_sync=frozenset())),
         AnswerJoin("a", joined("a", 2, "a", (A, m("s", instance="is")))), hb("a"), hb("s"),
         ScheduleTimeout(SyncTimeout(2), REBALANCE))))  # fmt: skip
    nobody = g(PREPARING, m("s", instance="is"))
    rows.append(Row("PreparingRebalance x rebalance timeout, nobody rejoined: wait again",
        nobody, JoinTimeout(), nobody, (NO_JOIN, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("Stable x a stale rebalance timeout", s, JoinTimeout(), s, ()))  # fmt: skip
    c = g(COMPLETING, m("a", syncing=True), m("b"), pending_sync={"b"})
    after = moved(c, PREPARING, members=Members([m("a")]), pending_sync=frozenset())
    rows.append(Row("CompletingRebalance x sync timeout: late members dropped, rebalance", c,
        SyncTimeout(1), after,
        (no_hb("b"), AnswerSync("a", SyncResult(E.rebalance_in_progress)), hb("a"), NO_SYNC,
         JOIN_TIMEOUT, persist(after))))  # fmt: skip
    late = replace(STABLE_AB, pending_sync=frozenset({"b"}))
    after = moved(late, PREPARING, members=Members([A]), pending_sync=frozenset())
    rows.append(Row("Stable x sync timeout: a follower never synced", late, SyncTimeout(1),
        after, (no_hb("b"), NO_SYNC, JOIN_TIMEOUT, persist(after))))  # fmt: skip
    rows.append(Row("CompletingRebalance x sync timeout of an old generation", c,
        SyncTimeout(0), c, ()))  # fmt: skip
    rows.append(Row("Stable x sync timeout, everyone synced", s, SyncTimeout(1), s, ()))  # fmt: skip
    for timeout in (HeartbeatExpired("a"), JoinTimeout(), SyncTimeout(1)):
        rows.append(Row(f"Dead x {type(timeout).__name__}", DEAD_AB, timeout, DEAD_AB, ()))
    return rows


def _stored(state: str, *members: Member, protocol_type: str | None = "consumer",
            leader: str | None = "a") -> groups_layer.StoredGroup:  # fmt: skip
    return groups_layer.StoredGroup(
        "g", protocol_type, "range" if members else None, 4, leader if members else None, state,
        BEFORE, 7,
        tuple(groups_layer.StoredMember(x.member_id, x.group_instance_id, x.client_id,
                                        x.client_host, x.rebalance_timeout_ms,
                                        x.session_timeout_ms, x.protocols, x.assignment)
              for x in members),
    )  # fmt: skip


def _rows_load_and_ownership() -> list[Row]:
    rows = []
    loaded = g(STABLE, A, B, generation=4, previous_state=DEAD)
    rows.append(Row("load Stable: members carry on", None, Load(_stored("Stable", A, B)),
        loaded, (hb("a"), hb("b"))))  # fmt: skip
    for state in ("CompletingRebalance", "PreparingRebalance"):
        rows.append(Row(f"load {state}: a rebalance starts", None,
            Load(_stored(state, A, B)), moved(loaded, PREPARING),
            (hb("a"), hb("b"), NO_SYNC, JOIN_TIMEOUT)))  # fmt: skip
    rows.append(Row("load Empty", None, Load(_stored("Empty")),
        g(EMPTY, generation=4, previous_state=DEAD, subscribed_topics=frozenset()), ()))  # fmt: skip
    rows.append(Row("load a simple group (offsets only)", None,
        Load(_stored("Empty", protocol_type=None)),
        g(EMPTY, generation=4, previous_state=DEAD, protocol_type=None), ()))  # fmt: skip
    rows.append(Row("load: a leader that is gone is replaced by the first member", None,
        Load(_stored("Stable", B, A, leader="x")), g(STABLE, B, A, generation=4,
        previous_state=DEAD), (hb("b"), hb("a"))))  # fmt: skip
    parked = g(PREPARING, m("a", joining=True), m("b", syncing=True))
    rows.append(Row("PreparingRebalance x ownership lost: parked requests answered", parked,
        Unload(E.not_coordinator),
        replace(parked, state=DEAD, members=Members([m("a"), m("b")])),
        (AnswerJoin("a", JoinResult(E.not_coordinator, member_id="a")),
         AnswerSync("b", SyncResult(E.not_coordinator)), CancelTimeouts())))  # fmt: skip
    rows.append(Row("Stable x ownership lost", STABLE_AB, Unload(E.not_coordinator),
        replace(STABLE_AB, state=DEAD), (CancelTimeouts(),)))  # fmt: skip
    rows.append(Row("Empty x deleted", EMPTY_G1, Deleted(), moved(EMPTY_G1, DEAD),
        (CancelTimeouts(),)))  # fmt: skip
    return rows


def _rows_offset_commit() -> list[Row]:
    rows = []
    rows.append(Row("Stable x commit of a member: its session is kept", STABLE_AB,
        OffsetCommit(1, "b"), STABLE_AB, (hb("b"), Respond(E.none))))  # fmt: skip
    rows.append(Row("PreparingRebalance x commit for the last generation",
        PREPARING_A_REJOINED, OffsetCommit(1, "b"), PREPARING_A_REJOINED,
        (hb("b"), Respond(E.none))))  # fmt: skip
    rows.append(Row("CompletingRebalance x commit: rebalance in progress", COMPLETING_AB,
        OffsetCommit(1, "b"), COMPLETING_AB, (Respond(E.rebalance_in_progress),)))  # fmt: skip
    rows.append(Row("Stable x commit of another generation", STABLE_AB, OffsetCommit(2, "b"),
        STABLE_AB, (Respond(E.illegal_generation),)))  # fmt: skip
    rows.append(Row("Stable x simple commit while members are in", STABLE_AB,
        OffsetCommit(-1, ""), STABLE_AB, (Respond(E.unknown_member_id),)))  # fmt: skip
    rows.append(Row("Empty x simple commit", EMPTY_G1, OffsetCommit(-1, ""), EMPTY_G1,
        (Respond(E.none),)))  # fmt: skip
    rows.append(Row("Dead x commit", DEAD_AB, OffsetCommit(1, "a"), DEAD_AB,
        (Respond(E.coordinator_not_available),)))  # fmt: skip
    return rows


ROWS = [
    *_rows_join(),
    *_rows_static_join(),
    *_rows_sync(),
    *_rows_heartbeat(),
    *_rows_leave(),
    *_rows_timeouts(),
    *_rows_load_and_ownership(),
    *_rows_offset_commit(),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_transition(row: Row) -> None:
    transition = MACHINE.handle(row.group, row.event, NOW)
    assert transition.group == row.after
    assert transition.actions == row.actions


def test_rows_do_not_change_the_group_they_are_given() -> None:
    before = [r.group for r in ROWS]
    for row in ROWS:
        MACHINE.handle(row.group, row.event, NOW)
    assert [r.group for r in ROWS] == before


PERSISTING = [
    (r, a.group) for r in ROWS for a in r.actions if isinstance(a, Persist)
]  # fmt: skip


@pytest.mark.parametrize("row,stored", PERSISTING, ids=[r.name for r, _s in PERSISTING])
def test_what_is_persisted_loads_back(row: Row, stored: groups_layer.StoredGroup) -> None:
    """The other way: a coordinator that takes the group over loads what was written."""
    group = ClassicGroup.from_stored(stored)
    assert group.to_stored(state=GroupState(stored.state)) == stored
    loaded = MACHINE.handle(None, Load(stored), NOW).group
    assert loaded is not None
    if not stored.members:
        assert loaded.state is EMPTY
    elif stored.state == str(STABLE):
        assert loaded.state is STABLE
    else:
        assert loaded.state is PREPARING


def test_join_checks_before_the_group() -> None:
    ok = JoinRequest("g", "", None, "c", "/h", 6_000, 1, "consumer", R)
    assert check_join(ok, SETTINGS) is None
    assert check_join(replace(ok, group_id=""), SETTINGS) == JoinResult(E.invalid_group_id)
    short = replace(ok, member_id="m", session_timeout_ms=5_999)
    assert check_join(short, SETTINGS) == JoinResult(E.invalid_session_timeout, member_id="m")


def test_the_protocol_is_chosen_by_vote() -> None:
    prefer_rr = (("roundrobin", b""), ("range", b""))
    prefer_range = (("range", b""), ("roundrobin", b""))
    group = g(STABLE, m("a", protocols=prefer_range), m("b", protocols=prefer_range),
              m("c", protocols=prefer_rr))  # fmt: skip
    assert group.select_protocol() == "range"
    only_rr = g(STABLE, m("a", protocols=prefer_range), m("c", protocols=(("roundrobin", b""),)))
    assert only_rr.select_protocol() == "roundrobin"


def test_a_resent_join_is_parked_again_and_answered_once_per_member() -> None:
    """A member that sends JoinGroup twice is parked twice; one AnswerJoin answers both."""
    first = MACHINE.handle(INITIAL, join("a"), NOW)
    assert first.actions == (ParkJoin("a"),)
    assert first.group == INITIAL
    done = MACHINE.handle(first.group, InitialDelayExpired(3_000, 2_000), NOW)
    assert [a for a in done.actions if isinstance(a, AnswerJoin)] == [
        AnswerJoin("a", joined("a", 1, "a", (A,)))
    ]
