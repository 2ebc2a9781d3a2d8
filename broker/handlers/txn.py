"""Transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions,
ListTransactions, DescribeProducers. (InitProducerId is in init_producer_id.py, TxnOffsetCommit
with the group APIs.)

Transaction state lives in the metadata store, so any agent can serve these requests
correctly; FindCoordinator still names one agent per transactional id, and that agent
also aborts the id's transactions that outlive their timeout.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access, faults
from broker.access import Operation, ResourceType
from broker.agent import now_ms
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.transactions import (
    ADD_PARTITIONS_AFTER_COMMIT,
    ADD_PARTITIONS_BEFORE_COMMIT,
    END_COMMIT_REFUSED,
    end_transaction,
)
from metadata import consumer_groups, groups, producers, topics, txns
from metadata.errors import MetadataError

ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66

logger = logging.getLogger(__name__)


@api(ADD_PARTITIONS_TO_TXN, 0, 3)
async def add_partitions_to_txn(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    tid = request.v3_and_below_transactional_id
    producer_id = request.v3_and_below_producer_id
    epoch = request.v3_and_below_producer_epoch
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    errors: dict[tuple[str, int], ErrorCode] = {}
    resolved: list[tuple[bytes, int]] = []
    if not access.authorize(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        errors = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        return _added(request, wanted, errors)
    writable = access.filter_authorized(
        ctx, Operation.WRITE, ResourceType.TOPIC, {name for name, _p in wanted}
    )
    for name, p in wanted:
        if name not in writable:
            errors[(name, p)] = ErrorCode.topic_authorization_failed
            continue
        topic = await agent.topic(name)
        if topic is None or not 0 <= p < topic.partitions:
            errors[(name, p)] = ErrorCode.unknown_topic_or_partition
        else:
            resolved.append((topic.topic_id, p))
    if errors:
        # Kafka adds nothing when one partition is bad: the others get OPERATION_NOT_ATTEMPTED.
        for key in wanted:
            errors.setdefault(key, ErrorCode.operation_not_attempted)
    else:
        now = now_ms()
        faults.point(ADD_PARTITIONS_BEFORE_COMMIT)
        try:
            await agent.kv.transact(
                lambda tr: txns.add_partitions(
                    tr, agent.sub, tid, producer_id, epoch, resolved, now
                )
            )
            code = ErrorCode.none
            faults.point(ADD_PARTITIONS_AFTER_COMMIT)
        except MetadataError as exc:
            code = _for_version(exc.error_code, ctx.api_version)
        errors = {key: code for key in wanted}
    return _added(request, wanted, errors)


def _added(
    request: Any, wanted: list[tuple[str, int]], errors: dict[tuple[str, int], ErrorCode]
) -> Any:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, p in wanted:
        by_topic.setdefault(name, []).append(
            {"partition_index": p, "partition_error_code": errors[(name, p)]}
        )
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "results_by_topic_v3_and_below": [
                {"name": name, "results_by_partition": parts} for name, parts in by_topic.items()
            ],
        },
    )


def _for_version(code: ErrorCode, version: int) -> ErrorCode:
    """PRODUCER_FENCED is new in these APIs' v2 (KIP-588); older clients know the other."""
    if code == ErrorCode.producer_fenced and version < 2:
        return ErrorCode.invalid_producer_epoch
    return code


@api(ADD_OFFSETS_TO_TXN, 0, 3)
async def add_offsets_to_txn(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    now = now_ms()
    if not access.authorize(
        ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
    ):
        code = ErrorCode.transactional_id_authorization_failed
        return build(response_class(request), {"throttle_time": 0, "error_code": code})
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        code = ErrorCode.group_authorization_failed
        return build(response_class(request), {"throttle_time": 0, "error_code": code})
    try:
        await agent.kv.transact(
            lambda tr: txns.add_group(
                tr,
                agent.sub,
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
                now,
            )
        )
        code = ErrorCode.none
    except MetadataError as exc:
        code = _for_version(exc.error_code, ctx.api_version)
    return build(response_class(request), {"throttle_time": 0, "error_code": code})


@api(END_TXN, 0, 3)
async def end_txn(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(
        ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
    ):
        code = ErrorCode.transactional_id_authorization_failed
        return build(response_class(request), {"throttle_time": 0, "error_code": code})
    if request.committed and faults.misbehave(END_COMMIT_REFUSED):
        logger.warning(
            "fault point %s (test-only): EndTxn(commit) of %r refused, the transaction left open",
            END_COMMIT_REFUSED,
            request.transactional_id,
        )
        code = ErrorCode.invalid_txn_state
        return build(response_class(request), {"throttle_time": 0, "error_code": code})
    try:
        await end_transaction(
            ctx.agent,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            bool(request.committed),
        )
        code = ErrorCode.none
    except MetadataError as exc:
        code = _for_version(exc.error_code, ctx.api_version)
    return build(response_class(request), {"throttle_time": 0, "error_code": code})


@api(TXN_OFFSET_COMMIT, 0, 3)
async def txn_offset_commit(request: Any, ctx: HandlerContext) -> Any:
    """Offsets stay pending in the transaction until EndTxn makes them the group's."""
    agent = ctx.agent
    tid, group = request.transactional_id, request.group_id
    generation = int(getattr(request, "generation_id", -1))
    wanted = [(t.name, p) for t in request.topics for p in t.partitions]
    refused: ErrorCode | None = None
    if not access.authorize(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        refused = ErrorCode.transactional_id_authorization_failed
    elif not access.authorize(ctx, Operation.READ, ResourceType.GROUP, group):
        refused = ErrorCode.group_authorization_failed
    if refused is not None:
        return _offsets_answer(request, {(n, p.partition_index): refused for n, p in wanted})
    readable = access.filter_authorized(
        ctx, Operation.READ, ResourceType.TOPIC, {n for n, _p in wanted}
    )
    unreadable = {
        (n, p.partition_index): ErrorCode.topic_authorization_failed
        for n, p in wanted
        if n not in readable
    }
    wanted = [(n, p) for n, p in wanted if n in readable]

    def txn(tr: Any) -> ErrorCode:
        current = txns.get_txn(tr, agent.sub, tid)
        txns.check_producer(current, request.producer_id, request.producer_epoch)
        assert current is not None
        if current.state != txns.TxnState.ONGOING or group not in current.groups:
            return ErrorCode.invalid_txn_state
        if generation >= 0:
            stored = groups.get_group(tr, agent.sub, group)
            consumer = None
            if stored is None:
                consumer = consumer_groups.get_consumer_group(tr, agent.sub, group)
            if consumer is not None:
                # A consumer-protocol group: the generation is the member's epoch (Kafka
                # answers ILLEGAL_GENERATION where OffsetCommit says STALE_MEMBER_EPOCH).
                member_id = getattr(request, "member_id", "")
                member = next((m for m in consumer.members if m.member_id == member_id), None)
                if member is None:
                    return ErrorCode.unknown_member_id
                if member.member_epoch != generation:
                    return ErrorCode.illegal_generation
            elif stored is None or stored.generation != generation:
                return ErrorCode.illegal_generation
        for name, p in wanted:
            txns.put_pending_offset(
                tr,
                agent.sub,
                tid,
                group,
                name,
                p.partition_index,
                p.committed_offset,
                int(getattr(p, "committed_leader_epoch", -1)),
                p.committed_metadata,
            )
        return ErrorCode.none

    unknown = [
        (n, p) for n, p in wanted if not await _partition_exists(agent, n, p.partition_index)
    ]
    if unknown:
        codes = {
            (n, p.partition_index): (
                ErrorCode.unknown_topic_or_partition if (n, p) in unknown else ErrorCode.none
            )
            for n, p in wanted
        }
    else:
        try:
            code = await agent.kv.transact(txn)
        except MetadataError as exc:
            code = _for_version(exc.error_code, ctx.api_version)
        codes = {(n, p.partition_index): code for n, p in wanted}
    return _offsets_answer(request, {**unreadable, **codes})


def _offsets_answer(request: Any, codes: dict[tuple[str, int], ErrorCode]) -> Any:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append({"partition_index": index, "error_code": code})
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
        },
    )


async def _partition_exists(agent: AgentServices, name: str, partition: int) -> bool:
    topic = await agent.topic(name)
    return topic is not None and 0 <= partition < topic.partitions


async def _topic_names(
    agent: AgentServices, partitions: tuple[tuple[bytes, int], ...]
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic_id, p in partitions:
        topic = await agent.topic_by_id(topic_id)
        if topic is not None:
            out.setdefault(topic.name, []).append(p)
    return out


def _no_state(tid: str, code: ErrorCode) -> dict[str, Any]:
    """DescribeTransactions' answer for a transactional id it describes nothing of."""
    return {
        "error_code": code,
        "transactional_id": tid,
        "transaction_state": "",
        "transaction_timeout": 0,
        "transaction_start_time": -1,
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    }


@api(DESCRIBE_TRANSACTIONS, 0, 0)
async def describe_transactions(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    states = []
    for tid in request.transactional_ids:
        if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            states.append(_no_state(tid, ErrorCode.transactional_id_authorization_failed))
            continue
        txn = await agent.kv.read(partial(txns.get_txn, sub=agent.sub, transactional_id=tid))
        if txn is None:
            states.append(_no_state(tid, ErrorCode.transactional_id_not_found))
            continue
        names = await _topic_names(agent, txn.partitions)
        if access.enabled(ctx):  # Kafka lists only the topics one may describe
            shown = access.filter_authorized(
                ctx, Operation.DESCRIBE, ResourceType.TOPIC, names, log=False
            )
            names = {n: ps for n, ps in names.items() if n in shown}
        states.append(
            {
                "error_code": ErrorCode.none,
                "transactional_id": tid,
                "transaction_state": txn.state.value,
                "transaction_timeout": txn.timeout_ms,
                "transaction_start_time": txn.started_ms,
                "producer_id": txn.producer_id,
                "producer_epoch": txn.epoch,
                "topics": [{"topic": n, "partitions": ps} for n, ps in names.items()],
            }
        )
    return build(response_class(request), {"throttle_time": 0, "transaction_states": states})


@api(LIST_TRANSACTIONS, 0, 1)
async def list_transactions(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    known = {s.value for s in txns.TxnState}
    state_filters = list(request.state_filters)
    unknown = [s for s in state_filters if s not in known]
    pid_filters = set(request.producer_id_filters)
    duration = int(getattr(request, "duration_filter", -1))
    now = now_ms()
    listed = []
    for txn in await agent.kv.read(lambda tr: txns.list_txns(tr, agent.sub)):
        if state_filters and txn.state.value not in state_filters:
            continue
        if pid_filters and txn.producer_id not in pid_filters:
            continue
        if duration >= 0 and (txn.started_ms < 0 or now - txn.started_ms < duration):
            continue
        if not access.authorize(
            ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn.transactional_id, log=False
        ):
            continue
        listed.append(
            {
                "transactional_id": txn.transactional_id,
                "producer_id": txn.producer_id,
                "transaction_state": txn.state.value,
            }
        )
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "unknown_state_filters": unknown,
            "transaction_states": listed,
        },
    )


@api(DESCRIBE_PRODUCERS, 0, 0)
async def describe_producers(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    out = []
    for t in request.topics:
        topic = await agent.topic(t.name)
        parts = []
        readable = access.authorize(ctx, Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partition_indexes:
            if not readable:
                parts.append(
                    {
                        "partition_index": p,
                        "error_code": ErrorCode.topic_authorization_failed,
                        "active_producers": [],
                    }
                )
                continue
            if topic is None or not 0 <= p < topic.partitions:
                parts.append(
                    {
                        "partition_index": p,
                        "error_code": ErrorCode.unknown_topic_or_partition,
                        "active_producers": [],
                    }
                )
                continue
            active = await agent.kv.read(
                partial(_active_producers, sub=agent.sub, topic=topic, partition=p)
            )
            parts.append(
                {"partition_index": p, "error_code": ErrorCode.none, "active_producers": active}
            )
        out.append({"name": t.name, "partitions": parts})
    return build(response_class(request), {"throttle_time": 0, "topics": out})


def _active_producers(
    tr: Any, sub: Any, topic: topics.Topic, partition: int
) -> list[dict[str, Any]]:
    out = []
    for producer_id, state in producers.partition_producers(tr, sub, topic.topic_id, partition):
        first_open = txns.open_first_offset(tr, sub, topic.topic_id, partition, producer_id)
        out.append(
            {
                "producer_id": producer_id,
                "producer_epoch": state.epoch,
                "last_sequence": state.last_sequence,
                "last_timestamp": -1,
                "coordinator_epoch": 0,
                "current_txn_start_offset": -1 if first_open is None else first_open,
            }
        )
    return out
