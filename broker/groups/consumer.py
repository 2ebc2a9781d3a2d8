"""The consumer group of the consumer group protocol (KIP-848) as values: its members, their
subscriptions and assignments, and the group's target assignment.

These are the state of the consumer group machine (`consumer_machine`): frozen values that
a transition replaces, never changes (the mappings they hold are never written to once
built). The epochs, as Apache Kafka's ConsumerGroup keeps them:

* the group epoch grows whenever the members' subscriptions or the subscribed topics'
  metadata (topic ids and partition counts) change;
* the assignment epoch is the group epoch the target assignment was computed for; the
  group is Assigning while the group epoch is ahead of it;
* a member's epoch is the assignment epoch it has reconciled to: it reaches the assignment
  epoch once it has revoked what it must give up (UNREVOKED_PARTITIONS until then) and is
  handed what no other member still owns (UNRELEASED_PARTITIONS while some is held).

The group's state is derived: Empty without members, Assigning, Reconciling while a member
is not stable at the assignment epoch, Stable otherwise.

Topic ids are 16 raw bytes; a partition is (topic id, partition index). Regular expressions
(`subscribed_topic_regex`) follow RE2/J syntax as far as Python's `re` reads it the same
way: a pattern with a construct RE2 lacks (backreferences, lookaround, conditionals, atomic
groups, possessive quantifiers) or one Python's `re` does not read as RE2 does (POSIX
classes such as `[[:alpha:]]`, `\\p{...}`, `\\Q...\\E`, `\\z`) is refused. A regex matches
the whole topic name.

Nothing here does I/O.
"""

from __future__ import annotations

import enum
import functools
import re
import uuid
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from re import _parser as _sre_parse  # type: ignore[attr-defined]  # what `re` reads
from typing import Any

from kio.schema.consumer_group_describe.v0 import response as describe_v0
from kio.schema.consumer_group_describe.v1 import response as describe_v1
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32

from metadata import consumer_groups as stored

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
GROUP_TYPE = "consumer"
PROTOCOL_TYPE = "consumer"

TopicPartition = tuple[bytes, int]
Partitions = frozenset[TopicPartition]
# name -> (topic id, partition count): the topics that exist, or those a group subscribes to
TopicsByName = Mapping[str, tuple[bytes, int]]


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"

    def __str__(self) -> str:
        return self.value


# -- regular expressions -----------------------------------------------------------------


class InvalidRegex(ValueError):
    """A subscribed topic regex that is not valid, or not in the supported subset."""


_REFUSED_OPCODES = {
    "GROUPREF": "backreferences",
    "GROUPREF_EXISTS": "conditionals",
    "ASSERT": "lookaround",
    "ASSERT_NOT": "lookaround",
    "ATOMIC_GROUP": "atomic groups",
    "POSSESSIVE_REPEAT": "possessive quantifiers",
}


def _walk(parsed: object) -> Iterable[tuple[str, object]]:
    for op, arg in parsed:  # type: ignore[attr-defined]
        yield str(op), arg
        for part in arg if isinstance(arg, tuple | list) else (arg,):
            if isinstance(part, _sre_parse.SubPattern):
                yield from _walk(part)
            elif isinstance(part, tuple | list):
                for sub in part:
                    if isinstance(sub, _sre_parse.SubPattern):
                        yield from _walk(sub)


@functools.lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or InvalidRegex saying why it is refused."""
    try:
        with warnings.catch_warnings():
            # A FutureWarning marks what Python reads otherwise than RE2 (nested sets).
            warnings.simplefilter("error")
            parsed = _sre_parse.parse(pattern, 0)
            compiled = re.compile(pattern)
    except (re.error, FutureWarning, RecursionError, OverflowError) as e:
        raise InvalidRegex(f"Invalid regular expression {pattern!r}: {e}.") from None
    for op, _arg in _walk(parsed):
        if op in _REFUSED_OPCODES:
            raise InvalidRegex(
                f"Invalid regular expression {pattern!r}: RE2/J syntax has no "
                f"{_REFUSED_OPCODES[op]}."
            )
    return compiled


def regex_topics(pattern: str, names: Iterable[str]) -> set[str]:
    """The names the pattern matches whole (an invalid pattern matches none)."""
    try:
        compiled = compile_regex(pattern)
    except InvalidRegex:
        return set()
    return {n for n in names if compiled.fullmatch(n)}


# -- members -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()  # sorted, no duplicates
    subscribed_topic_regex: str | None = None  # None: no regex
    server_assignor: str | None = None
    rebalance_timeout_ms: int = -1
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Partitions = frozenset()  # the partitions it may use
    pending_revocation: Partitions = frozenset()  # to give up before it goes on

    def is_reconciled_to(self, epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == epoch

    def subscribed_topics(self, topics: TopicsByName) -> set[str]:
        """The names of `topics` it subscribes to, by name or by regex."""
        names = {n for n in self.subscribed_topic_names if n in topics}
        if self.subscribed_topic_regex:
            names |= regex_topics(self.subscribed_topic_regex, topics)
        return names

    @property
    def owned(self) -> Partitions:
        """What it holds: assigned, or not yet revoked."""
        return self.assigned | self.pending_revocation


def sorted_names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names)))


def by_topic(partitions: Iterable[TopicPartition]) -> tuple[tuple[bytes, tuple[int, ...]], ...]:
    """Partitions as the wire lists them: by topic id, partitions ascending."""
    grouped: dict[bytes, list[int]] = {}
    for topic_id, partition in partitions:
        grouped.setdefault(topic_id, []).append(partition)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(grouped.items()))


def from_topics(topics: Iterable[tuple[bytes, Iterable[int]]]) -> Partitions:
    return frozenset((t, p) for t, ps in topics for p in ps)


# -- the group ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: Mapping[str, ConsumerMember] = field(default_factory=dict)  # in join order
    target: Mapping[str, Partitions] = field(default_factory=dict)  # member id -> partitions
    # The subscribed topics that exist, as the target assignment was last computed with.
    subscription_metadata: TopicsByName = field(default_factory=dict)

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if all(m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.STABLE
        return ConsumerGroupState.RECONCILING

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def owners(self, *, excluding: str = "") -> dict[TopicPartition, str]:
        """Who holds each partition (assigned or pending revocation)."""
        held: dict[TopicPartition, str] = {}
        for member in self.members.values():
            if member.member_id != excluding:
                for tp in member.owned:
                    held[tp] = member.member_id
        return held

    def subscribed_topic_ids(self, member: ConsumerMember) -> frozenset[bytes]:
        meta = self.subscription_metadata
        return frozenset(meta[n][0] for n in member.subscribed_topics(meta))

    def compute_subscription_metadata(self, topics: TopicsByName) -> dict[str, tuple[bytes, int]]:
        """The topics of `topics` that some member subscribes to."""
        names: set[str] = set()
        regexes: set[str] = set()
        for member in self.members.values():
            names.update(n for n in member.subscribed_topic_names if n in topics)
            if member.subscribed_topic_regex:
                regexes.add(member.subscribed_topic_regex)
        for regex in regexes:  # members mostly share one
            names |= regex_topics(regex, topics)
        return {n: topics[n] for n in sorted(names)}

    def with_member(self, member: ConsumerMember) -> ConsumerGroup:
        members = dict(self.members)
        members[member.member_id] = member
        return replace(self, members=members)

    def without_member(self, member_id: str) -> ConsumerGroup:
        members = {k: v for k, v in self.members.items() if k != member_id}
        target = {k: v for k, v in self.target.items() if k != member_id}
        return replace(self, members=members, target=target)

    # -- the stored form -----------------------------------------------------------------

    def to_stored(self) -> stored.StoredConsumerGroup:
        return stored.StoredConsumerGroup(
            self.group_id,
            self.group_epoch,
            self.assignment_epoch,
            tuple((n, t, c) for n, (t, c) in sorted(self.subscription_metadata.items())),
            members=tuple(
                stored.StoredConsumerMember(
                    m.member_id,
                    m.instance_id,
                    m.rack_id,
                    m.client_id,
                    m.client_host,
                    m.subscribed_topic_names,
                    m.subscribed_topic_regex,
                    m.server_assignor,
                    m.rebalance_timeout_ms,
                    m.member_epoch,
                    m.previous_member_epoch,
                    m.state.value,
                    tuple(sorted(m.assigned)),
                    tuple(sorted(m.pending_revocation)),
                    tuple(sorted(self.target.get(m.member_id, ()))),
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_stored(cls, group: stored.StoredConsumerGroup) -> ConsumerGroup:
        members = {
            m.member_id: ConsumerMember(
                m.member_id,
                m.instance_id,
                m.rack_id,
                m.client_id,
                m.client_host,
                tuple(m.subscribed_topic_names),
                m.subscribed_topic_regex,
                m.server_assignor,
                m.rebalance_timeout_ms,
                m.member_epoch,
                m.previous_member_epoch,
                MemberState(m.state),
                frozenset(m.assigned),
                frozenset(m.pending_revocation),
            )
            for m in group.members
        }
        return cls(
            group.group_id,
            group.group_epoch,
            group.assignment_epoch,
            members,
            {m.member_id: frozenset(m.target) for m in group.members},
            {n: (t, c) for n, t, c in group.subscription_metadata},
        )


# -- ConsumerGroupDescribe and ListGroups ------------------------------------------------

_DESCRIBE = {0: describe_v0, 1: describe_v1}
DescribedGroup = describe_v1.DescribedGroup | describe_v0.DescribedGroup


def listed_state(group: ConsumerGroup | None) -> str:
    """The group's state as ListGroups and the Kafka tools print it."""
    return str(ConsumerGroupState.DEAD if group is None else group.state)


def describe_error(
    group_id: str, error: ErrorCode, version: int = 1, message: str | None = None
) -> describe_v1.DescribedGroup | describe_v0.DescribedGroup:
    """The ConsumerGroupDescribe answer for a group that cannot be described."""
    described: describe_v1.DescribedGroup | describe_v0.DescribedGroup
    described = _DESCRIBE[version].DescribedGroup(
        error_code=error,
        error_message=message,
        group_id=group_id,
        group_state="",
        group_epoch=i32(0),
        assignment_epoch=i32(0),
        assignor_name="",
        members=(),
    )
    return described


def describe_not_consumer(
    group_id: str, version: int = 1
) -> describe_v1.DescribedGroup | describe_v0.DescribedGroup:
    """The answer for a group id a classic group has."""
    return describe_error(
        group_id,
        ErrorCode.group_id_not_found,
        version,
        f"Group {group_id} is not a consumer group.",
    )


def describe(
    group: ConsumerGroup | None,
    group_id: str,
    topic_names: Mapping[bytes, str],
    default_assignor: str,
    version: int = 1,
) -> describe_v1.DescribedGroup | describe_v0.DescribedGroup:
    """The ConsumerGroupDescribe answer for one group at `version` (0 or 1); topic names
    by topic id for the assignments (a topic deleted since is left out)."""
    schema = _DESCRIBE[version]
    described: describe_v1.DescribedGroup | describe_v0.DescribedGroup
    if group is None:
        return describe_error(
            group_id, ErrorCode.group_id_not_found, version, f"Group {group_id} not found."
        )

    def assignment(partitions: Partitions) -> Any:
        return schema.Assignment(
            topic_partitions=tuple(
                schema.TopicPartitions(
                    topic_id=uuid.UUID(bytes=t),
                    topic_name=topic_names[t],
                    partitions=tuple(i32(p) for p in ps),
                )
                for t, ps in by_topic(partitions)
                if t in topic_names
            )
        )

    votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
    members = []
    for m in group.members.values():
        fields: dict[str, Any] = dict(
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=i32(m.member_epoch),
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=m.subscribed_topic_names,
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=assignment(m.assigned),
            target_assignment=assignment(group.target.get(m.member_id, frozenset())),
        )
        if version >= 1:
            fields["member_type"] = i8(1)  # a member of the consumer protocol
        members.append(schema.Member(**fields))
    described = schema.DescribedGroup(
        error_code=ErrorCode.none,
        group_id=group.group_id,
        group_state=str(group.state),
        group_epoch=i32(group.group_epoch),
        assignment_epoch=i32(group.assignment_epoch),
        assignor_name=votes.most_common(1)[0][0] if votes else default_assignor,
        members=tuple(members),
    )
    return described
