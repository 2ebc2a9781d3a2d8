"""The transaction coordinator's actions: init a transactional producer, end a transaction,
abort transactions that outlived their timeout.

Ending a transaction writes one control batch per partition into one ingest file, then
commits everything in one metadata transaction (see metadata/txns.py). If the
transaction changed between reading it and committing (a partition was added, an epoch
was bumped), the commit is refused inside the transaction and the whole step is retried
with fresh state; the object written for the refused attempt is garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from kio.schema.errors import ErrorCode

from broker import faults
from broker.agent import now_ms
from broker.context import AgentServices
from metadata import cluster, groups, producers, txns
from metadata import log as log_layer
from metadata.errors import MetadataError
from protocol.records import RecordBatchView, build_batch, end_txn_marker, with_log_append_time
from storage.ingest import encode_ingest_file, new_object_key

logger = logging.getLogger(__name__)

MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000  # transaction.max.timeout.ms
COORDINATOR_EPOCH = 0

ATTEMPTS = 10

# Test-only fault points (broker/faults.py): the agent dies right after the metadata
# commit, before the client hears of it; the client asks again, another agent answers.
END_AFTER_COMMIT = "txn.end_after_commit"
INIT_AFTER_COMMIT = "txn.init_after_commit"
ADD_PARTITIONS_BEFORE_COMMIT = "txn.add_partitions_before_commit"  # the request is lost
ADD_PARTITIONS_AFTER_COMMIT = "txn.add_partitions_after_commit"  # its answer is lost
# Test-only misbehaviour: one EndTxn(commit) answered INVALID_TXN_STATE, the transaction
# left open, for the chaos checker to report the fatal error no Kafka broker would give.
END_COMMIT_REFUSED = "txn.end_commit_refused"


class _Changed(Exception):
    """The transaction moved on between the read and the commit: start over."""


async def end_transaction(
    agent: AgentServices,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    commit: bool,
    *,
    bump_epoch: bool = False,
) -> None:
    """Commit or abort; raises MetadataError with Kafka's error code."""
    for _attempt in range(ATTEMPTS):
        txn = await agent.kv.read(lambda tr: txns.get_txn(tr, agent.sub, transactional_id))
        txns.check_producer(txn, producer_id, epoch)
        assert txn is not None
        if txn.state != txns.TxnState.ONGOING:
            done = txns.TxnState.COMPLETE_COMMIT if commit else txns.TxnState.COMPLETE_ABORT
            if txn.state == done and not bump_epoch:
                return  # a retried EndTxn of a transaction already ended this way
            if txn.state == txns.TxnState.EMPTY and not commit:
                # Nothing registered since InitProducerId: the client aborts a transaction
                # whose AddPartitionsToTxn was lost with its agent (librdkafka sends
                # EndTxn then, not knowing). Kafka's transaction version 2 answers this
                # without error; version 1's INVALID_TXN_STATE would be fatal for it.
                return
            raise MetadataError(
                ErrorCode.invalid_txn_state,
                f"EndTxn({'commit' if commit else 'abort'}) in state {txn.state.value}",
            )
        try:
            touched = await _write_markers(agent, txn, commit, bump_epoch)
        except _Changed:
            continue
        faults.point(END_AFTER_COMMIT)
        for key in touched:
            agent.notifier.notify(key)
        return
    raise MetadataError(ErrorCode.concurrent_transactions)


async def _write_markers(
    agent: AgentServices, txn: txns.Txn, commit: bool, bump_epoch: bool
) -> list[tuple[bytes, int]]:
    now = now_ms()
    key, value = end_txn_marker(commit, COORDINATOR_EPOCH)
    marker = build_batch(
        [(key, value, [], now)],
        control=True,
        transactional=True,
        producer_id=txn.producer_id,
        producer_epoch=txn.epoch,
    )
    partitions = list(txn.partitions)
    # Kafka's coordinator appends markers through the LogValidator that stamps produced
    # batches: on a LogAppendTime topic a marker is a LOG_APPEND_TIME batch too.
    stamped_marker = with_log_append_time(RecordBatchView(marker), now).data
    stamped_topics: set[bytes] = set()
    for tid in {tid for tid, _p in partitions}:
        topic = await agent.topic_by_id(tid)
        if topic is not None:
            if agent.topic_config(topic, "message.timestamp.type") == "LogAppendTime":
                stamped_topics.add(tid)
    object_key = ""
    pending: list[log_layer.PendingBatch] = []
    size = 0
    if partitions:
        data, locations = encode_ingest_file(
            [
                (tid, p, [stamped_marker if tid in stamped_topics else marker])
                for tid, p in partitions
            ]
        )
        object_key = new_object_key()
        await agent.store.put(object_key, data, if_absent=True)
        agent.cache.put(object_key, data)
        size = len(data)
        for (tid, p), location in zip(partitions, locations, strict=True):
            pending.append(
                log_layer.PendingBatch(
                    topic_id=tid,
                    partition=p,
                    start=location.start,
                    length=location.length,
                    last_offset_delta=0,
                    max_timestamp=now,
                    producer_id=txn.producer_id,
                    producer_epoch=txn.epoch,
                    base_sequence=-1,
                    transactional=True,
                    control=log_layer.COMMIT_MARKER if commit else log_layer.ABORT_MARKER,
                )
            )

    def commit_txn(tr: Any) -> None:
        current = txns.get_txn(tr, agent.sub, txn.transactional_id)
        if current != txn:
            raise _Changed()
        if pending:
            log_layer.commit_ingest(tr, agent.sub, object_key, size, now, pending)
        txns.settle_offsets(tr, agent.sub, txn, commit, now, _to_group_offset(agent))
        epoch, last_producer_id, last_epoch = txn.epoch, txn.last_producer_id, txn.last_epoch
        if bump_epoch:
            # Fencing: no earlier epoch may pass for a retry of a bump any more (KIP-360).
            epoch, last_producer_id, last_epoch = txn.epoch + 1, txn.producer_id, -1
            producers.put_producer(
                tr,
                agent.sub,
                producers.ProducerIdentity(txn.producer_id, epoch, txn.transactional_id),
            )
        txns.put_txn(
            tr,
            agent.sub,
            replace(
                txn,
                epoch=epoch,
                last_producer_id=last_producer_id,
                last_epoch=last_epoch,
                state=txns.TxnState.COMPLETE_COMMIT if commit else txns.TxnState.COMPLETE_ABORT,
                started_ms=-1,
                updated_ms=now,
                partitions=(),
                groups=(),
            ),
        )

    await agent.kv.transact(commit_txn)
    return partitions


def _to_group_offset(agent: AgentServices) -> txns.OffsetApplier:
    """How a committed transactional offset becomes the group's committed offset."""

    def apply(tr: Any, *offset: Any) -> None:
        groups.apply_offset(tr, agent.sub, *offset)

    return apply


async def init_transactional_producer(
    agent: AgentServices,
    transactional_id: str,
    timeout_ms: int,
    expected_producer_id: int = -1,
    expected_epoch: int = -1,
) -> tuple[int, int]:
    """InitProducerId with a transactional id: fence the previous producer and abort its
    open transaction; returns (producer id, epoch)."""
    if not 0 < timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
        raise MetadataError(
            ErrorCode.invalid_transaction_timeout,
            "The transaction timeout is larger than the maximum value allowed by the broker "
            "(as configured by transaction.max.timeout.ms).",
        )
    for _attempt in range(ATTEMPTS):
        txn = await agent.kv.read(lambda tr: txns.get_txn(tr, agent.sub, transactional_id))
        if txn is not None and expected_producer_id >= 0:
            # KIP-360: a producer re-initialising itself must still be the id's producer.
            txns.check_expected_producer(txn, expected_producer_id, expected_epoch)
        if txn is not None and txn.state == txns.TxnState.ONGOING:
            try:
                await end_transaction(
                    agent, transactional_id, txn.producer_id, txn.epoch, False, bump_epoch=True
                )
            except MetadataError as exc:
                logger.info("abort before re-init of %r: %s", transactional_id, exc)
            continue

        def init(tr: Any, seen: txns.Txn | None = txn, now: int = now_ms()) -> tuple[int, int]:
            current = txns.get_txn(tr, agent.sub, transactional_id)
            if current != seen:
                raise _Changed()
            last_producer_id, last_epoch = -1, -1
            if current is None:
                producer_id, epoch = cluster.allocate_producer_id(tr, agent.sub), 0
            else:
                epoch, last_epoch = txns.init_epoch(current, expected_producer_id, expected_epoch)
                producer_id, last_producer_id = current.producer_id, current.producer_id
                if epoch == txns.NEW_PRODUCER_ID:
                    producer_id, epoch = cluster.allocate_producer_id(tr, agent.sub), 0
            producers.put_producer(
                tr, agent.sub, producers.ProducerIdentity(producer_id, epoch, transactional_id)
            )
            txns.put_txn(
                tr,
                agent.sub,
                txns.Txn(
                    transactional_id,
                    producer_id,
                    epoch,
                    txns.TxnState.EMPTY,
                    timeout_ms,
                    -1,
                    now,
                    (),
                    (),
                    last_producer_id,
                    last_epoch,
                ),
            )
            return producer_id, epoch

        try:
            result: tuple[int, int] = await agent.kv.transact(init)
        except _Changed:
            continue
        faults.point(INIT_AFTER_COMMIT)
        return result
    raise MetadataError(ErrorCode.concurrent_transactions)


async def abort_expired(
    agent: AgentServices, mine: Callable[[list[str]], Awaitable[set[str]]]
) -> int:
    """Abort (and fence) every ongoing transaction past its timeout that this agent
    coordinates (`mine`: those of the transactional ids it coordinates); returns how many
    were aborted."""
    now = now_ms()
    expired = [
        t
        for t in await agent.kv.read(lambda tr: txns.list_txns(tr, agent.sub))
        if t.state == txns.TxnState.ONGOING
        and t.started_ms >= 0
        and t.started_ms + t.timeout_ms < now
    ]
    if expired:
        coordinated = await mine([t.transactional_id for t in expired])
        expired = [t for t in expired if t.transactional_id in coordinated]
    aborted = 0
    for t in expired:
        try:
            await end_transaction(
                agent, t.transactional_id, t.producer_id, t.epoch, False, bump_epoch=True
            )
            aborted += 1
            logger.info("aborted transaction of %r after its timeout", t.transactional_id)
        except MetadataError as exc:
            logger.info("timeout abort of %r skipped: %s", t.transactional_id, exc)
    return aborted
