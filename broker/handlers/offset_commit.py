"""OffsetCommit (v2-v9): commit offsets for a group, checked against its generation.

As Apache Kafka: partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION; if any
partition is left, the group is checked (a classic member's id and generation, or a
simple commit with generation -1 and no member to a group without members) and a group
error is given to every partition of the request; metadata longer than
offset.metadata.max.bytes is OFFSET_METADATA_TOO_LARGE. v2-v4 may set a retention time
for the committed offsets; v9 answers GROUP_ID_NOT_FOUND where v2-v8 answer
ILLEGAL_GENERATION (a generation given for a group that does not exist). For a
consumer-protocol group (KIP-848) the field is the member epoch: the member's current one
is accepted, any other is STALE_MEMBER_EPOCH, and members of such a group must commit
with v9 (UNSUPPORTED_VERSION otherwise).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build, ms
from broker.groups.coordinator import PartitionCommit
from broker.handlers import api, response_class

API_KEY = 8


@api(API_KEY, 2, 9)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    retention = getattr(request, "retention_time", None)
    errors: dict[tuple[str, int], ErrorCode] = {}
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        code = ErrorCode.group_authorization_failed
        errors = {(t.name, p.partition_index): code for t in request.topics for p in t.partitions}
        return _answer(request, errors)
    readable = access.filter_authorized(
        ctx, Operation.READ, ResourceType.TOPIC, {t.name for t in request.topics}
    )
    for t in request.topics:
        if t.name not in readable:
            for p in t.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
    commits = [
        PartitionCommit(
            t.name,
            p.partition_index,
            p.committed_offset,
            getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata,
        )
        for t in request.topics
        if t.name in readable
        for p in t.partitions
    ]
    if commits or not access.enabled(ctx):
        errors.update(await _commit(request, ctx, commits, retention))
    return _answer(request, errors)


async def _commit(
    request: Any, ctx: HandlerContext, commits: list[PartitionCommit], retention: Any
) -> dict[tuple[str, int], ErrorCode]:
    return await ctx.agent.groups.commit_offsets(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id,
        getattr(request, "group_instance_id", None),
        commits,
        resolve_topic=ctx.agent.topic,
        retention_ms=-1 if retention is None else ms(retention),
        api_version=ctx.api_version,
    )


def _answer(request: Any, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    return build(
        response_class(request),
        {
            "throttle_time": 0,
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
