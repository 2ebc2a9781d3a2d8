"""The consumer group protocol (KIP-848) as a pure state machine: Apache Kafka's
consumer-group part of its GroupMetadataManager, its TargetAssignmentBuilder and its
CurrentAssignmentBuilder, without I/O.

`ConsumerGroupMachine.handle(group, event, now_ms)` returns a `Transition`: the group's new
value and the actions the coordinator (the shell) must run, in order. Rules:

* nothing here does I/O, reads a clock or draws a random number: the time, the id a member
  without one gets (ConsumerGroupHeartbeat v0) and the topics that exist come in with the
  event; the group given is a value and is never changed;
* a heartbeat is answered at once (`Respond`, always last): nothing is parked;
* `Persist` comes before the answer whenever the group changed, so that an epoch or an
  assignment is only answered once it is stored; the shell stops at the first action that
  fails and gives the group up;
* timeouts are events the machine asks for: `ScheduleTimeout` replaces the timeout with the
  same key and the shell hands it back to `handle` when due. Each member has a session
  (every heartbeat restarts it; when it runs out the member is removed) and, while it holds
  partitions it was asked to revoke, a rebalance timeout (when it runs out at the same
  member epoch the member is removed);
* a heartbeat of a member that joins or changes its subscription, and any change of the
  subscribed topics (one created that a regex matches, partitions added, a topic deleted),
  bump the group epoch; the heartbeat that finds the group epoch ahead of the assignment
  epoch computes the target assignment again, with the assignor most members name
  (`server_assignor`), or the first configured;
* only the member that heartbeats is reconciled toward its target: first it gives up what
  it must (UNREVOKED_PARTITIONS, at its epoch, until a heartbeat lists its owned partitions
  without them), then it is given what no other member still holds (what another holds
  waits: UNRELEASED_PARTITIONS) and takes the assignment epoch. No partition is ever held
  (assigned or pending revocation) by two members.

Errors are Apache Kafka's: INVALID_REQUEST for a malformed request, GROUP_ID_NOT_FOUND for
a heartbeat other than a join to a group that does not exist, UNKNOWN_MEMBER_ID,
FENCED_MEMBER_EPOCH, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION,
UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID and GROUP_MAX_SIZE_REACHED.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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
from broker.groups.assignors import ASSIGNORS, MemberSpec
from broker.groups.consumer import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    InvalidRegex,
    MemberState,
    Partitions,
    TopicsByName,
    by_topic,
    compile_regex,
    from_topics,
    sorted_names,
)
from broker.groups.settings import ConsumerGroupSettings
from metadata import consumer_groups as stored

logger = logging.getLogger(__name__)

# The first version whose members make their own ids (KIP-1082).
MEMBER_ID_BY_CLIENT_VERSION = 1

TopicPartitions = tuple[tuple[bytes, tuple[int, ...]], ...]

# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """The fields of a ConsumerGroupHeartbeat request (topic ids as 16 raw bytes). None,
    and -1 for the rebalance timeout, mean "unchanged since the last heartbeat"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: TopicPartitions | None = None  # owned by the member


@dataclass(frozen=True, slots=True)
class Heartbeat:
    request: HeartbeatRequest
    topics: TopicsByName = field(default_factory=dict)  # every topic that exists
    client_id: str = ""
    client_host: str = ""
    new_member_id: str = ""  # for a v0 member joining without an id (made by the shell)
    api_version: int = 1


@dataclass(frozen=True, slots=True)
class SessionExpired:
    member_id: str

    @property
    def key(self) -> TimeoutKey:
        return session_key(self.member_id)


@dataclass(frozen=True, slots=True)
class RebalanceExpired:
    """The member did not revoke in time what it was asked to at `member_epoch`."""

    member_id: str
    member_epoch: int

    @property
    def key(self) -> TimeoutKey:
        return rebalance_key(self.member_id)


def session_key(member_id: str) -> TimeoutKey:
    return ("consumer-session", member_id)


def rebalance_key(member_id: str) -> TimeoutKey:
    return ("consumer-rebalance", member_id)


Timeout = SessionExpired | RebalanceExpired


@dataclass(frozen=True, slots=True)
class Load:
    """The group read from the store by a coordinator that takes it over."""

    stored: stored.StoredConsumerGroup


@dataclass(frozen=True, slots=True)
class Unload:
    """This coordinator gives the group up (ownership lost, a failure, or the group deleted)."""


Event = Heartbeat | Timeout | Load | Unload

# -- actions -----------------------------------------------------------------------------

A = TypeVar("A")


Action = (
    Persist[stored.StoredConsumerGroup] | ScheduleTimeout[Timeout] | CancelTimeout | CancelTimeouts
)


@dataclass(frozen=True, slots=True)
class Transition(Generic[A]):
    group: ConsumerGroup | None  # None: there is no such group
    actions: tuple[Action | Respond[A], ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """The fields of a ConsumerGroupHeartbeat response; `assignment` None: not sent."""

    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: TopicPartitions | None = None


class HeartbeatError(Exception):
    """A heartbeat refused with Kafka's error code and message."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _blank(value: str | None) -> bool:
    return value is not None and not value.strip()


def check_heartbeat(
    req: HeartbeatRequest, api_version: int, settings: ConsumerGroupSettings
) -> HeartbeatError | None:
    """What is wrong with a heartbeat before its group is looked at (Apache Kafka's
    request validation), or None."""

    def invalid(message: str) -> HeartbeatError:
        return HeartbeatError(ErrorCode.invalid_request, message)

    epoch = req.member_epoch
    if (api_version >= MEMBER_ID_BY_CLIENT_VERSION or epoch > 0 or epoch == -1) and (
        not req.member_id.strip()
    ):
        return invalid("MemberId can't be empty.")
    if not req.group_id.strip():
        return invalid("GroupId can't be empty.")
    if _blank(req.instance_id):
        return invalid("InstanceId can't be empty.")
    if _blank(req.rack_id):
        return invalid("RackId can't be empty.")
    if epoch == 0:
        if req.rebalance_timeout_ms == -1:
            return invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.topic_partitions is None or req.topic_partitions:
            return invalid("TopicPartitions must be empty when (re-)joining.")
        if not req.subscribed_topic_names and not req.subscribed_topic_regex:
            return invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if req.instance_id is None:
            return invalid("InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        return invalid("MemberEpoch is invalid.")
    if req.rebalance_timeout_ms < -1:
        return invalid("RebalanceTimeoutMs is invalid.")
    if req.server_assignor is not None and req.server_assignor not in settings.assignors:
        return HeartbeatError(
            ErrorCode.unsupported_assignor,
            f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
            f"{', '.join(settings.assignors)}.",
        )
    if req.subscribed_topic_regex:
        try:
            compile_regex(req.subscribed_topic_regex)
        except InvalidRegex as e:
            return HeartbeatError(ErrorCode.invalid_regular_expression, str(e))
    return None


# -- reconciliation ----------------------------------------------------------------------


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Partitions,
    held_by_others: Mapping[tuple[bytes, int], str],
    owned: Partitions | None,
) -> ConsumerMember:
    """The member's next step toward `target` (Apache Kafka's CurrentAssignmentBuilder).
    `owned`: what the member said it owns in this heartbeat (None: not said)."""

    def still_owns(partitions: Partitions) -> bool:
        return owned is None or bool(owned & partitions)

    if member.state is MemberState.STABLE and member.member_epoch == target_epoch:
        return member
    if member.state is MemberState.UNREVOKED_PARTITIONS and still_owns(member.pending_revocation):
        return member
    keep = member.assigned & target
    revoke = member.assigned - keep
    if revoke and still_owns(revoke):
        # Give up first, at the current epoch; nothing new until the member acks.
        return replace(
            member,
            state=MemberState.UNREVOKED_PARTITIONS,
            previous_member_epoch=member.member_epoch,
            assigned=keep,
            pending_revocation=revoke,
        )
    wanted = target - keep
    unreleased = frozenset(tp for tp in wanted if tp in held_by_others)
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return replace(
        member,
        state=state,
        member_epoch=target_epoch,
        previous_member_epoch=member.member_epoch,
        assigned=keep | (wanted - unreleased),
        pending_revocation=frozenset(),
    )


# -- the machine -------------------------------------------------------------------------


class ConsumerGroupMachine:
    def __init__(self, settings: ConsumerGroupSettings) -> None:
        unknown = [a for a in settings.assignors if a not in ASSIGNORS]
        if unknown:
            raise ValueError(
                f"group.consumer.assignors: unknown assignor(s) {unknown}; "
                f"known: {sorted(ASSIGNORS)}"
            )
        self.settings = settings

    @overload
    def handle(
        self, group: ConsumerGroup | None, event: Heartbeat, now_ms: int
    ) -> Transition[HeartbeatAnswer]: ...
    @overload
    def handle(
        self, group: ConsumerGroup | None, event: Timeout | Load | Unload, now_ms: int
    ) -> Transition[None]: ...

    def handle(
        self, group: ConsumerGroup | None, event: Event, now_ms: int
    ) -> Transition[HeartbeatAnswer] | Transition[None]:
        if isinstance(event, Heartbeat):
            step = _Step(group, self.settings)
            try:
                answer = step.heartbeat(event)
            except HeartbeatError as e:
                refused = HeartbeatAnswer(e.error, e.message)
                return Transition(group, (Respond(refused),))
            return step.finish(group, answer)
        if isinstance(event, Load):
            return self._load(event.stored)
        if group is None:
            return Transition(None)
        if isinstance(event, Unload):
            return Transition(None, (CancelTimeouts(),))
        step = _Step(group, self.settings)
        if isinstance(event, SessionExpired):
            member = group.members.get(event.member_id)
            if member is not None:
                logger.info(
                    "member %s of consumer group %r failed its session, removing it",
                    member.member_id,
                    group.group_id,
                )
                step.fence(member)
        else:
            member = group.members.get(event.member_id)
            if (
                member is not None
                and member.member_epoch == event.member_epoch
                and member.state is MemberState.UNREVOKED_PARTITIONS
            ):
                logger.info(
                    "member %s of consumer group %r did not revoke its partitions within "
                    "its rebalance timeout, removing it",
                    member.member_id,
                    group.group_id,
                )
                step.fence(member)
        return step.finish(group, None)

    def _load(self, stored_group: stored.StoredConsumerGroup) -> Transition[None]:
        group = ConsumerGroup.from_stored(stored_group)
        logger.info(
            "loaded consumer group %r at epoch %d with %d members",
            group.group_id,
            group.group_epoch,
            len(group.members),
        )
        actions: list[Action | Respond[None]] = []
        for member in group.members.values():
            actions.append(
                ScheduleTimeout(SessionExpired(member.member_id), self.settings.session_timeout_ms)
            )
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                actions.append(
                    ScheduleTimeout(
                        RebalanceExpired(member.member_id, member.member_epoch),
                        member.rebalance_timeout_ms,
                    )
                )
        return Transition(group, tuple(actions))


class _Step:
    """One transition being built: the group as it becomes, and the actions so far."""

    def __init__(self, group: ConsumerGroup | None, settings: ConsumerGroupSettings) -> None:
        self.g = group
        self.settings = settings
        self.actions: list[Action] = []

    def finish(self, before: ConsumerGroup | None, answer: A) -> Transition[A]:
        actions: list[Action | Respond[A]] = []
        if self.g is not None and self.g != before:
            actions.append(Persist(self.g.to_stored()))
        actions.extend(self.actions)
        actions.append(Respond(answer))
        return Transition(self.g, tuple(actions))

    @property
    def group(self) -> ConsumerGroup:
        assert self.g is not None
        return self.g

    # -- membership ----------------------------------------------------------------------

    def fence(self, member: ConsumerMember) -> None:
        """Remove the member; its partitions are free for the others at the next epoch."""
        g = self.group.without_member(member.member_id)
        # What is still subscribed is among what was: no topic list is needed to shrink it.
        metadata = g.compute_subscription_metadata(g.subscription_metadata)
        self.g = replace(g, group_epoch=g.group_epoch + 1, subscription_metadata=metadata)
        self.actions.append(CancelTimeout(session_key(member.member_id)))
        self.actions.append(CancelTimeout(rebalance_key(member.member_id)))

    def leave(self, req: HeartbeatRequest) -> HeartbeatAnswer:
        g = self.g
        if g is None:
            raise HeartbeatError(
                ErrorCode.group_id_not_found, f"Consumer group {req.group_id} not found."
            )
        if req.instance_id is None:
            member = g.members.get(req.member_id)
            if member is None:
                raise _unknown_member(req.member_id, g.group_id)
            logger.info("member %s left consumer group %r", member.member_id, g.group_id)
            self.fence(member)
            return HeartbeatAnswer(
                ErrorCode.none, member_id=req.member_id, member_epoch=req.member_epoch
            )
        member = self._static_member(g, req.instance_id, req.member_id)
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # It means to come back: it keeps its assignment until its session runs out.
            logger.info(
                "static member %s (%s) left consumer group %r for now",
                member.member_id,
                req.instance_id,
                g.group_id,
            )
            self.g = g.with_member(
                replace(
                    member,
                    member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                    pending_revocation=frozenset(),
                )
            )
        else:
            logger.info(
                "static member %s (%s) left consumer group %r",
                member.member_id,
                req.instance_id,
                g.group_id,
            )
            self.fence(member)
        return HeartbeatAnswer(
            ErrorCode.none, member_id=req.member_id, member_epoch=req.member_epoch
        )

    @staticmethod
    def _static_member(g: ConsumerGroup, instance_id: str, member_id: str) -> ConsumerMember:
        member = g.static_member(instance_id)
        if member is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown."
            )
        if member.member_id != member_id:
            raise HeartbeatError(
                ErrorCode.fenced_instance_id,
                f"Static member {member_id} with instance id {instance_id} was fenced by "
                f"member {member.member_id}.",
            )
        return member

    # -- the heartbeat -------------------------------------------------------------------

    def heartbeat(self, event: Heartbeat) -> HeartbeatAnswer:
        req = event.request
        refused = check_heartbeat(req, event.api_version, self.settings)
        if refused is not None:
            raise refused
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self.leave(req)
        joining = req.member_epoch == 0
        if self.g is None:
            if not joining:
                raise HeartbeatError(
                    ErrorCode.group_id_not_found, f"Consumer group {req.group_id} not found."
                )
            self.g = ConsumerGroup(req.group_id)
        g = self.group
        member_id = req.member_id or event.new_member_id
        owned = None if req.topic_partitions is None else from_topics(req.topic_partitions)

        replaced: ConsumerMember | None = None  # a static member this one takes over from
        if req.instance_id is None:
            member = self._dynamic_member(g, member_id, req.member_epoch, owned)
        elif joining:
            member, replaced = self._joining_static_member(g, req.instance_id, member_id)
        else:
            member = self._static_member(g, req.instance_id, member_id)
            _check_epoch(member, req.member_epoch, owned)
        if member_id not in g.members and replaced is None:
            if len(g.members) >= self.settings.max_size:
                raise HeartbeatError(
                    ErrorCode.group_max_size_reached,
                    f"The consumer group has reached its maximum capacity of "
                    f"{self.settings.max_size} members.",
                )
            logger.info("member %s joins consumer group %r", member_id, g.group_id)

        # 1. The member as it says it is now; the group epoch grows with its subscription
        # or with the subscribed topics.
        updated = replace(
            member,
            instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
            rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(
                req.rebalance_timeout_ms
                if req.rebalance_timeout_ms != -1
                else member.rebalance_timeout_ms
            ),
            server_assignor=(
                req.server_assignor if req.server_assignor is not None else member.server_assignor
            ),
            subscribed_topic_names=(
                sorted_names(req.subscribed_topic_names)
                if req.subscribed_topic_names is not None
                else member.subscribed_topic_names
            ),
            subscribed_topic_regex=(
                (req.subscribed_topic_regex or None)
                if req.subscribed_topic_regex is not None
                else member.subscribed_topic_regex
            ),
            client_id=event.client_id,
            client_host=event.client_host,
        )
        before = replaced or (g.members.get(member_id) if member_id in g.members else None)
        bump = before is None or (
            updated.subscribed_topic_names != before.subscribed_topic_names
            or updated.subscribed_topic_regex != before.subscribed_topic_regex
        )
        if replaced is not None:
            # The new member id inherits the instance's target: the assignors keep it.
            inherited = g.target.get(replaced.member_id, frozenset())
            g = g.without_member(replaced.member_id)
            g = replace(g, target={**g.target, member_id: inherited})
            self.actions.append(CancelTimeout(session_key(replaced.member_id)))
            self.actions.append(CancelTimeout(rebalance_key(replaced.member_id)))
        g = g.with_member(updated)
        metadata = g.compute_subscription_metadata(event.topics)
        if metadata != g.subscription_metadata:
            bump = True
            g = replace(g, subscription_metadata=metadata)
        if bump:
            g = replace(g, group_epoch=g.group_epoch + 1)

        # 2. A target assignment for the group epoch, when it has none yet.
        if g.group_epoch > g.assignment_epoch:
            g = self._assign(g)

        # 3. The member one step closer to its target.
        held = g.owners(excluding=member_id)
        target = g.target.get(member_id, frozenset())
        reconciled = reconcile(updated, g.assignment_epoch, target, held, owned)
        if reconciled != updated:
            g = g.with_member(reconciled)
            if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
                self.actions.append(
                    ScheduleTimeout(
                        RebalanceExpired(member_id, reconciled.member_epoch),
                        reconciled.rebalance_timeout_ms,
                    )
                )
            else:
                self.actions.append(CancelTimeout(rebalance_key(member_id)))
        self.actions.append(
            ScheduleTimeout(SessionExpired(member_id), self.settings.session_timeout_ms)
        )
        self.g = g

        full = joining or (
            req.rebalance_timeout_ms != -1
            and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None)
            and req.topic_partitions is not None
        )
        changed = before is None or reconciled.assigned != before.assigned
        return HeartbeatAnswer(
            ErrorCode.none,
            member_id=member_id,
            member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
            assignment=by_topic(reconciled.assigned) if full or changed else None,
        )

    @staticmethod
    def _dynamic_member(
        g: ConsumerGroup, member_id: str, epoch: int, owned: Partitions | None
    ) -> ConsumerMember:
        member = g.members.get(member_id)
        if member is None:
            if epoch != 0:
                raise _unknown_member(member_id, g.group_id)
            return ConsumerMember(member_id)
        _check_epoch(member, epoch, owned)
        return member

    @staticmethod
    def _joining_static_member(
        g: ConsumerGroup, instance_id: str, member_id: str
    ) -> tuple[ConsumerMember, ConsumerMember | None]:
        existing = g.static_member(instance_id)
        if existing is None:
            if member_id in g.members:
                raise HeartbeatError(
                    ErrorCode.fenced_instance_id,
                    f"Member {member_id} joins with instance id {instance_id} it did not have.",
                )
            return ConsumerMember(member_id, instance_id=instance_id), None
        if (
            existing.member_id != member_id
            and existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
        ):
            raise HeartbeatError(
                ErrorCode.unreleased_instance_id,
                f"Static member {existing.member_id} with instance id {instance_id} is not "
                "released yet.",
            )
        # The instance comes back: it takes its assignment over, at epoch 0.
        logger.info(
            "static member %s (%s) rejoins consumer group %r as %s",
            existing.member_id,
            instance_id,
            g.group_id,
            member_id,
        )
        return (
            replace(
                existing,
                member_id=member_id,
                member_epoch=0,
                previous_member_epoch=0,
                state=MemberState.STABLE,
                pending_revocation=frozenset(),
            ),
            existing,
        )

    def _assign(self, g: ConsumerGroup) -> ConsumerGroup:
        name = self._preferred_assignor(g)
        specs = {
            m.member_id: MemberSpec(
                g.subscribed_topic_ids(m), frozenset(g.target.get(m.member_id, frozenset()))
            )
            for m in g.members.values()
        }
        partitions = dict(g.subscription_metadata.values())
        target = ASSIGNORS[name](specs, partitions)
        logger.info(
            "consumer group %r: target assignment for epoch %d by %s over %d members",
            g.group_id,
            g.group_epoch,
            name,
            len(specs),
        )
        return replace(g, target=target, assignment_epoch=g.group_epoch)

    def _preferred_assignor(self, g: ConsumerGroup) -> str:
        """The assignor most members name; ties go to the one configured first."""
        votes = Counter(m.server_assignor for m in g.members.values() if m.server_assignor)
        if not votes:
            return self.settings.assignors[0]
        order = {name: i for i, name in enumerate(self.settings.assignors)}
        return min(votes, key=lambda a: (-votes[a], order.get(a, len(order)), a))


def _unknown_member(member_id: str, group_id: str) -> HeartbeatError:
    return HeartbeatError(
        ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {group_id}."
    )


def _check_epoch(member: ConsumerMember, epoch: int, owned: Partitions | None) -> None:
    """Apache Kafka's member epoch check: a member one epoch behind may go on when what it
    owns is part of what it is assigned (the answer that moved it on was lost)."""
    if epoch > member.member_epoch:
        raise HeartbeatError(
            ErrorCode.fenced_member_epoch,
            f"The consumer group member has a greater member epoch ({epoch}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )
    if epoch < member.member_epoch and (
        epoch != member.previous_member_epoch or owned is None or not owned <= member.assigned
    ):
        raise HeartbeatError(
            ErrorCode.fenced_member_epoch,
            f"The consumer group member has a smaller member epoch ({epoch}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )
