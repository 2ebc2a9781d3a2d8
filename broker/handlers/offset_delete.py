"""OffsetDelete (v0): delete some committed offsets of a group.

Partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION. A group error (unknown
group GROUP_ID_NOT_FOUND, a non-consumer group with members NON_EMPTY_GROUP, ...) is the
top-level error with no partitions. A consumer group with members keeps the offsets of
topics it subscribes to: GROUP_SUBSCRIBED_TO_TOPIC.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 47


@api(API_KEY, 0, 0)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.DELETE, ResourceType.GROUP, request.group_id):
        return build(
            response_class(request),
            {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "topics": []},
        )
    # Kafka: READ on each topic; the others are TOPIC_AUTHORIZATION_FAILED.
    readable = access.filter_authorized(
        ctx, Operation.READ, ResourceType.TOPIC, {t.name for t in request.topics}
    )
    error, errors = await ctx.agent.groups.delete_offsets(
        request.group_id,
        [
            (t.name, p.partition_index)
            for t in request.topics
            if t.name in readable
            for p in t.partitions
        ],
        resolve_topic=ctx.agent.topic,
    )
    for t in request.topics:
        if t.name not in readable:
            for p in t.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
    if error != ErrorCode.none:
        return build(
            response_class(request), {"throttle_time": 0, "error_code": error, "topics": []}
        )
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": errors[(t.name, p.partition_index)],
                        }
                        for p in t.partitions
                    ],
                }
                for t in request.topics
            ],
        },
    )
