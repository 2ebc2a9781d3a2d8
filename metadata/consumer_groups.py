"""Consumer-protocol groups (KIP-848) in the metadata store: what a coordinator that takes a
group over needs so that its members notice nothing.

* the group record: group epoch, assignment epoch, the subscribed topics' metadata the
  target assignment was computed with, and a `revision` that grows with every write;
* one record per member: its ids, subscription, server assignor, rebalance timeout, member
  and previous member epochs, reconciliation state, assigned partitions, partitions pending
  revocation, and its part of the target assignment.

Fencing is the classic groups' (`metadata.groups`): every write names the revision its
writer last saw (None: "the group must not exist") and a mismatch raises `GroupFenced`.
Committed offsets stay where every group keeps them (`metadata.groups`), by group id;
`commit_offsets` writes them fenced by the consumer group's revision. An Empty group of one
kind may be taken over by the other (`take_over_classic`, `drop_consumer_group`): the
record of the one is removed, its offsets stay, and the other is written.

Rules of the transaction functions: pure, no clocks, may run twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from metadata import groups as classic_groups
from metadata import keys
from metadata.groups import GroupFenced, OffsetToCommit
from metadata.kv import ReadTransaction, Transaction

StoredPartitions = tuple[tuple[bytes, int], ...]


@dataclass(frozen=True, slots=True)
class StoredConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    server_assignor: str | None
    rebalance_timeout_ms: int
    member_epoch: int
    previous_member_epoch: int
    state: str
    assigned: StoredPartitions
    pending_revocation: StoredPartitions
    target: StoredPartitions


@dataclass(frozen=True, slots=True)
class StoredConsumerGroup:
    group_id: str
    group_epoch: int
    assignment_epoch: int
    subscription_metadata: tuple[tuple[str, bytes, int], ...]  # (name, topic id, partitions)
    revision: int = 0
    members: tuple[StoredConsumerMember, ...] = ()


def _partitions(raw: tuple[tuple[bytes, int], ...]) -> StoredPartitions:
    return tuple((bytes(t), int(p)) for t, p in raw)


def _group_from(group_id: str, raw: bytes) -> StoredConsumerGroup:
    group_epoch, assignment_epoch, metadata, revision = keys.unpack_value(raw)
    return StoredConsumerGroup(
        group_id,
        int(group_epoch),
        int(assignment_epoch),
        tuple((name, bytes(t), int(n)) for name, t, n in metadata),
        int(revision),
    )


def _member_from(member_id: str, raw: bytes) -> StoredConsumerMember:
    (
        instance_id,
        rack_id,
        client_id,
        client_host,
        names,
        regex,
        assignor,
        rebalance_ms,
        epoch,
        previous_epoch,
        state,
        assigned,
        pending,
        target,
    ) = keys.unpack_value(raw)
    return StoredConsumerMember(
        member_id,
        instance_id,
        rack_id,
        client_id,
        client_host,
        tuple(names),
        regex,
        assignor,
        int(rebalance_ms),
        int(epoch),
        int(previous_epoch),
        state,
        _partitions(assigned),
        _partitions(pending),
        _partitions(target),
    )


def _member_value(m: StoredConsumerMember) -> bytes:
    return keys.pack_value(
        (
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
            m.state,
            tuple(m.assigned),
            tuple(m.pending_revocation),
            tuple(m.target),
        )
    )


def get_consumer_group(
    tr: ReadTransaction, sub: keys.Subspace, group_id: str
) -> StoredConsumerGroup | None:
    """The group with its members (by member id), or None."""
    raw = tr.get(sub.key(keys.CONSUMER_GROUP, group_id))
    if raw is None:
        return None
    begin, end = sub.range(keys.CONSUMER_GROUP_MEMBER, group_id)
    members = tuple(_member_from(sub.unpack(k)[2], v) for k, v in tr.get_range(begin, end))
    return replace(_group_from(group_id, raw), members=members)


def list_consumer_groups(tr: ReadTransaction, sub: keys.Subspace) -> list[StoredConsumerGroup]:
    """Every consumer-protocol group record, without members."""
    begin, end = sub.range(keys.CONSUMER_GROUP)
    return [_group_from(sub.unpack(k)[1], v) for k, v in tr.get_range(begin, end)]


def _check_revision(
    tr: ReadTransaction, sub: keys.Subspace, group_id: str, expected_revision: int | None
) -> None:
    raw = tr.get(sub.key(keys.CONSUMER_GROUP, group_id))
    found = None if raw is None else _group_from(group_id, raw).revision
    if found != expected_revision:
        raise GroupFenced(
            group_id,
            f"consumer group {group_id!r} is at revision {found}, the writer expected "
            f"{expected_revision}",
        )


def put_consumer_group(
    tr: Transaction,
    sub: keys.Subspace,
    group: StoredConsumerGroup,
    *,
    expected_revision: int | None,
    previous: StoredConsumerGroup | None = None,
) -> int:
    """Write the group; the new revision. With `previous` (the form last written, at
    `expected_revision`) only the members that changed are written and those gone cleared;
    without it every stored member is replaced."""
    _check_revision(tr, sub, group.group_id, expected_revision)
    if any(m.member_id == "" for m in group.members):
        raise ValueError(f"consumer group {group.group_id!r}: a member without id")
    revision = (expected_revision or 0) + 1
    tr.set(
        sub.key(keys.CONSUMER_GROUP, group.group_id),
        keys.pack_value(
            (group.group_epoch, group.assignment_epoch, group.subscription_metadata, revision)
        ),
    )
    before = {} if previous is None else {m.member_id: m for m in previous.members}
    if previous is None:
        tr.clear_range(*sub.range(keys.CONSUMER_GROUP_MEMBER, group.group_id))
    now = {m.member_id for m in group.members}
    for member_id in before.keys() - now:
        tr.clear(sub.key(keys.CONSUMER_GROUP_MEMBER, group.group_id, member_id))
    for m in group.members:
        if before.get(m.member_id) != m:
            tr.set(
                sub.key(keys.CONSUMER_GROUP_MEMBER, group.group_id, m.member_id), _member_value(m)
            )
    return revision


def delete_consumer_group(
    tr: Transaction, sub: keys.Subspace, group_id: str, *, expected_revision: int | None
) -> None:
    """Delete the group record and its members (its committed offsets are the caller's:
    `metadata.groups.delete_group` or the offsets' own retention)."""
    _check_revision(tr, sub, group_id, expected_revision)
    tr.clear(sub.key(keys.CONSUMER_GROUP, group_id))
    tr.clear_range(*sub.range(keys.CONSUMER_GROUP_MEMBER, group_id))


def drop_consumer_group(
    tr: Transaction, sub: keys.Subspace, group_id: str, *, expected_revision: int | None
) -> None:
    """Delete an Empty group's record, keeping its committed offsets (a classic group takes
    the id over)."""
    _check_revision(tr, sub, group_id, expected_revision)
    raw = tr.get(sub.key(keys.CONSUMER_GROUP, group_id))
    begin, end = sub.range(keys.CONSUMER_GROUP_MEMBER, group_id)
    if raw is not None and tr.get_range(begin, end):
        raise GroupFenced(group_id, f"consumer group {group_id!r} has members in the store")
    tr.clear(sub.key(keys.CONSUMER_GROUP, group_id))
    tr.clear_range(begin, end)


def take_over_classic(
    tr: Transaction,
    sub: keys.Subspace,
    group: StoredConsumerGroup,
    *,
    classic_revision: int,
) -> int:
    """Write a new consumer group in place of the Empty classic group of the same id (at
    `classic_revision`), keeping its committed offsets; the new revision."""
    classic_groups.drop_group_record(tr, sub, group.group_id, expected_revision=classic_revision)
    return put_consumer_group(tr, sub, group, expected_revision=None)


def commit_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    offsets: Iterable[OffsetToCommit],
    *,
    expected_revision: int,
    now_ms: int,
    expire_timestamp_ms: int | None = None,
) -> None:
    """Commit offsets for the group, fenced by its revision (the coordinator checked the
    member and its epoch against the group at that revision)."""
    _check_revision(tr, sub, group_id, expected_revision)
    classic_groups.put_offsets(tr, sub, group_id, offsets, now_ms, expire_timestamp_ms)


def delete_consumer_group_and_offsets(
    tr: Transaction, sub: keys.Subspace, group_id: str, *, expected_revision: int
) -> int:
    """DeleteGroups of an Empty group: its record and its committed offsets; how many
    offsets there were."""
    drop_consumer_group(tr, sub, group_id, expected_revision=expected_revision)
    begin, end = sub.range(keys.GROUP_OFFSET, group_id)
    count = len(tr.get_range(begin, end))
    tr.clear_range(begin, end)
    return count


def expire_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    group_id: str,
    rule: classic_groups.ExpiryRule,
    *,
    now_ms: int,
    expected_revision: int | None,
    delete_group_when_empty: bool,
) -> classic_groups.ExpiryResult:
    """Delete the group's expired offsets (`metadata.groups.expire_offsets`); with
    `delete_group_when_empty`, an Empty group left without offsets is deleted too."""
    result = classic_groups.expire_offsets(
        tr,
        sub,
        group_id,
        rule,
        now_ms=now_ms,
        expected_revision=None,
        delete_group_when_empty=False,
    )
    if result.remaining == 0 and delete_group_when_empty:
        drop_consumer_group(tr, sub, group_id, expected_revision=expected_revision)
        return replace(result, group_deleted=True)
    return result
