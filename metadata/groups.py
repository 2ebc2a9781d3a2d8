"""Consumer groups in the metadata store: durable group state and committed offsets.

The coordinating agent keeps a group's live state machine in memory; what must survive
its death is written here, in one transaction per transition:

* the group record: protocol type and name, generation, leader, state and when it was
  entered, and a `revision` that grows with every write of the group;
* one record per member: its ids, client id/host, timeouts, protocols and assignment;
* the committed offsets: offset, leader epoch, metadata string, commit time, optional
  expiry time (OffsetCommit v2-v4 retention) and the id of the topic committed for.

Fencing. Agents are leaderless, so for a moment after the live agents change two of them
may both believe they coordinate a group. Every group write names the revision its writer
last saw (`expected_revision`; None: "the group must not exist"); a mismatch raises
`GroupFenced` and the stale writer gives the group up. Offset commits check the stored
generation (or, for a simple commit, that the group has no members) inside the commit
transaction, so a stale coordinator cannot commit for a generation that is gone.

Rules of the transaction functions: pure, no clocks (callers pass `now_ms`), may run twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from metadata import keys, txns
from metadata.errors import MetadataError
from metadata.kv import ReadTransaction, Transaction

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"


class GroupFenced(MetadataError):
    """Another agent wrote the group since this one read it: this one is no coordinator."""

    def __init__(self, group_id: str, message: str = "") -> None:
        super().__init__(
            ErrorCode.not_coordinator, message or f"group {group_id!r} was written elsewhere"
        )
        self.group_id = group_id


@dataclass(frozen=True, slots=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes


@dataclass(frozen=True, slots=True)
class StoredGroup:
    group_id: str
    protocol_type: str | None  # None: a "simple" group, known only by its committed offsets
    protocol_name: str | None
    generation: int
    leader: str | None
    state: str
    state_timestamp_ms: int
    revision: int = 0
    members: tuple[StoredMember, ...] = ()


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int  # -1: unknown
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None
    topic_id: bytes


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    topic: str
    topic_id: bytes
    partition: int
    offset: int
    leader_epoch: int
    metadata: str


# -- groups ------------------------------------------------------------------------------


def _group_from(sub: keys.Subspace, key: bytes, raw: bytes) -> StoredGroup:
    group_id = sub.unpack(key)[1]
    protocol_type, protocol_name, generation, leader, state, state_ts, revision = keys.unpack_value(
        raw
    )
    return StoredGroup(
        group_id,
        protocol_type,
        protocol_name,
        int(generation),
        leader,
        state,
        int(state_ts),
        int(revision),
    )


def _member_from(raw: bytes, member_id: str) -> StoredMember:
    instance_id, client_id, client_host, rebalance_ms, session_ms, protocols, assignment = (
        keys.unpack_value(raw)
    )
    return StoredMember(
        member_id,
        instance_id,
        client_id,
        client_host,
        int(rebalance_ms),
        int(session_ms),
        tuple((name, bytes(metadata)) for name, metadata in protocols),
        bytes(assignment),
    )


def get_group(tr: ReadTransaction, sub: keys.Subspace, group_id: str) -> StoredGroup | None:
    """The group with its members (in the order they were written), or None."""
    key = sub.key(keys.GROUP, group_id)
    raw = tr.get(key)
    if raw is None:
        return None
    group = _group_from(sub, key, raw)
    begin, end = sub.range(keys.GROUP_MEMBER, group_id)
    members = [_member_from(v, sub.unpack(k)[2]) for k, v in tr.get_range(begin, end)]
    # Member keys sort by id; the leader goes first so that a reloaded group keeps it.
    members.sort(key=lambda m: m.member_id != group.leader)
    return replace(group, members=tuple(members))


def list_groups(tr: ReadTransaction, sub: keys.Subspace) -> list[StoredGroup]:
    """Every group record, without members."""
    begin, end = sub.range(keys.GROUP)
    return [_group_from(sub, k, v) for k, v in tr.get_range(begin, end)]


def _check_revision(
    tr: ReadTransaction, sub: keys.Subspace, group_id: str, expected_revision: int | None
) -> StoredGroup | None:
    raw = tr.get(sub.key(keys.GROUP, group_id))
    current = None if raw is None else _group_from(sub, sub.key(keys.GROUP, group_id), raw)
    found = None if current is None else current.revision
    if found != expected_revision:
        raise GroupFenced(
            group_id,
            f"group {group_id!r} is at revision {found}, the writer expected {expected_revision}",
        )
    return current


def put_group(
    tr: Transaction, sub: keys.Subspace, group: StoredGroup, *, expected_revision: int | None
) -> int:
    """Write the group and its members (replacing all stored members); the new revision."""
    _check_revision(tr, sub, group.group_id, expected_revision)
    revision = (expected_revision or 0) + 1
    tr.set(
        sub.key(keys.GROUP, group.group_id),
        keys.pack_value(
            (
                group.protocol_type,
                group.protocol_name,
                group.generation,
                group.leader,
                group.state,
                group.state_timestamp_ms,
                revision,
            )
        ),
    )
    tr.clear_range(*sub.range(keys.GROUP_MEMBER, group.group_id))
    for m in group.members:
        tr.set(
            sub.key(keys.GROUP_MEMBER, group.group_id, m.member_id),
            keys.pack_value(
                (
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    tuple(m.protocols),
                    m.assignment,
                )
            ),
        )
    return revision


def delete_group(
    tr: Transaction, sub: keys.Subspace, group_id: str, *, expected_revision: int | None
) -> int:
    """Delete the group, its members and its committed offsets; the number of offsets."""
    _check_revision(tr, sub, group_id, expected_revision)
    begin, end = sub.range(keys.GROUP_OFFSET, group_id)
    count = len(tr.get_range(begin, end))
    tr.clear(sub.key(keys.GROUP, group_id))
    tr.clear_range(*sub.range(keys.GROUP_MEMBER, group_id))
    tr.clear_range(begin, end)
    return count


def drop_group_record(
    tr: Transaction, sub: keys.Subspace, group_id: str, *, expected_revision: int | None
) -> None:
    """Delete the group record and its members, keeping its committed offsets: an Empty
    classic group taken over by a consumer-protocol group (`metadata.consumer_groups`)."""
    _check_revision(tr, sub, group_id, expected_revision)
    tr.clear(sub.key(keys.GROUP, group_id))
    tr.clear_range(*sub.range(keys.GROUP_MEMBER, group_id))


# -- committed offsets -------------------------------------------------------------------


def _offset_from(raw: bytes) -> CommittedOffset:
    offset, leader_epoch, metadata, commit_ts, expire_ts, topic_id = keys.unpack_value(raw)
    return CommittedOffset(
        int(offset),
        int(leader_epoch),
        metadata,
        int(commit_ts),
        None if expire_ts is None else int(expire_ts),
        bytes(topic_id),
    )


def put_offset(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    topic: str,
    partition: int,
    committed: CommittedOffset,
) -> None:
    """Store one committed offset without any check (callers fence first)."""
    tr.set(
        sub.key(keys.GROUP_OFFSET, group_id, topic, partition),
        keys.pack_value(
            (
                committed.offset,
                committed.leader_epoch,
                committed.metadata,
                committed.commit_timestamp_ms,
                committed.expire_timestamp_ms,
                committed.topic_id,
            )
        ),
    )


def commit_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    offsets: Iterable[OffsetToCommit],
    *,
    generation: int | None,
    now_ms: int,
    expire_timestamp_ms: int | None = None,
) -> int:
    """Commit offsets, fenced by the group's stored generation; the group's revision.

    generation None is a simple commit (generation -1, no member): the group must have no
    members; a group record with no protocol type is created for it if there is none, as
    Apache Kafka creates a "simple" group. Otherwise the stored generation must equal
    `generation`.
    """
    raw = tr.get(sub.key(keys.GROUP, group_id))
    stored = None if raw is None else _group_from(sub, sub.key(keys.GROUP, group_id), raw)
    if generation is None:
        if stored is not None and stored.state != EMPTY:
            raise GroupFenced(group_id, f"group {group_id!r} has members in the store")
        if stored is None:
            revision = put_group(
                tr,
                sub,
                StoredGroup(group_id, None, None, 0, None, EMPTY, now_ms),
                expected_revision=None,
            )
            stored = StoredGroup(group_id, None, None, 0, None, EMPTY, now_ms, revision)
    elif stored is None or stored.generation != generation:
        found = None if stored is None else stored.generation
        raise GroupFenced(
            group_id, f"group {group_id!r} is at generation {found} in the store, not {generation}"
        )
    put_offsets(tr, sub, group_id, offsets, now_ms, expire_timestamp_ms)
    return stored.revision


def put_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    offsets: Iterable[OffsetToCommit],
    now_ms: int,
    expire_timestamp_ms: int | None,
) -> None:
    """Store the offsets, committed at now_ms (the fencing is the caller's)."""
    for o in offsets:
        put_offset(
            tr,
            sub,
            group_id,
            o.topic,
            o.partition,
            CommittedOffset(
                o.offset, o.leader_epoch, o.metadata, now_ms, expire_timestamp_ms, o.topic_id
            ),
        )


def apply_offset(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    topic: str,
    partition: int,
    offset: int,
    leader_epoch: int,
    metadata: str | None,
    now_ms: int,
) -> None:
    """Make an offset committed by a transaction (TxnOffsetCommit) a group offset.

    No generation check: the transaction was checked when the offset was added to it. A
    group that does not exist yet (neither classic nor consumer-protocol) gets a simple
    group record, as when Kafka replays an offset commit for an unknown group. An offset for a topic that is gone is dropped.
    """
    topic_id = tr.get(sub.key(keys.TOPIC_NAME, topic))
    if topic_id is None:
        return
    consumer_group = tr.get(sub.key(keys.CONSUMER_GROUP, group_id)) is not None
    if tr.get(sub.key(keys.GROUP, group_id)) is None and not consumer_group:
        put_group(
            tr,
            sub,
            StoredGroup(group_id, None, None, 0, None, EMPTY, now_ms),
            expected_revision=None,
        )
    put_offset(
        tr,
        sub,
        group_id,
        topic,
        partition,
        CommittedOffset(offset, leader_epoch, metadata or "", now_ms, None, bytes(topic_id)),
    )


def _current_topic_ids(
    tr: ReadTransaction, sub: keys.Subspace, names: Iterable[str]
) -> dict[str, bytes]:
    ids: dict[str, bytes] = {}
    for name in set(names):
        topic_id = tr.get(sub.key(keys.TOPIC_NAME, name))
        if topic_id is not None:
            ids[name] = bytes(topic_id)
    return ids


def fetch_offsets(
    tr: ReadTransaction,
    sub: keys.Subspace,
    group_id: str,
    topics: Iterable[str] | None = None,
) -> dict[tuple[str, int], CommittedOffset]:
    """The group's committed offsets, of the given topics or of all topics.

    Offsets committed for a topic that has since been deleted (or deleted and created
    again: its id differs) are left out, as Apache Kafka deletes them with the topic.
    """
    raw: list[tuple[str, int, CommittedOffset]] = []
    if topics is None:
        begin, end = sub.range(keys.GROUP_OFFSET, group_id)
        for k, v in tr.get_range(begin, end):
            _tag, _group, topic, partition = sub.unpack(k)
            raw.append((topic, int(partition), _offset_from(v)))
    else:
        for topic in dict.fromkeys(topics):
            begin, end = sub.range(keys.GROUP_OFFSET, group_id, topic)
            for k, v in tr.get_range(begin, end):
                raw.append((topic, int(sub.unpack(k)[3]), _offset_from(v)))
    current = _current_topic_ids(tr, sub, (t for t, _p, _o in raw))
    return {(t, p): o for t, p, o in raw if current.get(t) == o.topic_id}


def unstable_partitions(
    tr: ReadTransaction, sub: keys.Subspace, group_id: str, partitions: Iterable[tuple[str, int]]
) -> set[tuple[str, int]]:
    """The partitions for which an open transaction holds an offset of the group: an
    OffsetFetch that requires stable offsets answers them UNSTABLE_OFFSET_COMMIT."""
    return {(t, p) for t, p in partitions if txns.has_pending_offset(tr, sub, group_id, t, p)}


def delete_offsets(
    tr: Transaction, sub: keys.Subspace, group_id: str, partitions: Iterable[tuple[str, int]]
) -> int:
    """Delete the given committed offsets; how many existed."""
    count = 0
    for topic, partition in partitions:
        key = sub.key(keys.GROUP_OFFSET, group_id, topic, partition)
        if tr.get(key) is not None:
            tr.clear(key)
            count += 1
    return count


# -- retention ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpiryRule:
    """When the offsets of one group expire (Apache Kafka's offset expiration condition).

    An offset with an explicit expiry time (OffsetCommit v2-v4 retention_time) expires at
    that time. Otherwise it expires `retention_ms` after its base time: `base_timestamp_ms`
    when given (the time an Empty group became empty), else its own commit time. Topics in
    `keep_topics` never expire (a Stable group still consumes them).
    """

    retention_ms: int
    base_timestamp_ms: int | None = None
    keep_topics: frozenset[str] = frozenset()

    def expired(self, topic: str, offset: CommittedOffset, now_ms: int) -> bool:
        if topic in self.keep_topics:
            return False
        if offset.expire_timestamp_ms is not None:
            return now_ms >= offset.expire_timestamp_ms
        base = (
            self.base_timestamp_ms
            if self.base_timestamp_ms is not None
            else offset.commit_timestamp_ms
        )
        return now_ms - base >= self.retention_ms


@dataclass(frozen=True, slots=True)
class ExpiryResult:
    expired: int
    remaining: int
    group_deleted: bool


def expire_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    rule: ExpiryRule,
    *,
    now_ms: int,
    expected_revision: int | None,
    delete_group_when_empty: bool,
) -> ExpiryResult:
    """Delete the group's expired offsets (and offsets of deleted topics).

    With `delete_group_when_empty`, a group left without offsets is deleted too, as Apache
    Kafka deletes an Empty group whose offsets have all expired. Fenced by revision when
    the group record is to be deleted.
    """
    begin, end = sub.range(keys.GROUP_OFFSET, group_id)
    entries = []
    for k, v in tr.get_range(begin, end):
        _tag, _group, topic, partition = sub.unpack(k)
        entries.append((k, topic, _offset_from(v)))
    current = _current_topic_ids(tr, sub, (t for _k, t, _o in entries))
    expired = 0
    for k, topic, offset in entries:
        if current.get(topic) != offset.topic_id or rule.expired(topic, offset, now_ms):
            tr.clear(k)
            expired += 1
    remaining = len(entries) - expired
    deleted = False
    if remaining == 0 and delete_group_when_empty:
        _check_revision(tr, sub, group_id, expected_revision)
        tr.clear(sub.key(keys.GROUP, group_id))
        tr.clear_range(*sub.range(keys.GROUP_MEMBER, group_id))
        deleted = True
    return ExpiryResult(expired, remaining, deleted)
