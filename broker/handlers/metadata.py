"""Metadata: live agents as brokers, topics with a leader per partition, auto-creation.

With authorization on, as Kafka: all topics lists only those the principal may DESCRIBE;
a topic named and not describable is TOPIC_AUTHORIZATION_FAILED (whether it exists or
not), and auto-creation needs CREATE on the cluster or the topic (else the same error).
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.admin import create_topic, topic_name_error
from broker.context import AgentServices, HandlerContext
from broker.describe import (
    NO_AUTHORIZED_OPERATIONS,
    ZERO_UUID,
    broker_entries,
    partition_entries,
)
from broker.entities import build
from broker.handlers import api, response_class
from metadata import topics as topics_layer
from metadata.errors import MetadataError

API_KEY = 3
# With no authorizer every operation is allowed: Kafka then reports these bit sets.
ALL_TOPIC_OPERATIONS = 3576
ALL_CLUSTER_OPERATIONS = 8096


def topic_entry(
    agent: AgentServices,
    topic: topics_layer.Topic,
    operations: int = NO_AUTHORIZED_OPERATIONS,
    zone: str | None = None,
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": topic.name,
        "topic_id": uuid.UUID(bytes=topic.topic_id),
        "is_internal": False,
        "partitions": partition_entries(agent, topic, zone),
        "topic_authorized_operations": operations,
    }


def error_topic(
    name: str | None, code: ErrorCode, topic_id: uuid.UUID | None = None
) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": topic_id or ZERO_UUID,
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }


def _by_id(wanted: Any) -> bool:
    """A topic asked for by id, or with a null name (v10+ requests can say both)."""
    topic_id = getattr(wanted, "topic_id", None)
    return wanted.name is None or (topic_id is not None and topic_id != ZERO_UUID)


def _invalid_request(request: Any, requested: Any) -> Any:
    """Kafka's answer to a v10 or v11 request naming a topic by id or not at all
    (KafkaApis.handleTopicMetadataRequest throws InvalidRequestException and
    MetadataRequest.getErrorResponse answers): every topic INVALID_REQUEST, a null name
    as "" (these versions' answers allow no null), no brokers."""
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "brokers": [],
            "cluster_id": None,
            "controller_id": -1,
            "topics": [
                error_topic(wanted.name or "", ErrorCode.invalid_request, wanted.topic_id)
                for wanted in requested
            ],
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        },
    )


@api(API_KEY, 0, 12)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    version = ctx.api_version
    await agent.refresh_live_agents(max_age=0.0)  # clients act on this answer: keep it current
    allow_auto = (
        getattr(request, "allow_auto_topic_creation", True) and agent.config.auto_create_topics
    )
    checked = access.enabled(ctx)
    with_topic_ops = getattr(request, "include_topic_authorized_operations", False)
    topic_ops = ALL_TOPIC_OPERATIONS if with_topic_ops else NO_AUTHORIZED_OPERATIONS
    cluster_ops = (
        access.cluster_operations(ctx)
        if getattr(request, "include_cluster_authorized_operations", False)
        else NO_AUTHORIZED_OPERATIONS
    )

    zone = ctx.client_zone
    if zone is not None:
        serving = agent.serving_agents(zone)
        if all(a.node_id != agent.node_id for a in serving):
            # A client of another zone, bootstrapping or sent here because its zone's
            # agents are gone: the agents named must not include one just killed.
            await agent.confirm_peers(serving)

    def entry(topic: topics_layer.Topic) -> dict[str, Any]:
        if checked and with_topic_ops:
            operations = access.authorized_operations(ctx, ResourceType.TOPIC, topic.name)
            return topic_entry(agent, topic, operations, zone)
        return topic_entry(agent, topic, topic_ops, zone)

    def refused(name: str) -> bool:
        return checked and not access.authorize(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)

    def may_create(name: str) -> bool:
        return (
            not checked
            or access.authorize_cluster(ctx, Operation.CREATE, log=False)
            or access.authorize(ctx, Operation.CREATE, ResourceType.TOPIC, name)
        )

    requested = request.topics
    if version == 0 and requested is not None and len(requested) == 0:
        requested = None  # v0: an empty list means all topics
    if version < 12 and any(_by_id(wanted) for wanted in requested or ()):
        return _invalid_request(request, requested)
    entries: list[dict[str, Any]] = []
    if requested is None:
        all_topics = await agent.all_topics()
        if checked:  # only those the principal may describe, silently
            describable = access.filter_authorized(
                ctx, Operation.DESCRIBE, ResourceType.TOPIC, [t.name for t in all_topics], log=False
            )
            all_topics = [t for t in all_topics if t.name in describable]
        entries = [entry(t) for t in all_topics]
    else:
        for wanted in requested:
            name = getattr(wanted, "name", None)
            topic_id = getattr(wanted, "topic_id", None)
            if name is None and topic_id is not None and topic_id != ZERO_UUID:
                topic = await agent.topic_by_id(topic_id.bytes)
                if topic is None:
                    entries.append(error_topic(None, ErrorCode.unknown_topic_id, topic_id))
                elif refused(topic.name):
                    entries.append(
                        error_topic(None, ErrorCode.topic_authorization_failed, topic_id)
                    )
                else:
                    entries.append(entry(topic))
                continue
            if name is None:
                entries.append(error_topic(None, ErrorCode.invalid_request))
                continue
            if refused(name):
                entries.append(error_topic(name, ErrorCode.topic_authorization_failed))
                continue
            topic = await agent.topic(name)
            if topic is None and allow_auto and topic_name_error(name) is None:
                if not may_create(name):
                    entries.append(error_topic(name, ErrorCode.topic_authorization_failed))
                    continue
                try:
                    topic = await create_topic(agent, name, agent.config.default_partitions)
                except MetadataError as exc:
                    if exc.error_code == ErrorCode.topic_already_exists:
                        topic = await agent.topic(name, fresh=True)
                    else:
                        entries.append(error_topic(name, exc.error_code))
                        continue
            if topic is None:
                # Kafka validates the name before it looks the topic up.
                code = (
                    ErrorCode.invalid_topic_exception
                    if topic_name_error(name) is not None
                    else ErrorCode.unknown_topic_or_partition
                )
                entries.append(error_topic(name, code))
            else:
                entries.append(entry(topic))
    leaders = {p["leader_id"] for e in entries for p in e["partitions"]} if zone is not None else ()
    brokers = broker_entries(agent, ctx.listener, zone, leaders)
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "brokers": brokers,
            "cluster_id": agent.cluster_id,
            # One of the brokers listed: clients send it admin requests by node id.
            "controller_id": brokers[0]["node_id"] if brokers else agent.live_agents()[0].node_id,
            "topics": entries,
            "cluster_authorized_operations": cluster_ops,
        },
    )
