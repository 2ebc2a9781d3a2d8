"""The classic group as values: its members, protocols, states, requests and answers.

These are the state of the classic group machine (`classic_machine`): frozen values that
a transition replaces, never changes. States and their allowed predecessors (Apache
Kafka's ClassicGroupState):

  Empty               <- PreparingRebalance
  PreparingRebalance  <- Stable, CompletingRebalance, Empty
  CompletingRebalance <- PreparingRebalance
  Stable              <- CompletingRebalance
  Dead                <- any state

The queries on the group are Apache Kafka's ClassicGroup's:

* the protocol type is fixed by the first member; a joining member must name it and
  support at least one protocol that every member supports (INCONSISTENT_GROUP_PROTOCOL);
* the group's protocol is chosen by vote: every member votes for its first-listed
  protocol among those all members support; most votes wins;
* a static member (group.instance.id) keeps its place across restarts; a request naming
  the instance with another member id is FENCED_INSTANCE_ID;
* the first member to join becomes leader; a leader that does not rejoin is replaced by a
  member that did.

Nothing here does I/O.
"""

from __future__ import annotations

import enum
import struct
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from metadata import groups as groups_layer

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


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


EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)

VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    EMPTY: frozenset({PREPARING}),
    PREPARING: frozenset({STABLE, COMPLETING, EMPTY}),
    COMPLETING: frozenset({PREPARING}),
    STABLE: frozenset({COMPLETING}),
    DEAD: frozenset(GroupState),
}


@dataclass(frozen=True, slots=True)
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
    awaiting_join: bool = False  # a JoinGroup of the member is parked
    awaiting_sync: bool = False  # a SyncGroup of the member is parked
    is_new: bool = False  # joined, and not yet answered a generation

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


class Members(Mapping[str, Member]):
    """A group's members by id, in the order they joined; immutable, and equal only to the
    same members in the same order (the first is the leader's fallback)."""

    __slots__ = ("_by_id",)

    def __init__(self, members: Iterable[Member] = ()) -> None:
        self._by_id = {m.member_id: m for m in members}

    def __getitem__(self, member_id: str) -> Member:
        return self._by_id[member_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Members):
            return NotImplemented
        return list(self._by_id.items()) == list(other._by_id.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Members({list(self._by_id.values())!r})"

    def put(self, member: Member) -> Members:
        """These members with `member` replaced in its place, or added last."""
        by_id = dict(self._by_id)
        by_id[member.member_id] = member
        return Members(by_id.values())

    def without(self, member_id: str) -> Members:
        return Members(m for m in self._by_id.values() if m.member_id != member_id)


@dataclass(frozen=True, slots=True)
class ClassicGroup:
    group_id: str
    state: GroupState = EMPTY
    state_timestamp_ms: int = 0
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: Members = field(default_factory=Members)
    pending_join: frozenset[str] = frozenset()  # ids handed out with MEMBER_ID_REQUIRED
    pending_sync: frozenset[str] = frozenset()  # members of this generation not synced yet
    previous_state: GroupState = DEAD
    new_member_added: bool = False  # a member joined during the initial rebalance delay
    subscribed_topics: frozenset[str] | None = None  # None: unknown

    # -- membership ----------------------------------------------------------------------

    @property
    def static_members(self) -> dict[str, str]:
        """group.instance.id -> member id."""
        return {
            m.group_instance_id: m.member_id
            for m in self.members.values()
            if m.group_instance_id is not None
        }

    @property
    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

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

    # -- protocols -----------------------------------------------------------------------

    def supported_protocols(self) -> Counter[str]:
        """How many members support each protocol."""
        counts: Counter[str] = Counter()
        for member in self.members.values():
            counts.update(member.protocol_names)
        return counts

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        names = set(names)
        if self.state is EMPTY:
            return bool(protocol_type) and bool(names)
        supported = self.supported_protocols()
        return self.protocol_type == protocol_type and any(
            supported[n] == len(self.members) for n in names
        )

    def select_protocol(self) -> str:
        """The vote: each member names its first protocol of those all members support."""
        if not self.members:
            raise ValueError("cannot select a protocol for an empty group")
        candidates = {
            n for n, count in self.supported_protocols().items() if count == len(self.members)
        }
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    def current_members(self) -> tuple[JoinedMember, ...]:
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[PREPARING]

    # -- the consumer protocol -----------------------------------------------------------

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Topics the members subscribe to; None when unknown (not the consumer protocol)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscription_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.protocol_type == CONSUMER_PROTOCOL_TYPE
        return topic in self.subscribed_topics

    def expiry_rule(self, retention_ms: int) -> groups_layer.ExpiryRule | None:
        """When this group's offsets expire (Apache Kafka's offset expiration condition)."""
        if not self.protocol_type:
            return groups_layer.ExpiryRule(retention_ms)  # a simple group: by commit time
        if self.state is EMPTY:
            return groups_layer.ExpiryRule(retention_ms, base_timestamp_ms=self.state_timestamp_ms)
        if (
            self.protocol_type == CONSUMER_PROTOCOL_TYPE
            and self.subscribed_topics is not None
            and self.state is STABLE
        ):
            return groups_layer.ExpiryRule(retention_ms, keep_topics=self.subscribed_topics)
        return None

    def validate_offset_commit(
        self, member_id: str, instance_id: str | None, generation: int
    ) -> ErrorCode | None:
        if self.state is DEAD:
            return ErrorCode.coordinator_not_available
        if generation < 0 and self.state is EMPTY:
            return None  # a commit by the admin client or a consumer using assign()
        if generation >= 0 or member_id or instance_id is not None:
            error = self.validate_member(member_id, instance_id)
            if error is not None:
                return error
            if generation != self.generation:
                return ErrorCode.illegal_generation
        elif self.state is not EMPTY:
            return ErrorCode.unknown_member_id
        if self.state is COMPLETING:
            return ErrorCode.rebalance_in_progress
        return None

    # -- the stored form -----------------------------------------------------------------

    def to_stored(
        self, *, state: GroupState | None = None, assignments: dict[str, bytes] | None = None
    ) -> groups_layer.StoredGroup:
        return groups_layer.StoredGroup(
            self.group_id,
            self.protocol_type,
            self.protocol_name,
            self.generation,
            self.leader_id,
            str(state or self.state),
            self.state_timestamp_ms,
            members=tuple(
                groups_layer.StoredMember(
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
    def from_stored(cls, stored: groups_layer.StoredGroup) -> ClassicGroup:
        """The group as stored: Empty, or Stable with its members (a transition `Load`
        starts a rebalance when the stored state says one was under way)."""
        members = Members(
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
            for m in stored.members
        )
        instances = [m.group_instance_id for m in stored.members if m.group_instance_id]
        if len(set(instances)) != len(instances):
            raise ValueError(f"group {stored.group_id!r}: a static member is stored twice")
        group = cls(
            stored.group_id,
            STABLE if members else EMPTY,
            stored.state_timestamp_ms,
            stored.generation,
            (stored.protocol_type or "") if members else stored.protocol_type,
            stored.protocol_name,
            stored.leader if stored.leader in members else next(iter(members), None),
            members,
        )
        return replace(group, subscribed_topics=group.compute_subscribed_topics())


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
