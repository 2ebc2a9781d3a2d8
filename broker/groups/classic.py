"""The classic group: members, protocols and the state machine's states, in memory.

States and their allowed predecessors (Apache Kafka's ClassicGroupState):

  Empty               <- PreparingRebalance
  PreparingRebalance  <- Stable, CompletingRebalance, Empty
  CompletingRebalance <- PreparingRebalance
  Stable              <- CompletingRebalance
  Dead                <- any state

Rules kept here (the coordinator drives the transitions and the timers):

* the protocol type is fixed by the first member; a joining member must name it and
  support at least one protocol that every member supports (INCONSISTENT_GROUP_PROTOCOL);
* the group's protocol is chosen by vote: every member votes for its first-listed
  protocol among those all members support; most votes wins;
* a static member (group.instance.id) keeps its place across restarts; a request naming
  the instance with another member id is FENCED_INSTANCE_ID;
* the first member to join becomes leader; a leader that does not rejoin is replaced by a
  member that did.

Nothing here does I/O. Parked JoinGroup/SyncGroup requests are `Promise`s that the
group completes.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from broker.sync import Promise
from metadata import groups as store

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}

Protocols = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool = True  # JoinGroup v4+
    supports_skip_assignment: bool = True  # JoinGroup v9+
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]


@dataclass(eq=False, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_waiter: Promise[JoinResult] | None = None
    sync_waiter: Promise[SyncResult] | None = None
    is_new: bool = False
    # Earlier parked requests of this member, replaced by a newer one: they get its answer
    # (a client resending on the same connection would otherwise wait behind them).
    superseded_joins: list[Promise[JoinResult]] = field(default_factory=list)
    superseded_syncs: list[Promise[SyncResult]] = field(default_factory=list)

    def await_join(self, waiter: Promise[JoinResult] | None) -> None:
        if self.join_waiter is not None and waiter is not None and waiter is not self.join_waiter:
            self.superseded_joins.append(self.join_waiter)
        self.join_waiter = waiter

    def await_sync(self, waiter: Promise[SyncResult]) -> None:
        if self.sync_waiter is not None and waiter is not self.sync_waiter:
            self.superseded_syncs.append(self.sync_waiter)
        self.sync_waiter = waiter

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    @property
    def protocol_names(self) -> set[str]:
        return {name for name, _metadata in self.protocols}

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        for name, _metadata in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def matches(self, protocols: Protocols) -> bool:
        return self.protocols == tuple(protocols)

    def has_satisfied_heartbeat(self) -> bool:
        """A parked member needs no heartbeat; a new member must finish joining in time."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


class ClassicGroup:
    def __init__(
        self,
        group_id: str,
        now_ms: int,
        *,
        state: GroupState = GroupState.EMPTY,
        generation: int = 0,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        leader_id: str | None = None,
        revision: int | None = None,
    ) -> None:
        self.group_id = group_id
        self.state = state
        self.previous_state = GroupState.DEAD
        self.state_timestamp_ms = now_ms
        self.generation = generation
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_join: set[str] = set()  # member ids handed out with MEMBER_ID_REQUIRED
        self.pending_sync: set[str] = set()
        self.awaiting_join_count = 0
        self.supported_protocols: Counter[str] = Counter()
        self.new_member_added = False
        self.subscribed_topics: set[str] | None = None
        # The revision of the group record in the store (None: never written), and
        # whether the in-memory members differ from the stored ones in a way that must
        # be written before the lock is released.
        self.revision = revision
        self.dirty = False

    # -- membership ----------------------------------------------------------------------

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def add(self, member: Member, waiter: Promise[JoinResult] | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise ValueError(f"static member {member.group_instance_id} is already a member")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if member.protocol_type != self.protocol_type:
            raise ValueError("the member's protocol type differs from the group's")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names)
        member.await_join(waiter)
        if member.awaiting_join:
            self.awaiting_join_count += 1
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names)
            if member.awaiting_join:
                self.awaiting_join_count -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def update_member(
        self,
        member: Member,
        protocols: Protocols,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        waiter: Promise[JoinResult] | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names)
        member.protocols = tuple(protocols)
        self.supported_protocols.update(member.protocol_names)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if waiter is not None and not member.awaiting_join:
            self.awaiting_join_count += 1
        elif waiter is None and member.awaiting_join:
            self.awaiting_join_count -= 1
        member.await_join(waiter)

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """Hand the instance's place (and assignment) to a new member id; fence the old."""
        old = self.members.pop(old_id, None)
        if old is None:
            raise ValueError(f"no member {old_id} for static member {instance_id}")
        fenced = ErrorCode.fenced_instance_id
        self.complete_join(old, JoinResult(fenced, member_id=old_id))
        self.complete_sync(old, SyncResult(fenced))
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
        self.members[new_id] = new
        if self.is_leader(old_id):
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        return new

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.awaiting_join_count and not self.pending_join

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else elect one that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    @staticmethod
    def new_member_id(client_id: str, instance_id: str | None) -> str:
        return f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"

    # -- protocols -----------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        names = set(names)
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[n] == len(self.members) for n in names
        )

    def select_protocol(self) -> str:
        if not self.members:
            raise ValueError("cannot select a protocol for an empty group")
        candidates = {
            n for n, count in self.supported_protocols.items() if count == len(self.members)
        }
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    # -- state ---------------------------------------------------------------------------

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise ValueError(f"group {self.group_id}: {self.state} cannot move to {state}")
        self.previous_state = self.state
        self.state = state
        self.state_timestamp_ms = now_ms

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync.clear()

    def current_members(self) -> tuple[JoinedMember, ...]:
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    # -- parked requests -----------------------------------------------------------------

    def complete_join(self, member: Member, result: JoinResult) -> bool:
        waiter = member.join_waiter
        if waiter is None:
            return False
        member.join_waiter = None
        self.awaiting_join_count -= 1
        for w in (*member.superseded_joins, waiter):
            if not w.done():
                w.set(result)
        member.superseded_joins.clear()
        return True

    def complete_sync(self, member: Member, result: SyncResult) -> bool:
        waiter = member.sync_waiter
        if waiter is None:
            return False
        member.sync_waiter = None
        for w in (*member.superseded_syncs, waiter):
            if not w.done():
                w.set(result)
        member.superseded_syncs.clear()
        return True

    def fail_all_waiters(self, error: ErrorCode) -> None:
        for member in self.members.values():
            self.complete_join(member, JoinResult(error, member_id=member.member_id))
            self.complete_sync(member, SyncResult(error))

    # -- consumer protocol ---------------------------------------------------------------

    def compute_subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to; None when unknown (not the consumer protocol)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscription_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.protocol_type == CONSUMER_PROTOCOL_TYPE
        return topic in self.subscribed_topics

    def expiry_rule(self, retention_ms: int) -> store.ExpiryRule | None:
        """When this group's offsets expire (Apache Kafka's offset expiration condition)."""
        if not self.protocol_type:
            return store.ExpiryRule(retention_ms)  # a simple group: by commit time
        if self.state is GroupState.EMPTY:
            return store.ExpiryRule(retention_ms, base_timestamp_ms=self.state_timestamp_ms)
        if (
            self.protocol_type == CONSUMER_PROTOCOL_TYPE
            and self.subscribed_topics is not None
            and self.state is GroupState.STABLE
        ):
            return store.ExpiryRule(retention_ms, keep_topics=frozenset(self.subscribed_topics))
        return None

    # -- OffsetCommit --------------------------------------------------------------------

    def validate_offset_commit(
        self, member_id: str, instance_id: str | None, generation: int
    ) -> ErrorCode | None:
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation < 0 and self.state is GroupState.EMPTY:
            return None  # a commit by the admin client or a consumer using assign()
        if generation >= 0 or member_id or instance_id is not None:
            error = self.validate_member(member_id, instance_id)
            if error is not None:
                return error
            if generation != self.generation:
                return ErrorCode.illegal_generation
        elif self.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return None

    # -- the store -----------------------------------------------------------------------

    def to_stored(
        self, *, state: GroupState | None = None, assignments: dict[str, bytes] | None = None
    ) -> store.StoredGroup:
        state = state or self.state
        return store.StoredGroup(
            self.group_id,
            self.protocol_type,
            self.protocol_name,
            self.generation,
            self.leader_id,
            str(state),
            self.state_timestamp_ms,
            members=tuple(
                store.StoredMember(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.protocols,
                    m.assignment if assignments is None else assignments.get(m.member_id, b""),
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_stored(cls, stored: store.StoredGroup) -> ClassicGroup:
        """The group as stored: Empty, or Stable with its members (the coordinator starts
        a rebalance when the stored state says one was under way)."""
        group = cls(
            stored.group_id,
            stored.state_timestamp_ms,
            state=GroupState.STABLE if stored.members else GroupState.EMPTY,
            generation=stored.generation,
            protocol_type=stored.protocol_type,
            protocol_name=stored.protocol_name,
            leader_id=stored.leader,
            revision=stored.revision,
        )
        for m in stored.members:
            group.add(
                Member(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    stored.protocol_type or "",
                    m.protocols,
                    m.assignment,
                )
            )
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        return group


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def parse_subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription, read with its version-0 layout (which
    every later version starts with), or None if it cannot be read."""
    try:
        pos = _I16.size  # version
        (count,) = _I32.unpack_from(metadata, pos)
        pos += _I32.size
        if count < 0:
            return None
        topics = set()
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, pos)
            pos += _I16.size
            if length < 0 or pos + length > len(metadata):
                return None
            topics.add(metadata[pos : pos + length].decode("utf-8"))
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
