"""CreateTopics, DeleteTopics and CreatePartitions, with Apache Kafka's checks and answers.

There is no replication: a partition lives in object storage and every agent serves it.
A replication factor up to the number of live agents is accepted (Kafka refuses more)
and every partition reports one replica, its leader, so topics report factor 1. Manual
replica assignments are checked as Kafka checks them (registered brokers, no repeats,
partitions numbered from 0) and then only decide the partition count.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.admin import create_topic, topic_name_error
from broker.agent import now_ms
from broker.context import AgentServices, HandlerContext
from broker.describe import ZERO_UUID
from broker.entities import build
from broker.handlers import api, response_class
from broker.topic_configs import topic_config_entries, validate_topic_configs
from metadata import topics as topics_layer
from metadata.errors import MetadataError

CREATE_TOPICS = 19
DELETE_TOPICS = 20
CREATE_PARTITIONS = 37

DEFAULT_REPLICATION_FACTOR = 1
REPORTED_REPLICATION_FACTOR = 1  # one replica per partition: its leader
CLUSTER_METADATA_TOPIC = "__cluster_metadata"
# Kafka's controller refuses operations of more records than this (MAX_RECORDS_PER_USER_OP).
MAX_PARTITIONS_PER_OPERATION = 10_000


def _fail(code: ErrorCode, message: str) -> MetadataError:
    return MetadataError(code, message)


def _check_manual_assignment(
    broker_ids: Iterable[int], live_ids: set[int], replicas: int | None
) -> None:
    """Kafka's validateManualPartitionAssignment."""
    ids = sorted(broker_ids)
    if not ids:
        raise _fail(
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        )
    previous = None
    for broker_id in ids:
        if broker_id not in live_ids:
            raise _fail(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes broker {broker_id}, but no such "
                "broker is registered.",
            )
        if broker_id == previous:
            raise _fail(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes the broker {broker_id} more than once.",
            )
        previous = broker_id
    if replicas is not None and len(ids) != replicas:
        raise _fail(
            ErrorCode.invalid_replica_assignment,
            f"The manual partition assignment includes a partition with {len(ids)} replica(s), "
            f"but this is not consistent with previous partitions, which have {replicas} "
            "replica(s).",
        )


def _partition_count(agent: AgentServices, wanted: Any, live_ids: set[int]) -> int:
    """How many partitions a CreatableTopic asks for, checked like Kafka's createTopic."""
    assignments = list(getattr(wanted, "assignments", ()) or ())
    num_partitions, replication_factor = wanted.num_partitions, wanted.replication_factor
    if assignments:
        if replication_factor != -1:
            raise _fail(
                ErrorCode.invalid_request,
                "A manual partition assignment was specified, but replication factor was not "
                "set to -1.",
            )
        if num_partitions != -1:
            raise _fail(
                ErrorCode.invalid_request,
                "A manual partition assignment was specified, but numPartitions was not set to -1.",
            )
        indexes: set[int] = set()
        replicas: int | None = None
        for assignment in assignments:
            if assignment.partition_index in indexes:
                raise _fail(
                    ErrorCode.invalid_replica_assignment,
                    "Found multiple manual partition assignments for partition "
                    f"{assignment.partition_index}",
                )
            _check_manual_assignment(assignment.broker_ids, live_ids, replicas)
            replicas = len(assignment.broker_ids)
            indexes.add(assignment.partition_index)
        if indexes != set(range(len(indexes))):
            raise _fail(
                ErrorCode.invalid_replica_assignment,
                "partitions should be a consecutive 0-based integer sequence",
            )
        return len(indexes)
    if replication_factor < -1 or replication_factor == 0:
        raise _fail(
            ErrorCode.invalid_replication_factor,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if num_partitions < -1 or num_partitions == 0:
        raise _fail(
            ErrorCode.invalid_partitions,
            "Number of partitions was set to an invalid non-positive value.",
        )
    factor = DEFAULT_REPLICATION_FACTOR if replication_factor == -1 else replication_factor
    if factor > len(live_ids):
        raise _fail(
            ErrorCode.invalid_replication_factor,
            f"Unable to replicate the partition {factor} time(s): The target replication factor "
            f"of {factor} cannot be reached because only {len(live_ids)} broker(s) are "
            "registered.",
        )
    return agent.config.default_partitions if num_partitions == -1 else num_partitions


async def _create_one(
    agent: AgentServices, wanted: Any, live_ids: set[int], validate_only: bool
) -> dict[str, Any]:
    name = wanted.name
    reason = topic_name_error(name)
    if reason is not None:
        raise _fail(ErrorCode.invalid_topic_exception, reason)
    if name == CLUSTER_METADATA_TOPIC:
        raise _fail(
            ErrorCode.invalid_request,
            f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.",
        )
    if await agent.topic(name, fresh=True) is not None:
        raise _fail(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    configs = validate_topic_configs({c.name: c.value for c in wanted.configs})
    partitions = _partition_count(agent, wanted, live_ids)
    if partitions > MAX_PARTITIONS_PER_OPERATION:
        raise _fail(
            ErrorCode.policy_violation, "Unable to perform excessively large batch operation."
        )
    topic = await create_topic(agent, name, partitions, configs, validate_only=validate_only)
    return {
        "name": name,
        "topic_id": uuid.UUID(bytes=topic.topic_id),
        "error_code": ErrorCode.none,
        "error_message": None,
        "topic_config_error_code": 0,
        "num_partitions": topic.partitions,
        "replication_factor": REPORTED_REPLICATION_FACTOR,
        "configs": [
            {
                "name": e["name"],
                "value": e["value"],
                "read_only": e["read_only"],
                "config_source": e["config_source"],
                "is_sensitive": e["is_sensitive"],
            }
            for e in topic_config_entries(agent, topic.configs)
        ],
    }


def _create_error(name: str, code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": ZERO_UUID,
        "error_code": code,
        "error_message": message,
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": None,
    }


@api(CREATE_TOPICS, 2, 7)
async def create_topics(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    validate_only = bool(getattr(request, "validate_only", False))
    live_ids = {a.node_id for a in await agent.refresh_live_agents(max_age=0.0)}
    counts = Counter(t.name for t in request.topics)
    answered_duplicates: set[str] = set()
    results = []
    # Kafka: CREATE on the cluster, or on each topic; its configs are answered only with
    # DESCRIBE_CONFIGS on it.
    names = {t.name for t in request.topics}
    creatable, describable = names, names
    if access.enabled(ctx):
        if not access.authorize_cluster(ctx, Operation.CREATE, log=False):
            creatable = access.filter_authorized(ctx, Operation.CREATE, ResourceType.TOPIC, names)
        describable = access.filter_authorized(
            ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, names, log=False
        )
    for wanted in request.topics:
        if counts[wanted.name] > 1:
            if wanted.name not in answered_duplicates:
                answered_duplicates.add(wanted.name)
                results.append(
                    _create_error(wanted.name, ErrorCode.invalid_request, "Duplicate topic name.")
                )
            continue
        if wanted.name not in creatable:
            results.append(
                _create_error(
                    wanted.name, ErrorCode.topic_authorization_failed, "Authorization failed."
                )
            )
            continue
        try:
            created = await _create_one(agent, wanted, live_ids, validate_only)
        except MetadataError as exc:
            results.append(_create_error(wanted.name, exc.error_code, exc.message or None))
            continue
        if wanted.name not in describable:
            created.update(
                topic_config_error_code=ErrorCode.topic_authorization_failed,
                num_partitions=-1,
                replication_factor=-1,
                configs=None,
            )
        results.append(created)
    return build(response_class(request), {"throttle_time": 0, "topics": results})


# -- DeleteTopics -------------------------------------------------------------------------


def _deleted(
    name: str | None, topic_id: uuid.UUID | None, code: ErrorCode, message: str | None
) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": topic_id or ZERO_UUID,
        "error_code": code,
        "error_message": message,
    }


async def _delete_by_name(agent: AgentServices, name: str) -> dict[str, Any]:
    now = now_ms()
    try:
        topic_id = await agent.kv.transact(
            lambda tr: topics_layer.delete_topic(tr, agent.sub, name, now)
        )
    except MetadataError as exc:
        return _deleted(name, None, exc.error_code, exc.message or None)
    finally:
        agent.forget_topic(name)
    return _deleted(name, uuid.UUID(bytes=topic_id), ErrorCode.none, None)


async def _delete_by_id(ctx: HandlerContext, topic_id: uuid.UUID) -> dict[str, Any]:
    agent = ctx.agent
    now = now_ms()
    if access.enabled(ctx):
        # Kafka: a topic one may not describe is not revealed; DELETE to delete it.
        known = await agent.topic_by_id(topic_id.bytes)
        if known is not None:
            if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.TOPIC, known.name):
                return _deleted(
                    None,
                    topic_id,
                    ErrorCode.unknown_topic_id,
                    "This server does not host this topic ID.",
                )
            if not access.authorize(ctx, Operation.DELETE, ResourceType.TOPIC, known.name):
                return _deleted(
                    known.name,
                    topic_id,
                    ErrorCode.topic_authorization_failed,
                    "Authorization failed.",
                )

    def txn(tr: Any) -> str:
        topic = topics_layer.get_topic_by_id(tr, agent.sub, topic_id.bytes)
        if topic is None:
            raise _fail(ErrorCode.unknown_topic_id, "This server does not host this topic ID.")
        topics_layer.delete_topic(tr, agent.sub, topic.name, now)
        return topic.name

    try:
        name = await agent.kv.transact(txn)
    except MetadataError as exc:
        return _deleted(None, topic_id, exc.error_code, exc.message or None)
    agent.forget_topic(name)
    return _deleted(name, topic_id, ErrorCode.none, None)


@api(DELETE_TOPICS, 1, 6)
async def delete_topics(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    # (name, None) or (None, id), in request order; v6 names topics either way.
    wanted: list[tuple[str | None, uuid.UUID | None]] = []
    results: list[dict[str, Any]] = []
    for name in getattr(request, "topic_names", None) or ():
        wanted.append((name, None))
    for state in getattr(request, "topics", None) or ():
        topic_id = state.topic_id if state.topic_id != ZERO_UUID else None
        if state.name is None and topic_id is None:
            results.append(
                _deleted(
                    None,
                    None,
                    ErrorCode.invalid_request,
                    "Neither topic name nor id were specified.",
                )
            )
        elif state.name is not None and topic_id is not None:
            results.append(
                _deleted(
                    state.name,
                    topic_id,
                    ErrorCode.invalid_request,
                    "You may not specify both topic name and topic id.",
                )
            )
        else:
            wanted.append((state.name, topic_id))
    counts = Counter(wanted)
    answered: set[tuple[str | None, uuid.UUID | None]] = set()
    for name, topic_id in wanted:
        if counts[(name, topic_id)] > 1:
            if (name, topic_id) not in answered:
                answered.add((name, topic_id))
                what = "name" if name is not None else "id"
                results.append(
                    _deleted(name, topic_id, ErrorCode.invalid_request, f"Duplicate topic {what}.")
                )
            continue
        if name is not None:
            if not access.authorize(ctx, Operation.DELETE, ResourceType.TOPIC, name):
                results.append(
                    _deleted(
                        name, None, ErrorCode.topic_authorization_failed, "Authorization failed."
                    )
                )
                continue
            results.append(await _delete_by_name(agent, name))
        else:
            assert topic_id is not None
            results.append(await _delete_by_id(ctx, topic_id))
    return build(response_class(request), {"throttle_time": 0, "responses": results})


# -- CreatePartitions ---------------------------------------------------------------------


async def _add_partitions(
    agent: AgentServices, wanted: Any, live_ids: set[int], validate_only: bool
) -> None:
    name, count = wanted.name, wanted.count
    assignments = getattr(wanted, "assignments", None)

    def txn(tr: Any) -> None:
        topic = topics_layer.get_topic(tr, agent.sub, name)
        if topic is None:
            raise _fail(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        if count == topic.partitions:
            raise _fail(
                ErrorCode.invalid_partitions, f"Topic already has {topic.partitions} partition(s)."
            )
        if count < topic.partitions:
            raise _fail(
                ErrorCode.invalid_partitions,
                f"The topic {name} currently has {topic.partitions} partition(s); {count} would "
                "not be an increase.",
            )
        additional = count - topic.partitions
        if assignments is not None and len(assignments) != additional:
            raise _fail(
                ErrorCode.invalid_replica_assignment,
                f"Attempted to add {additional} additional partition(s), but only "
                f"{len(assignments)} assignment(s) were specified.",
            )
        for assignment in assignments or ():
            # Placement means nothing here, but a wrong one is still refused like Kafka does.
            _check_manual_assignment(assignment.broker_ids, live_ids, None)
        if additional > MAX_PARTITIONS_PER_OPERATION:
            raise _fail(
                ErrorCode.policy_violation, "Unable to perform excessively large batch operation."
            )
        topics_layer.add_partitions(tr, agent.sub, name, count, validate_only=validate_only)

    if validate_only:
        await agent.kv.read(txn)
    else:
        await agent.kv.transact(txn)
        agent.forget_topic(name)


@api(CREATE_PARTITIONS, 0, 3)
async def create_partitions(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    validate_only = bool(getattr(request, "validate_only", False))
    live_ids = {a.node_id for a in await agent.refresh_live_agents(max_age=0.0)}
    counts = Counter(t.name for t in request.topics)
    answered: set[str] = set()
    results = []
    for wanted in request.topics:
        if counts[wanted.name] > 1:
            if wanted.name not in answered:
                answered.add(wanted.name)
                results.append(
                    {
                        "name": wanted.name,
                        "error_code": ErrorCode.invalid_request,
                        "error_message": "Duplicate topic name.",
                    }
                )
            continue
        code, message = ErrorCode.none, None
        if not access.authorize(ctx, Operation.ALTER, ResourceType.TOPIC, wanted.name):
            code, message = ErrorCode.topic_authorization_failed, "Authorization failed."
            results.append({"name": wanted.name, "error_code": code, "error_message": message})
            continue
        try:
            await _add_partitions(agent, wanted, live_ids, validate_only)
        except MetadataError as exc:
            code, message = exc.error_code, exc.message or None
        results.append({"name": wanted.name, "error_code": code, "error_message": message})
    return build(response_class(request), {"throttle_time": 0, "results": results})
