"""OffsetFetch (v1-v9): a group's committed offsets, of some partitions or (v2+) of all.

v8+ ask for several groups at once. A partition without a committed offset answers -1.
v1 has no group-level error: it goes on every partition. With require_stable (v7+) a
partition for which an open transaction holds an offset is UNSTABLE_OFFSET_COMMIT (the
client retries), as in Apache Kafka.
v9's member id and epoch belong to the new consumer protocol: for a consumer-protocol group
an unknown member is UNKNOWN_MEMBER_ID and another epoch than the member's
STALE_MEMBER_EPOCH; they are not checked for classic groups, as in Apache Kafka.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 9
INVALID_OFFSET = -1


def _partition(index: int, offset: Any, error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
    if offset is None:
        return {
            "partition_index": index,
            "committed_offset": INVALID_OFFSET,
            "committed_leader_epoch": -1,
            "metadata": "",
            "error_code": error,
        }
    return {
        "partition_index": index,
        "committed_offset": offset.offset,
        "committed_leader_epoch": offset.leader_epoch,
        "metadata": offset.metadata,
        "error_code": error,
    }


def _stability(topic: str, partition: int, unstable: set[tuple[str, int]]) -> ErrorCode:
    return ErrorCode.unstable_offset_commit if (topic, partition) in unstable else ErrorCode.none


async def _fetch_group(
    ctx: HandlerContext,
    group_id: str,
    topics: Any,
    *,
    require_stable: bool,
    error_on_partitions: bool,
    member_id: str | None = None,
    member_epoch: int = -1,
) -> dict[str, Any]:
    agent = ctx.agent
    wanted = None if topics is None else {t.name: list(t.partition_indexes) for t in topics}
    # Kafka: DESCRIBE on the group, then on each topic (topics one may not describe are
    # left out of "all", and TOPIC_AUTHORIZATION_FAILED when named).
    checked = access.enabled(ctx)
    offsets: dict[tuple[str, int], Any]
    unstable: set[tuple[str, int]]
    if checked and not access.authorize(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        error, offsets, unstable = ErrorCode.group_authorization_failed, {}, set()
    else:
        error, offsets, unstable = await agent.groups.fetch_offsets(
            group_id,
            wanted,
            require_stable=require_stable,
            member_id=member_id,
            member_epoch=member_epoch,
        )
    if error != ErrorCode.none:
        if not error_on_partitions or topics is None:
            return {"group_id": group_id, "error_code": error, "topics": []}
        return {
            "group_id": group_id,
            "error_code": error,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [_partition(p, None, error) for p in t.partition_indexes],
                }
                for t in topics
            ],
        }
    for key in unstable:
        offsets.pop(key, None)
    names = {t for t, _p in offsets} | {t for t, _p in unstable}
    if topics is not None:
        names = {t.name for t in topics}
    describable = (
        access.filter_authorized(
            ctx, Operation.DESCRIBE, ResourceType.TOPIC, names, log=topics is not None
        )
        if checked
        else names
    )
    if topics is None:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in sorted({*offsets, *unstable}):
            if topic not in describable:
                continue
            by_topic.setdefault(topic, []).append(
                _partition(
                    partition,
                    offsets.get((topic, partition)),
                    _stability(topic, partition, unstable),
                )
            )
        answer = [{"name": t, "partitions": parts} for t, parts in by_topic.items()]
    else:
        answer = [
            {
                "name": t.name,
                "partitions": [
                    _partition(p, offsets.get((t.name, p)), _stability(t.name, p, unstable))
                    if t.name in describable
                    else _partition(p, None, ErrorCode.topic_authorization_failed)
                    for p in t.partition_indexes
                ],
            }
            for t in topics
        ]
    return {"group_id": group_id, "error_code": ErrorCode.none, "topics": answer}


@api(API_KEY, 1, 9)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if ctx.api_version >= 8:
        groups = [
            await _fetch_group(
                ctx,
                g.group_id,
                g.topics,
                require_stable=request.require_stable,
                error_on_partitions=False,
                member_id=getattr(g, "member_id", None),
                member_epoch=getattr(g, "member_epoch", -1),
            )
            for g in request.groups
        ]
        return build(response_class(request), {"throttle_time": 0, "groups": groups})
    group = await _fetch_group(
        ctx,
        request.group_id,
        request.topics,
        require_stable=getattr(request, "require_stable", False),
        error_on_partitions=ctx.api_version < 2,
    )
    return build(
        response_class(request),
        {"throttle_time": 0, "error_code": group["error_code"], "topics": group["topics"]},
    )
