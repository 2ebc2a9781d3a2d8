"""OffsetDelete (v0): delete some committed offsets of a group.

Partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION. A group error (unknown
group GROUP_ID_NOT_FOUND, a non-consumer group with members NON_EMPTY_GROUP, ...) is the
top-level error with no partitions. A consumer group with members keeps the offsets of
topics it subscribes to: GROUP_SUBSCRIBED_TO_TOPIC.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 47


@api(API_KEY, 0, 0)
async def handle(request: Any, ctx: Any) -> Any:
    agent = ctx.agent
    errors: dict[tuple[str, int], ErrorCode] = {}
    valid: list[tuple[str, int]] = []
    for topic in request.topics:
        known = await agent.topic(topic.name)
        for p in topic.partitions:
            if known is None or not 0 <= p.partition_index < known.partitions:
                errors[(topic.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            else:
                valid.append((topic.name, p.partition_index))
    error, answers = await agent.groups.delete_offsets(request.group_id, valid)
    if error != ErrorCode.none:
        return build(
            response_class(request), {"throttle_time": 0, "error_code": error, "topics": []}
        )
    errors.update(answers)
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
