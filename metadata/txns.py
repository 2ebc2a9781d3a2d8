"""Transactions: the state of each transactional id, the transactions open on each
partition, and each partition's index of aborted transactions.

A transaction's end is one metadata transaction: its COMMIT or ABORT markers get their
offsets in every partition, the partitions' open entries go (which moves their last
stable offsets), aborted ones enter the aborted index, and pending transactional offset
commits become visible (or are dropped) -- all at once.

States persisted: EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT. The PREPARE states of
Apache Kafka never need to be stored here, because nothing happens between deciding the
outcome and writing the markers: both are the same commit.

A transactional id also keeps the producer id and epoch it had before its last
InitProducerId (Kafka's lastProducerId, lastProducerEpoch), so that a producer that asks
again for an epoch bump whose answer it lost (KIP-360) gets the bumped epoch instead of
being fenced (`init_epoch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from kio.schema.errors import ErrorCode

from metadata import keys
from metadata.errors import MetadataError
from metadata.kv import ReadTransaction, Transaction

MAX_EPOCH = 32767


class TxnState(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class Txn:
    transactional_id: str
    producer_id: int
    epoch: int
    state: TxnState
    timeout_ms: int
    started_ms: int  # when the current transaction began (-1 when none is open)
    updated_ms: int
    partitions: tuple[tuple[bytes, int], ...]
    groups: tuple[str, ...]
    # Before the last InitProducerId: the producer id, and the epoch a producer that named
    # it bumped from (-1 after any other InitProducerId, or a fencing abort).
    last_producer_id: int = -1
    last_epoch: int = -1


def get_txn(tr: ReadTransaction, sub: keys.Subspace, transactional_id: str) -> Txn | None:
    raw = tr.get(sub.key(keys.TXN, transactional_id))
    if raw is None:
        return None
    value = keys.unpack_value(raw)
    pid, epoch, state, timeout, started, updated, partitions, groups = value[:8]
    last_pid, last_epoch = value[8:10] if len(value) >= 10 else (-1, -1)  # older values
    return Txn(
        transactional_id,
        int(pid),
        int(epoch),
        TxnState(state),
        int(timeout),
        int(started),
        int(updated),
        tuple((bytes(t), int(p)) for t, p in partitions),
        tuple(groups),
        int(last_pid),
        int(last_epoch),
    )


def put_txn(tr: Transaction, sub: keys.Subspace, txn: Txn) -> None:
    tr.set(
        sub.key(keys.TXN, txn.transactional_id),
        keys.pack_value(
            (
                txn.producer_id,
                txn.epoch,
                txn.state.value,
                txn.timeout_ms,
                txn.started_ms,
                txn.updated_ms,
                txn.partitions,
                txn.groups,
                txn.last_producer_id,
                txn.last_epoch,
            )
        ),
    )


def list_txns(tr: ReadTransaction, sub: keys.Subspace) -> list[Txn]:
    begin, end = sub.range(keys.TXN)
    out = []
    for key, _value in tr.get_range(begin, end):
        txn = get_txn(tr, sub, sub.unpack(key)[1])
        if txn is not None:
            out.append(txn)
    return out


def check_producer(txn: Txn | None, producer_id: int, epoch: int) -> None:
    """The transactional-id checks every transactional request starts with."""
    if txn is None:
        raise MetadataError(
            ErrorCode.invalid_producer_id_mapping,
            "The producer attempted to use a producer id which is not currently assigned "
            "to its transactional id.",
        )
    if txn.producer_id != producer_id:
        raise MetadataError(ErrorCode.invalid_producer_id_mapping)
    if epoch < txn.epoch:
        raise MetadataError(
            ErrorCode.producer_fenced,
            "There is a newer producer with the same transactionalId which fences the current one.",
        )
    if epoch > txn.epoch:
        raise MetadataError(ErrorCode.invalid_producer_epoch)


def epoch_exhausted(epoch: int) -> bool:
    """No epoch may be handed out past this one: one bump is kept for fencing (Kafka's
    TransactionMetadata.isEpochExhausted)."""
    return epoch >= MAX_EPOCH - 1


def check_expected_producer(txn: Txn, expected_producer_id: int, expected_epoch: int) -> None:
    """An InitProducerId naming a producer id is fenced unless it names the id's producer,
    or the one before it whose epochs ran out (a retry of the switch to a new id)."""
    if expected_producer_id != txn.producer_id and not (
        expected_producer_id == txn.last_producer_id and epoch_exhausted(expected_epoch)
    ):
        raise MetadataError(ErrorCode.producer_fenced)


NEW_PRODUCER_ID = -1
"""`init_epoch`'s answer when the id's epochs are exhausted: allocate a producer id."""


def init_epoch(txn: Txn, expected_producer_id: int, expected_epoch: int) -> tuple[int, int]:
    """InitProducerId on a transactional id with no open transaction: (epoch to hand out,
    the new last_epoch), or (NEW_PRODUCER_ID, last_epoch) when a new producer id is due.

    `expected_producer_id` -1: a new instance, fencing every other; else the (id, epoch)
    the producer has (KIP-360): it bumps its own epoch, or retries a bump that succeeded
    (its epoch is the last one), or it was fenced. As Kafka's
    TransactionCoordinator.prepareInitProducerIdTransit and
    TransactionMetadata.prepareIncrementProducerEpoch.
    """
    if expected_producer_id < 0:
        if epoch_exhausted(txn.epoch):
            return NEW_PRODUCER_ID, -1
        return txn.epoch + 1, -1
    check_expected_producer(txn, expected_producer_id, expected_epoch)
    if epoch_exhausted(txn.epoch) and expected_epoch == txn.epoch:
        return NEW_PRODUCER_ID, txn.epoch
    if expected_epoch == txn.epoch:
        return txn.epoch + 1, txn.epoch
    if expected_epoch == txn.last_epoch:
        return txn.epoch, txn.last_epoch  # a retry of the bump that made this epoch
    raise MetadataError(ErrorCode.producer_fenced)


def add_partitions(
    tr: Transaction,
    sub: keys.Subspace,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    partitions: list[tuple[bytes, int]],
    now_ms: int,
) -> Txn:
    txn = get_txn(tr, sub, transactional_id)
    check_producer(txn, producer_id, epoch)
    assert txn is not None
    if txn.state not in (
        TxnState.EMPTY,
        TxnState.ONGOING,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    ):
        raise MetadataError(ErrorCode.concurrent_transactions)
    fresh = txn.state != TxnState.ONGOING
    known = set(() if fresh else txn.partitions)
    merged = list(() if fresh else txn.partitions)
    for tp in partitions:
        if tp not in known:
            known.add(tp)
            merged.append(tp)
    txn = replace(
        txn,
        state=TxnState.ONGOING,
        started_ms=now_ms if fresh else txn.started_ms,
        updated_ms=now_ms,
        partitions=tuple(merged),
        groups=() if fresh else txn.groups,
    )
    put_txn(tr, sub, txn)
    return txn


def add_group(
    tr: Transaction,
    sub: keys.Subspace,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    group: str,
    now_ms: int,
) -> Txn:
    txn = get_txn(tr, sub, transactional_id)
    check_producer(txn, producer_id, epoch)
    assert txn is not None
    fresh = txn.state != TxnState.ONGOING
    if txn.state not in (
        TxnState.EMPTY,
        TxnState.ONGOING,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    ):
        raise MetadataError(ErrorCode.concurrent_transactions)
    groups = () if fresh else txn.groups
    txn = replace(
        txn,
        state=TxnState.ONGOING,
        started_ms=now_ms if fresh else txn.started_ms,
        updated_ms=now_ms,
        partitions=() if fresh else txn.partitions,
        groups=groups if group in groups else (*groups, group),
    )
    put_txn(tr, sub, txn)
    return txn


# -- the partition side ---------------------------------------------------------------


def open_first_offset(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int, producer_id: int
) -> int | None:
    raw = tr.get(sub.key(keys.TXN_OPEN, topic_id, partition, producer_id))
    return None if raw is None else int(keys.unpack_value(raw)[0])


def mark_open(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    producer_id: int,
    first_offset: int,
) -> None:
    tr.set(
        sub.key(keys.TXN_OPEN, topic_id, partition, producer_id), keys.pack_value((first_offset,))
    )


def close_open(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    producer_id: int,
    marker_offset: int,
    aborted: bool,
) -> None:
    """The marker at marker_offset ends producer_id's transaction on this partition."""
    key = sub.key(keys.TXN_OPEN, topic_id, partition, producer_id)
    raw = tr.get(key)
    if raw is None:
        return
    tr.clear(key)
    if aborted:
        first = int(keys.unpack_value(raw)[0])
        tr.set(
            sub.key(keys.ABORTED, topic_id, partition, marker_offset),
            keys.pack_value((producer_id, first)),
        )


def last_stable_offset(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int, high_watermark: int
) -> int:
    """The first offset of the oldest open transaction, or the high watermark."""
    begin, end = sub.range(keys.TXN_OPEN, topic_id, partition)
    firsts = [int(keys.unpack_value(v)[0]) for _k, v in tr.get_range(begin, end)]
    return min(firsts, default=high_watermark)


def aborted_between(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    start: int,
    end: int,
    *,
    scan_limit: int = 0,
) -> list[tuple[int, int]] | None:
    """(producer_id, first_offset) of aborted transactions overlapping [start, end).

    Every abort marker from `start` on is read (a transaction that began before `end` may
    end far after it). With `scan_limit`, None when there are more markers than that to read.
    """
    _begin, range_end = sub.range(keys.ABORTED, topic_id, partition)
    begin = sub.key(keys.ABORTED, topic_id, partition, start)
    rows = tr.get_range(begin, range_end, limit=scan_limit + 1 if scan_limit else 0)
    if scan_limit and len(rows) > scan_limit:
        return None
    out = []
    for _key, value in rows:
        pid, first = keys.unpack_value(value)
        if first < end:
            out.append((int(pid), int(first)))
    return out


# -- transactional offset commits --------------------------------------------------------

OffsetApplier = Callable[[Transaction, str, str, int, int, int, str | None, int], None]
"""(tr, group, topic, partition, offset, leader_epoch, metadata, now_ms) -> None"""


def put_pending_offset(
    tr: Transaction,
    sub: keys.Subspace,
    transactional_id: str,
    group: str,
    topic: str,
    partition: int,
    offset: int,
    leader_epoch: int,
    metadata: str | None,
) -> None:
    tr.set(
        sub.key(keys.TXN_OFFSET, transactional_id, group, topic, partition),
        keys.pack_value((offset, leader_epoch, metadata)),
    )
    tr.set(sub.key(keys.TXN_OFFSET_GROUP, group, topic, partition, transactional_id), b"")


def has_pending_offset(
    tr: ReadTransaction, sub: keys.Subspace, group: str, topic: str, partition: int
) -> bool:
    """Whether an open transaction holds an offset for this group and partition (an
    OffsetFetch that requires stable offsets then answers UNSTABLE_OFFSET_COMMIT)."""
    begin, end = sub.range(keys.TXN_OFFSET_GROUP, group, topic, partition)
    return bool(tr.get_range(begin, end, limit=1))


def pending_offsets(
    tr: ReadTransaction, sub: keys.Subspace, transactional_id: str
) -> list[tuple[str, str, int, int, int, str | None]]:
    begin, end = sub.range(keys.TXN_OFFSET, transactional_id)
    out = []
    for key, value in tr.get_range(begin, end):
        _tag, _tid, group, topic, partition = sub.unpack(key)
        offset, leader_epoch, metadata = keys.unpack_value(value)
        out.append((group, topic, int(partition), int(offset), int(leader_epoch), metadata))
    return out


def settle_offsets(
    tr: Transaction,
    sub: keys.Subspace,
    txn: Txn,
    commit: bool,
    now_ms: int,
    apply: OffsetApplier | None,
) -> None:
    """At the end of a transaction its pending offsets become group offsets (through
    `apply`, which the group layer provides), or vanish."""
    pending = pending_offsets(tr, sub, txn.transactional_id)
    for group, topic, partition, offset, leader_epoch, metadata in pending:
        if commit and apply is not None:
            apply(tr, group, topic, partition, offset, leader_epoch, metadata, now_ms)
        tr.clear(sub.key(keys.TXN_OFFSET_GROUP, group, topic, partition, txn.transactional_id))
    tr.clear_range(*sub.range(keys.TXN_OFFSET, txn.transactional_id))
