"""OffsetDelete (v0): delete some committed offsets of a group.

Partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION. A group error (unknown
group GROUP_ID_NOT_FOUND, a non-consumer group with members NON_EMPTY_GROUP, ...) is the
top-level error with no partitions. A consumer group with members keeps the offsets of
topics it subscribes to: GROUP_SUBSCRIBED_TO_TOPIC.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 47


@api(API_KEY, 0, 0)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    error, errors = await ctx.agent.groups.delete_offsets(
        request.group_id,
        [(t.name, p.partition_index) for t in request.topics for p in t.partitions],
        resolve_topic=ctx.agent.topic,
    )
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
