"""The classic group protocol as a pure state machine: Apache Kafka's ClassicGroup and the
classic-group part of its GroupMetadataManager, without I/O.

`ClassicGroupMachine.handle(group, event, now_ms)` returns a `Transition`: the group's new
state and the actions that the coordinator (the shell) must run, in order. Rules:

* nothing here does I/O, reads a clock or draws a random number: the time and the id a new
  member gets come in with the event; the group given is a value and is never changed;
* a parked JoinGroup or SyncGroup is named by its member id: `ParkJoin`/`ParkSync` park
  the request being handled, `AnswerJoin`/`AnswerSync` answer every request parked for the
  member, `Respond` (always last) answers the request being handled;
* `Persist` comes before the answers that depend on it: a generation is answered only once
  it is stored, so the shell stops at the first action that fails and gives the group up;
  a member removed outside a join completion is persisted at the end of the transition;
* timeouts are events the machine asks for: `ScheduleTimeout` replaces the timeout with the
  same key, and the shell hands the timeout back to `handle` when it is due;
* a Dead group is never handed in by the shell; requests on one are answered
  COORDINATOR_NOT_AVAILABLE (the group moved: the client finds its coordinator again) and
  its timeouts do nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Generic, TypeVar, overload

from kio.schema.errors import ErrorCode

from broker.groups.actions import (
    CancelTimeout,
    CancelTimeouts,
    Persist,
    Respond,
    ScheduleTimeout,
    TimeoutKey,
)
from broker.groups.classic import (
    COMPLETING,
    DEAD,
    EMPTY,
    PREPARING,
    STABLE,
    VALID_PREVIOUS,
    ClassicGroup,
    GroupState,
    JoinRequest,
    JoinResult,
    Member,
    Members,
    Protocols,
    SyncRequest,
    SyncResult,
)
from broker.groups.settings import GroupSettings
from metadata import groups as groups_layer

logger = logging.getLogger(__name__)


# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinGroup:
    request: JoinRequest
    new_member_id: str = ""  # the id a new member gets (made by the shell)


@dataclass(frozen=True, slots=True)
class SyncGroup:
    request: SyncRequest


@dataclass(frozen=True, slots=True)
class Heartbeat:
    generation: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    members: tuple[tuple[str, str | None], ...]  # (member id, group.instance.id)


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """The group's part of an OffsetCommit: may this member commit, and its session kept."""

    generation: int
    member_id: str
    group_instance_id: str | None = None


# Timeouts with the same key replace each other: a pending member's wait to join with its
# id and, once it joined, its session; the initial delay and the rebalance timeout.


@dataclass(frozen=True, slots=True)
class HeartbeatExpired:
    """A member's session (or a pending member's wait to join with its id) ran out."""

    member_id: str

    @property
    def key(self) -> TimeoutKey:
        return ("heartbeat", self.member_id)


@dataclass(frozen=True, slots=True)
class InitialDelayExpired:
    """group.initial.rebalance.delay.ms of a group's first rebalance ran out."""

    delay_ms: int
    remaining_ms: int  # of the rebalance timeout, for further delays

    @property
    def key(self) -> TimeoutKey:
        return JOIN_TIMEOUT_KEY


@dataclass(frozen=True, slots=True)
class JoinTimeout:
    """The rebalance timeout ran out: complete the join with the members that rejoined."""

    @property
    def key(self) -> TimeoutKey:
        return JOIN_TIMEOUT_KEY


@dataclass(frozen=True, slots=True)
class SyncTimeout:
    """Members of `generation` did not send SyncGroup within the rebalance timeout."""

    generation: int

    @property
    def key(self) -> TimeoutKey:
        return SYNC_TIMEOUT_KEY


JOIN_TIMEOUT_KEY: TimeoutKey = ("join",)
SYNC_TIMEOUT_KEY: TimeoutKey = ("sync",)

Timeout = HeartbeatExpired | InitialDelayExpired | JoinTimeout | SyncTimeout


@dataclass(frozen=True, slots=True)
class Load:
    """The group read from the store by a coordinator that takes it over."""

    stored: groups_layer.StoredGroup


@dataclass(frozen=True, slots=True)
class Unload:
    """This coordinator gives the group up (ownership lost, or a failure): parked requests
    are answered `error`."""

    error: ErrorCode


@dataclass(frozen=True, slots=True)
class Deleted:
    """The group was deleted from the store (DeleteGroups, or offsets retention)."""


Event = (
    JoinGroup
    | SyncGroup
    | Heartbeat
    | LeaveGroup
    | OffsetCommit
    | Timeout
    | Load
    | Unload
    | Deleted
)

# -- actions -----------------------------------------------------------------------------

A = TypeVar("A")
LeaveAnswer = tuple[ErrorCode, tuple[tuple[str, str | None, ErrorCode], ...]]


@dataclass(frozen=True, slots=True)
class ParkJoin:
    member_id: str


@dataclass(frozen=True, slots=True)
class ParkSync:
    member_id: str


@dataclass(frozen=True, slots=True)
class AnswerJoin:
    member_id: str
    result: JoinResult


@dataclass(frozen=True, slots=True)
class AnswerSync:
    member_id: str
    result: SyncResult


Action = (
    Persist[groups_layer.StoredGroup]
    | ScheduleTimeout[Timeout]
    | CancelTimeout
    | CancelTimeouts
    | ParkJoin
    | ParkSync
    | AnswerJoin
    | AnswerSync
)


@dataclass(frozen=True, slots=True)
class Transition(Generic[A]):
    group: ClassicGroup | None  # None: there is no such group
    actions: tuple[Action | Respond[A], ...] = ()


def check_join(request: JoinRequest, settings: GroupSettings) -> JoinResult | None:
    """What a JoinGroup is answered before its group is looked at, if anything."""
    if not request.group_id:
        return JoinResult(ErrorCode.invalid_group_id, member_id=request.member_id)
    s = settings
    if not s.min_session_timeout_ms <= request.session_timeout_ms <= s.max_session_timeout_ms:
        return JoinResult(ErrorCode.invalid_session_timeout, member_id=request.member_id)
    return None


# -- the machine -------------------------------------------------------------------------


class ClassicGroupMachine:
    def __init__(self, settings: GroupSettings) -> None:
        self.settings = settings

    @overload
    def handle(
        self, group: ClassicGroup | None, event: JoinGroup, now_ms: int
    ) -> Transition[JoinResult]: ...
    @overload
    def handle(
        self, group: ClassicGroup | None, event: SyncGroup, now_ms: int
    ) -> Transition[SyncResult]: ...
    @overload
    def handle(
        self, group: ClassicGroup | None, event: Heartbeat | OffsetCommit, now_ms: int
    ) -> Transition[ErrorCode]: ...
    @overload
    def handle(
        self, group: ClassicGroup | None, event: LeaveGroup, now_ms: int
    ) -> Transition[LeaveAnswer]: ...
    @overload
    def handle(
        self,
        group: ClassicGroup | None,
        event: Timeout | Load | Unload | Deleted,
        now_ms: int,
    ) -> Transition[None]: ...

    def handle(
        self, group: ClassicGroup | None, event: Event, now_ms: int
    ) -> (
        Transition[JoinResult]
        | Transition[SyncResult]
        | Transition[ErrorCode]
        | Transition[LeaveAnswer]
        | Transition[None]
    ):
        if isinstance(event, Load):
            return self._load(event.stored, now_ms)
        if isinstance(event, JoinGroup):
            return self._join(group, event, now_ms)
        if isinstance(event, SyncGroup):
            return self._sync(group, event.request, now_ms)
        if isinstance(event, Heartbeat):
            return self._heartbeat(group, event, now_ms)
        if isinstance(event, LeaveGroup):
            return self._leave(group, event, now_ms)
        if isinstance(event, OffsetCommit):
            return self._offset_commit(group, event, now_ms)
        if group is None:
            return Transition(None)
        if isinstance(event, Unload):
            return self._unload(group, event.error)
        if isinstance(event, Deleted):
            step = _Step(group, self.settings, now_ms)
            step.transition_to(DEAD)
            step.add(CancelTimeouts())
            return step.finish()
        return self._timeout(group, event, now_ms)

    # -- requests ------------------------------------------------------------------------

    def _join(
        self, group: ClassicGroup | None, event: JoinGroup, now_ms: int
    ) -> Transition[JoinResult]:
        req = event.request
        if group is None:
            if req.member_id:
                unknown = JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id)
                return Transition(None, (Respond(unknown),))
            group = ClassicGroup(req.group_id, state_timestamp_ms=now_ms)
        step = _Step(group, self.settings, now_ms)
        if group.state is DEAD:
            unavailable = ErrorCode.coordinator_not_available
            return step.finish(JoinResult(unavailable, member_id=req.member_id))
        if req.member_id:
            return step.finish(step.join_existing_member(req))
        return step.finish(step.join_new_member(req, event.new_member_id))

    def _sync(
        self, group: ClassicGroup | None, req: SyncRequest, now_ms: int
    ) -> Transition[SyncResult]:
        if group is None or group.state is EMPTY:
            return Transition(group, (Respond(SyncResult(ErrorCode.unknown_member_id)),))
        step = _Step(group, self.settings, now_ms)
        if group.state is DEAD:
            return step.finish(SyncResult(ErrorCode.coordinator_not_available))
        return step.finish(step.sync(req))

    def _heartbeat(
        self, group: ClassicGroup | None, event: Heartbeat, now_ms: int
    ) -> Transition[ErrorCode]:
        if group is None:
            return Transition(None, (Respond(ErrorCode.unknown_member_id),))
        step = _Step(group, self.settings, now_ms)
        if group.state is DEAD:
            return step.finish(ErrorCode.coordinator_not_available)
        error = group.validate_member(event.member_id, event.group_instance_id)
        if error is None and event.generation != group.generation:
            error = ErrorCode.illegal_generation
        if error is None and group.state is EMPTY:
            error = ErrorCode.unknown_member_id
        if error is not None:
            return step.finish(error)
        step.reschedule_heartbeat(group.members[event.member_id])
        if group.state is PREPARING:
            return step.finish(ErrorCode.rebalance_in_progress)
        return step.finish(ErrorCode.none)

    def _leave(
        self, group: ClassicGroup | None, event: LeaveGroup, now_ms: int
    ) -> Transition[LeaveAnswer]:
        if group is None:
            unknown = ErrorCode.unknown_member_id
            answers = tuple((m, i, unknown) for m, i in event.members)
            return Transition(None, (Respond((ErrorCode.none, answers)),))
        step = _Step(group, self.settings, now_ms)
        if group.state is DEAD:
            return step.finish((ErrorCode.coordinator_not_available, ()))
        results = []
        left = False
        for member_id, instance_id in event.members:
            error = step.leave_one(member_id, instance_id)
            results.append((member_id, instance_id, error or ErrorCode.none))
            left = left or error is None
        if left:
            if step.g.state in (STABLE, COMPLETING):
                step.maybe_prepare_rebalance_or_complete_join("members left the group")
            elif step.g.state is PREPARING:
                step.maybe_complete_join_phase()
        answer: LeaveAnswer = (ErrorCode.none, tuple(results))
        return step.finish(answer)

    def _offset_commit(
        self, group: ClassicGroup | None, event: OffsetCommit, now_ms: int
    ) -> Transition[ErrorCode]:
        if group is None:
            return Transition(None, (Respond(ErrorCode.coordinator_not_available),))
        step = _Step(group, self.settings, now_ms)
        error = group.validate_offset_commit(
            event.member_id, event.group_instance_id, event.generation
        )
        if error is not None:
            return step.finish(error)
        member = group.members.get(event.member_id)
        if member is not None and group.state in (STABLE, PREPARING):
            step.reschedule_heartbeat(member)  # a commit keeps the session
        return step.finish(ErrorCode.none)

    # -- the store and ownership ---------------------------------------------------------

    def _load(self, stored: groups_layer.StoredGroup, now_ms: int) -> Transition[None]:
        group = ClassicGroup.from_stored(stored)
        logger.info(
            "loaded group %r generation %d with %d members (%s)",
            group.group_id,
            group.generation,
            len(group.members),
            stored.state,
        )
        step = _Step(group, self.settings, now_ms)
        for member in group.members.values():
            step.reschedule_heartbeat(member)
        if group.members and stored.state != groups_layer.STABLE:
            step.prepare_rebalance(f"loaded in state {stored.state}")
        return step.finish()

    def _unload(self, group: ClassicGroup, error: ErrorCode) -> Transition[None]:
        actions: list[Action | Respond[None]] = []
        members = []
        for m in group.members.values():
            if m.awaiting_join:
                actions.append(AnswerJoin(m.member_id, JoinResult(error, member_id=m.member_id)))
            if m.awaiting_sync:
                actions.append(AnswerSync(m.member_id, SyncResult(error)))
            members.append(replace(m, awaiting_join=False, awaiting_sync=False))
        actions.append(CancelTimeouts())
        return Transition(replace(group, state=DEAD, members=Members(members)), tuple(actions))

    # -- timeouts ------------------------------------------------------------------------

    def _timeout(self, group: ClassicGroup, timeout: Timeout, now_ms: int) -> Transition[None]:
        step = _Step(group, self.settings, now_ms)
        if group.state is DEAD:
            return step.finish()
        if isinstance(timeout, HeartbeatExpired):
            step.heartbeat_expired(timeout.member_id)
        elif isinstance(timeout, InitialDelayExpired):
            step.initial_delay_expired(timeout.delay_ms, timeout.remaining_ms)
        elif isinstance(timeout, JoinTimeout):
            step.complete_join()
        else:
            step.sync_expired(timeout.generation)
        return step.finish()


class _Step:
    """One transition in the making: the group as it is so far, and the actions so far."""

    def __init__(self, group: ClassicGroup, settings: GroupSettings, now_ms: int) -> None:
        self.g = group
        self.settings = settings
        self.now_ms = now_ms
        self.actions: list[Action] = []
        self.dirty = False  # members removed since the group was last persisted

    def finish(self, answer: A | None = None) -> Transition[A]:
        """The transition; the request being handled is answered last, if at all."""
        if self.dirty and self.g.state is not DEAD:
            self.persist()
        actions: list[Action | Respond[A]] = list(self.actions)
        if answer is not None:
            actions.append(Respond(answer))
        return Transition(self.g, tuple(actions))

    def add(self, action: Action) -> None:
        self.actions.append(action)

    def persist(
        self, *, state: GroupState | None = None, assignments: dict[str, bytes] | None = None
    ) -> None:
        self.actions.append(Persist(self.g.to_stored(state=state, assignments=assignments)))
        self.dirty = False

    def schedule(self, timeout: Timeout, delay_ms: int) -> None:
        self.actions.append(ScheduleTimeout(timeout, delay_ms))

    def reschedule_heartbeat(self, member: Member, timeout_ms: int | None = None) -> None:
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        self.schedule(HeartbeatExpired(member.member_id), delay)

    def cancel_heartbeat(self, member_id: str) -> None:
        self.actions.append(CancelTimeout(HeartbeatExpired(member_id).key))

    # -- the group -----------------------------------------------------------------------

    def transition_to(self, state: GroupState) -> None:
        g = self.g
        if g.state not in VALID_PREVIOUS[state]:
            raise ValueError(f"group {g.group_id}: {g.state} cannot move to {state}")
        self.g = replace(g, previous_state=g.state, state=state, state_timestamp_ms=self.now_ms)

    def put_member(self, member: Member) -> None:
        self.g = replace(self.g, members=self.g.members.put(member))

    def add_member(self, member: Member) -> None:
        """A new member; the request being handled waits for its JoinGroup answer."""
        g = self.g
        if member.group_instance_id is not None and member.group_instance_id in g.static_members:
            raise ValueError(f"static member {member.group_instance_id} is already a member")
        protocol_type = g.protocol_type if g.members else member.protocol_type
        if member.protocol_type != protocol_type:
            raise ValueError("the member's protocol type differs from the group's")
        self.g = replace(
            g,
            protocol_type=protocol_type,
            leader_id=member.member_id if g.leader_id is None else g.leader_id,
            members=g.members.put(replace(member, awaiting_join=True)),
            pending_join=g.pending_join - {member.member_id},
        )
        self.add(ParkJoin(member.member_id))

    def remove(self, member_id: str) -> None:
        g = self.g
        members = g.members.without(member_id) if member_id in g.members else g.members
        leader = g.leader_id
        if g.is_leader(member_id):
            leader = next(iter(members), None)
        self.g = replace(
            g,
            members=members,
            leader_id=leader,
            pending_join=g.pending_join - {member_id},
            pending_sync=g.pending_sync - {member_id},
        )

    def update_member(
        self,
        member: Member,
        protocols: Protocols,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
    ) -> Member:
        """New protocols and timeouts; the request being handled waits for the answer."""
        updated = replace(
            member,
            protocols=tuple(protocols),
            rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms,
            awaiting_join=True,
        )
        self.put_member(updated)
        self.add(ParkJoin(member.member_id))
        return updated

    def answer_join(self, member: Member, result: JoinResult) -> bool:
        """Answer the member's parked JoinGroup, if there is one."""
        if not member.awaiting_join:
            return False
        self.add(AnswerJoin(member.member_id, result))
        if member.member_id in self.g.members:
            self.put_member(replace(self.g.members[member.member_id], awaiting_join=False))
        return True

    def answer_sync(self, member: Member, result: SyncResult) -> bool:
        """Answer the member's parked SyncGroup, if there is one."""
        if not member.awaiting_sync:
            return False
        self.add(AnswerSync(member.member_id, result))
        if member.member_id in self.g.members:
            self.put_member(replace(self.g.members[member.member_id], awaiting_sync=False))
        return True

    def drop_member(self, member: Member) -> None:
        """Remove a member, answering its parked requests UNKNOWN_MEMBER_ID."""
        self.cancel_heartbeat(member.member_id)
        unknown = ErrorCode.unknown_member_id
        self.answer_join(member, JoinResult(unknown))
        self.answer_sync(member, SyncResult(unknown))
        self.remove(member.member_id)
        self.dirty = True

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else elect one that did; False if none did."""
        g = self.g
        if g.leader_id is None:
            return False
        leader = g.members.get(g.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member in g.members.values():
            if member.awaiting_join:
                self.g = replace(g, leader_id=member.member_id)
                return True
        return False

    def current_generation_answer(
        self,
        member_id: str,
        *,
        with_members: bool,
        leader: str | None = None,
        skip_assignment: bool = False,
    ) -> JoinResult:
        g = self.g
        return JoinResult(
            ErrorCode.none,
            member_id=member_id,
            generation=g.generation,
            protocol_type=g.protocol_type,
            protocol_name=g.protocol_name,
            leader=(g.leader_id or "") if leader is None else leader,
            skip_assignment=skip_assignment,
            members=g.current_members() if with_members else (),
        )

    # -- rebalancing ---------------------------------------------------------------------

    def maybe_prepare_rebalance_or_complete_join(self, reason: str) -> None:
        if self.g.can_rebalance():
            self.prepare_rebalance(reason)
        else:
            self.maybe_complete_join_phase()

    def prepare_rebalance(self, reason: str) -> None:
        if self.g.state is COMPLETING:
            self.g = replace(
                self.g,
                members=Members(replace(m, assignment=b"") for m in self.g.members.values()),
            )
            self.propagate_assignment(ErrorCode.rebalance_in_progress)
        self.g = replace(self.g, pending_sync=frozenset())
        self.add(CancelTimeout(SYNC_TIMEOUT_KEY))
        initial = self.g.state is EMPTY
        if initial:
            delay = self.settings.initial_rebalance_delay_ms
            remaining = max(self.g.rebalance_timeout_ms() - delay, 0)
            self.schedule(InitialDelayExpired(delay, remaining), delay)
        logger.info(
            "preparing to rebalance group %r in state %s with old generation %d (%s)",
            self.g.group_id,
            self.g.state,
            self.g.generation,
            reason,
        )
        self.transition_to(PREPARING)
        if not initial:
            self.maybe_complete_join_else_schedule()

    def initial_delay_expired(self, delay_ms: int, remaining_ms: int) -> None:
        if self.g.new_member_added and remaining_ms != 0:
            # A member joined during the delay: wait once more, within the rebalance timeout.
            self.g = replace(self.g, new_member_added=False)
            new_delay = min(self.settings.initial_rebalance_delay_ms, remaining_ms)
            self.schedule(
                InitialDelayExpired(new_delay, max(remaining_ms - delay_ms, 0)), new_delay
            )
        else:
            self.complete_join()

    def maybe_complete_join_else_schedule(self) -> None:
        if self.g.has_all_members_joined():
            self.complete_join()
        else:
            self.schedule(JoinTimeout(), self.g.rebalance_timeout_ms())

    def maybe_complete_join_phase(self) -> None:
        g = self.g
        if g.state is not PREPARING:
            return
        if g.previous_state is EMPTY:
            return  # the initial rebalance waits for its delay
        if g.has_all_members_joined():
            self.complete_join()

    def complete_join(self) -> None:
        if self.g.state is not PREPARING:
            return
        self.add(CancelTimeout(JOIN_TIMEOUT_KEY))
        gone = [m for m in self.g.not_yet_rejoined() if m.group_instance_id is None]
        for member in gone:
            self.cancel_heartbeat(member.member_id)
            self.remove(member.member_id)
            self.dirty = True
        if gone:
            logger.info(
                "group %r removed members that did not rejoin: %s",
                self.g.group_id,
                [m.member_id for m in gone],
            )
        if not self.maybe_elect_new_joined_leader() and self.g.members:
            # Nobody rejoined: wait another rebalance timeout; sessions expire meanwhile.
            logger.warning(
                "group %r could not complete a rebalance: no member rejoined", self.g.group_id
            )
            self.schedule(JoinTimeout(), self.g.rebalance_timeout_ms())
            return
        self.init_next_generation()
        self.persist()
        g = self.g
        if g.state is EMPTY:
            logger.info("group %r with generation %d is now empty", g.group_id, g.generation)
            return
        logger.info(
            "stabilized group %r generation %d (%s) with %d members",
            g.group_id,
            g.generation,
            g.protocol_name,
            len(g.members),
        )
        everyone = g.current_members()
        members = []
        for member in g.members.values():
            if member.awaiting_join:
                result = JoinResult(
                    ErrorCode.none,
                    member_id=member.member_id,
                    generation=g.generation,
                    protocol_type=g.protocol_type,
                    protocol_name=g.protocol_name,
                    leader=g.leader_id or "",
                    members=everyone if g.is_leader(member.member_id) else (),
                )
                self.add(AnswerJoin(member.member_id, result))
            self.reschedule_heartbeat(member)
            members.append(replace(member, awaiting_join=False, is_new=False))
        self.g = replace(
            g,
            members=Members(members),
            pending_sync=g.pending_sync | {m.member_id for m in members},
        )
        self.schedule(SyncTimeout(g.generation), self.g.rebalance_timeout_ms())

    def init_next_generation(self) -> None:
        g = self.g
        if g.members:
            self.g = replace(g, generation=g.generation + 1, protocol_name=g.select_protocol())
            self.transition_to(COMPLETING)
        else:
            self.g = replace(g, generation=g.generation + 1, protocol_name=None)
            self.transition_to(EMPTY)
        self.g = replace(
            self.g, subscribed_topics=self.g.compute_subscribed_topics(), pending_sync=frozenset()
        )

    def propagate_assignment(self, error: ErrorCode) -> None:
        """Answer every parked SyncGroup: with its assignment, or with `error`."""
        g = self.g
        ok = error is ErrorCode.none
        members = []
        for member in g.members.values():
            if member.awaiting_sync:
                result = SyncResult(
                    error,
                    protocol_type=g.protocol_type if ok else None,
                    protocol_name=g.protocol_name if ok else None,
                    assignment=member.assignment,
                )
                self.add(AnswerSync(member.member_id, result))
                self.reschedule_heartbeat(member)
                member = replace(member, awaiting_sync=False)
            members.append(member)
        self.g = replace(g, members=Members(members))

    # -- timeouts ------------------------------------------------------------------------

    def heartbeat_expired(self, member_id: str) -> None:
        if member_id in self.g.pending_join:
            logger.info("pending member %s of group %r expired", member_id, self.g.group_id)
            self.remove(member_id)
            if self.g.state is PREPARING and self.g.has_all_members_joined():
                self.complete_join()
            return
        member = self.g.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        logger.info(
            "member %s of group %r failed its session, removing it", member_id, self.g.group_id
        )
        self.drop_member(member)
        if self.g.state in (STABLE, COMPLETING):
            self.maybe_prepare_rebalance_or_complete_join("member removed")
        elif self.g.state is PREPARING and self.g.has_all_members_joined():
            self.complete_join()

    def sync_expired(self, generation: int) -> None:
        g = self.g
        if generation != g.generation or g.state not in (COMPLETING, STABLE):
            return
        if not g.pending_sync:
            return
        late = sorted(g.pending_sync)
        for member_id in late:
            member = self.g.members.get(member_id)
            if member is not None:
                self.drop_member(member)
        logger.info("group %r removed members that did not sync in time: %s", g.group_id, late)
        self.prepare_rebalance("members did not send SyncGroup in time")

    # -- JoinGroup -----------------------------------------------------------------------

    def join_new_member(self, req: JoinRequest, new_id: str) -> JoinResult | None:
        """A JoinGroup without member id: its answer now, or None when it is parked."""
        g = self.g
        if not g.supports_protocols(req.protocol_type, (n for n, _m in req.protocols)):
            return JoinResult(ErrorCode.inconsistent_group_protocol)
        if req.group_instance_id is not None:
            existing = g.static_members.get(req.group_instance_id)
            if existing is not None:
                self.update_static_member(req, existing, new_id)
            else:
                self.add_member_and_rebalance(req, new_id)
        elif req.require_known_member_id:
            # JoinGroup v4+: hand out the id first; the member joins again with it.
            self.g = replace(g, pending_join=g.pending_join | {new_id})
            self.schedule(HeartbeatExpired(new_id), req.session_timeout_ms)
            return JoinResult(ErrorCode.member_id_required, member_id=new_id)
        else:
            self.add_member_and_rebalance(req, new_id)
        return None

    def join_existing_member(self, req: JoinRequest) -> JoinResult | None:
        """A JoinGroup with a member id: its answer now, or None when it is parked."""
        member_id = req.member_id
        g = self.g
        if not g.supports_protocols(req.protocol_type, (n for n, _m in req.protocols)):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        if member_id in g.pending_join:
            self.add_member_and_rebalance(req, member_id)
            return None
        error = g.validate_member(member_id, req.group_instance_id)
        if error is not None:
            return JoinResult(error, member_id=member_id)
        member = g.members[member_id]
        if g.state is PREPARING:
            self.update_member_and_rebalance(
                member, req, f"member {member_id} joins during a rebalance"
            )
        elif g.state is COMPLETING:
            if member.matches(req.protocols):
                # It missed the JoinGroup answer: give it again.
                return self.current_generation_answer(
                    member_id, with_members=g.is_leader(member_id)
                )
            self.update_member_and_rebalance(
                member, req, f"member {member_id} changed its protocols"
            )
        elif g.state is STABLE:
            if g.is_leader(member_id):
                # The leader rejoins to rebalance for what the group cannot see (e.g. a
                # topic's partition count changed).
                self.update_member_and_rebalance(member, req, f"leader {member_id} rejoins")
            elif not member.matches(req.protocols):
                self.update_member_and_rebalance(
                    member, req, f"member {member_id} changed its protocols"
                )
            else:
                return self.current_generation_answer(member_id, with_members=False)
        else:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        return None

    def add_member_and_rebalance(self, req: JoinRequest, member_id: str) -> None:
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
            is_new=True,
        )
        if self.g.state is PREPARING and self.g.previous_state is EMPTY:
            self.g = replace(self.g, new_member_added=True)
        self.add_member(member)
        # A new member cannot heartbeat while its JoinGroup is parked; bound that wait.
        self.reschedule_heartbeat(member, self.settings.new_member_join_timeout_ms)
        self.maybe_prepare_rebalance_or_complete_join(
            f"adding member {member_id} ({req.reason or 'no reason given'})"
        )

    def update_member_and_rebalance(self, member: Member, req: JoinRequest, reason: str) -> None:
        self.update_member(member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms)
        self.maybe_prepare_rebalance_or_complete_join(reason)

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """Hand the instance's place (and assignment) to a new member id; fence the old."""
        old = self.g.members.get(old_id)
        if old is None:
            raise ValueError(f"no member {old_id} for static member {instance_id}")
        self.g = replace(self.g, members=self.g.members.without(old_id))
        fenced = ErrorCode.fenced_instance_id
        self.answer_join(old, JoinResult(fenced, member_id=old_id))
        self.answer_sync(old, SyncResult(fenced))
        new = Member(
            new_id,
            old.group_instance_id,
            old.client_id,
            old.client_host,
            old.rebalance_timeout_ms,
            old.session_timeout_ms,
            old.protocol_type,
            old.protocols,
            old.assignment,
        )
        leader = new_id if self.g.is_leader(old_id) else self.g.leader_id
        self.g = replace(self.g, members=self.g.members.put(new), leader_id=leader)
        return new

    def update_static_member(self, req: JoinRequest, old_id: str, new_id: str) -> None:
        instance_id = req.group_instance_id
        assert instance_id is not None
        current_leader = self.g.leader_id or ""
        member = self.replace_static_member(instance_id, old_id, new_id)
        self.cancel_heartbeat(old_id)
        self.reschedule_heartbeat(member)
        member = self.update_member(
            member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms
        )
        g = self.g
        if g.state is STABLE:
            if g.protocol_name == g.select_protocol():
                # Same protocol: the instance gets its old place back without a rebalance.
                logger.info(
                    "static member %s of group %r rejoined as %s without a rebalance",
                    instance_id,
                    g.group_id,
                    new_id,
                )
                self.persist()
                if req.supports_skip_assignment:
                    is_leader = g.is_leader(new_id)
                    answer = self.current_generation_answer(
                        new_id, with_members=is_leader, skip_assignment=is_leader
                    )
                else:
                    answer = self.current_generation_answer(
                        new_id, with_members=False, leader=current_leader
                    )
                self.answer_join(member, answer)
            else:
                self.maybe_prepare_rebalance_or_complete_join(
                    f"static member {instance_id} rejoined with other protocols"
                )
        elif g.state is COMPLETING:
            # The leader may already be assigning to the old member id: start over.
            self.prepare_rebalance(f"static member {instance_id} rejoined")
        else:
            self.maybe_complete_join_phase()

    # -- SyncGroup -----------------------------------------------------------------------

    def sync(self, req: SyncRequest) -> SyncResult | None:
        """A SyncGroup: its answer now, or None when it is parked."""
        g = self.g
        error = g.validate_member(req.member_id, req.group_instance_id)
        if error is None and req.generation != g.generation:
            error = ErrorCode.illegal_generation
        if error is None and (
            _inconsistent(req.protocol_type, g.protocol_type)
            or _inconsistent(req.protocol_name, g.protocol_name)
        ):
            error = ErrorCode.inconsistent_group_protocol
        if error is not None:
            return SyncResult(error)
        member = g.members[req.member_id]
        if g.state is PREPARING:
            return SyncResult(ErrorCode.rebalance_in_progress)
        if g.state is STABLE:
            self.g = replace(g, pending_sync=g.pending_sync - {req.member_id})
            return SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name, member.assignment)
        # CompletingRebalance: park until the leader's assignment is stored.
        self.put_member(replace(member, awaiting_sync=True))
        self.add(ParkSync(req.member_id))
        self.g = replace(self.g, pending_sync=self.g.pending_sync - {req.member_id})
        if not self.g.pending_sync:
            self.add(CancelTimeout(SYNC_TIMEOUT_KEY))
        if g.is_leader(req.member_id):
            self.store_assignment(dict(req.assignments))
        return None

    def store_assignment(self, assignments: dict[str, bytes]) -> None:
        g = self.g
        full = {m: assignments.get(m, b"") for m in g.members}
        missing = [m for m in g.members if m not in assignments]
        if missing:
            logger.warning(
                "group %r generation %d: no assignment for %s, giving them an empty one",
                g.group_id,
                g.generation,
                missing,
            )
        self.persist(state=STABLE, assignments=full)
        self.g = replace(
            g,
            members=Members(replace(m, assignment=full[m.member_id]) for m in g.members.values()),
        )
        self.transition_to(STABLE)
        self.propagate_assignment(ErrorCode.none)

    # -- LeaveGroup ----------------------------------------------------------------------

    def leave_one(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        g = self.g
        if not member_id:
            # Removal by group.instance.id alone (an admin removing a static member).
            existing = g.static_members.get(instance_id) if instance_id is not None else None
            if existing is None:
                return ErrorCode.unknown_member_id
            self.drop_member(g.members[existing])
            return None
        if member_id in g.pending_join:
            self.remove(member_id)
            self.cancel_heartbeat(member_id)
            return None
        error = g.validate_member(member_id, instance_id)
        if error is not None:
            return error
        logger.info("member %s left group %r", member_id, g.group_id)
        self.drop_member(g.members[member_id])
        return None


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
