"""DescribeCluster, OffsetForLeaderEpoch and DescribeTopicPartitions.

Leader epochs never change here (no replication, no truncation): every partition is in
epoch 0 from offset 0, so OffsetForLeaderEpoch answers what Kafka's leader-epoch cache
answers for a log with that single epoch, and a consumer's truncation check always
passes.

DescribeCluster lists every live agent whatever zone the client names: it describes the
cluster, while Metadata is what sends clients to agents (broker.describe).
DescribeTopicPartitions names the leaders Metadata names to the same client.
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.admin import topic_name_error
from broker.context import HandlerContext
from broker.describe import (
    NO_AUTHORIZED_OPERATIONS,
    ZERO_UUID,
    broker_entries,
    partition_entries,
)
from broker.entities import build
from broker.handlers import api, response_class
from metadata import log as log_layer
from metadata import topics as topics_layer

DESCRIBE_CLUSTER = 60
OFFSET_FOR_LEADER_EPOCH = 23
DESCRIBE_TOPIC_PARTITIONS = 75

LEADER_EPOCH = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
BROKER_ENDPOINTS, CONTROLLER_ENDPOINTS = 1, 2
MAX_PARTITION_LIMIT = 2000  # Kafka's max.request.partition.size.limit

# Without an authorizer Kafka reports every operation the resource type supports.
# AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


# -- DescribeCluster ----------------------------------------------------------------------


@api(DESCRIBE_CLUSTER, 0, 2)
async def describe_cluster(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    endpoint_type = getattr(request, "endpoint_type", BROKER_ENDPOINTS)
    cls = response_class(request)
    if endpoint_type != BROKER_ENDPOINTS:
        # Kafka's AuthHelper.computeDescribeClusterResponse, as a broker answers it.
        known = endpoint_type == CONTROLLER_ENDPOINTS
        if ctx.api_version == 0:
            code = ErrorCode.invalid_request
        else:
            code = (
                ErrorCode.mismatched_endpoint_type if known else ErrorCode.unsupported_endpoint_type
            )
        message = (
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of "
            "type CONTROLLER"
            if known
            else f"Unsupported endpoint type {endpoint_type}"
        )
        return build(
            cls,
            {
                "throttle_time": 0,
                "error_code": code,
                "error_message": message,
                "endpoint_type": BROKER_ENDPOINTS,  # Kafka leaves the answer's defaults
                "cluster_id": "",
                "controller_id": -1,
                "brokers": [],
                "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
            },
        )
    await agent.refresh_live_agents(max_age=0.0)  # clients act on this answer: keep it current
    brokers = broker_entries(agent, ctx.listener)
    include_ops = bool(getattr(request, "include_cluster_authorized_operations", False))
    return build(
        cls,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "endpoint_type": BROKER_ENDPOINTS,
            "cluster_id": agent.cluster_id,
            "controller_id": brokers[0]["node_id"] if brokers else -1,
            "brokers": [
                {
                    "broker_id": b["node_id"],
                    "host": b["host"],
                    "port": b["port"],
                    "rack": b["rack"],
                    "is_fenced": False,
                }
                for b in brokers
            ],
            "cluster_authorized_operations": (
                (access.cluster_operations(ctx) if access.enabled(ctx) else CLUSTER_OPERATIONS)
                if include_ops
                else NO_AUTHORIZED_OPERATIONS
            ),
        },
    )


# -- OffsetForLeaderEpoch -----------------------------------------------------------------


def end_offset_for_epoch(requested: int, state: log_layer.PartitionState) -> tuple[int, int]:
    """(epoch, end offset) as Kafka's LeaderEpochFileCache.endOffsetFor answers for a log
    whose only epoch is 0, starting at its log start offset."""
    if requested == UNDEFINED_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested == LEADER_EPOCH:
        return LEADER_EPOCH, state.high_watermark  # the log end offset: no replicas lag
    if requested > LEADER_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET  # newer than any epoch we know
    return requested, state.log_start_offset  # older than the first epoch


def current_epoch_error(current_leader_epoch: int) -> ErrorCode:
    """Kafka's Partition.checkCurrentLeaderEpoch; -1 means the client does not check."""
    if current_leader_epoch == UNDEFINED_EPOCH:
        return ErrorCode.none
    if current_leader_epoch < LEADER_EPOCH:
        return ErrorCode.fenced_leader_epoch
    if current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.none


@api(OFFSET_FOR_LEADER_EPOCH, 2, 4)
async def offset_for_leader_epoch(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    wanted: list[tuple[Any, Any, Any]] = []  # (topic name, topic or None, partition request)
    refused: set[str] = set()  # Kafka: DESCRIBE on each topic
    for t in request.topics:
        if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.topic):
            refused.add(t.topic)
            wanted.extend((t.topic, None, p) for p in t.partitions)
            continue
        topic = await agent.topic(t.topic)
        wanted.extend((t.topic, topic, p) for p in t.partitions)
    present = [
        (topic.topic_id, p.partition)
        for _name, topic, p in wanted
        if topic is not None and 0 <= p.partition < topic.partitions
    ]

    def read(tr: Any) -> dict[tuple[bytes, int], log_layer.PartitionState | None]:
        return {key: log_layer.get_partition(tr, agent.sub, *key) for key in present}

    states = await agent.kv.read(read) if present else {}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, topic, p in wanted:
        answer: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "partition": p.partition,
            "leader_epoch": UNDEFINED_EPOCH,
            "end_offset": UNDEFINED_EPOCH_OFFSET,
        }
        state = None if topic is None else states.get((topic.topic_id, p.partition))
        if name in refused:
            answer["error_code"] = ErrorCode.topic_authorization_failed
        elif state is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            code = current_epoch_error(getattr(p, "current_leader_epoch", UNDEFINED_EPOCH))
            if code != ErrorCode.none:
                answer["error_code"] = code
            else:
                answer["leader_epoch"], answer["end_offset"] = end_offset_for_epoch(
                    p.leader_epoch, state
                )
        by_topic.setdefault(name, []).append(answer)
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "topics": [{"topic": name, "partitions": parts} for name, parts in by_topic.items()],
        },
    )


# -- DescribeTopicPartitions --------------------------------------------------------------


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": ZERO_UUID,
        "is_internal": name in INTERNAL_TOPICS,
        "partitions": [],
        "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }


@api(DESCRIBE_TOPIC_PARTITIONS, 0, 0)
async def describe_topic_partitions(request: Any, ctx: HandlerContext) -> Any:
    """Kafka's DescribeTopicPartitionsRequestHandler: topics in name order, paginated."""
    agent = ctx.agent
    cls = response_class(request)
    cursor = getattr(request, "cursor", None)
    cursor_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = len(request.topics) == 0
    if fetch_all:
        all_topics = await agent.kv.read(lambda tr: topics_layer.list_topics(tr, agent.sub))
        known = {t.name: t for t in all_topics}
        names = sorted(n for n in known if n >= cursor_topic)
    else:
        names = sorted({t.name for t in request.topics if t.name >= cursor_topic})
        if cursor is not None and cursor.topic_name not in names:
            # Kafka fails the request; its error answer names every requested topic.
            return build(
                cls,
                {
                    "throttle_time": 0,
                    "topics": [
                        _topic_error(t.name, ErrorCode.invalid_request) for t in request.topics
                    ],
                    "next_cursor": None,
                },
            )
        known = {}
    checked = access.enabled(ctx)
    if checked:
        # Kafka: topics one may not describe are left out of "all", and refused by name.
        describable = access.filter_authorized(
            ctx, Operation.DESCRIBE, ResourceType.TOPIC, names, log=not fetch_all
        )
    first_partition = cursor.partition_index if cursor is not None else 0
    remaining = min(MAX_PARTITION_LIMIT, request.response_partition_limit)
    topics_out: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        if remaining < 0:
            break  # a negative limit: Kafka answers nothing, and no cursor
        if remaining == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        if checked and name not in describable:
            if not fetch_all:
                topics_out.append(_topic_error(name, ErrorCode.topic_authorization_failed))
            continue
        topic = known.get(name) if fetch_all else await agent.topic(name, fresh=True)
        if topic is None:
            if not fetch_all:
                code = (
                    ErrorCode.invalid_topic_exception
                    if topic_name_error(name)
                    else ErrorCode.unknown_topic_or_partition
                )
                topics_out.append(_topic_error(name, code))
            continue
        start = first_partition if name == cursor_topic else 0
        end = min(topic.partitions, start + remaining)
        partitions = partition_entries(agent, topic, ctx.client_zone)[start:end]
        topics_out.append(
            {
                "error_code": ErrorCode.none,
                "name": name,
                "topic_id": uuid.UUID(bytes=topic.topic_id),
                "is_internal": name in INTERNAL_TOPICS,
                "partitions": partitions,
                "topic_authorized_operations": (
                    access.authorized_operations(ctx, ResourceType.TOPIC, name)
                    if checked
                    else TOPIC_OPERATIONS
                ),
            }
        )
        if end < topic.partitions:
            next_cursor = {"topic_name": name, "partition_index": end}
            break
        remaining -= len(partitions)
    return build(cls, {"throttle_time": 0, "topics": topics_out, "next_cursor": next_cursor})
