"""ListGroups (v0-v5): the groups this agent coordinates.

Like Apache Kafka's brokers, each agent lists only its own groups; admin clients ask every
broker and merge. v4 filters by state (case-insensitive), v5 by type ("classic", or
"consumer" for groups of the consumer protocol of KIP-848), and answers each group's type.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 16


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    states = {s.strip().lower() for s in getattr(request, "states_filter", ())}
    types = {t.strip().lower() for t in getattr(request, "types_filter", ())}
    groups = [
        g
        for g in await ctx.agent.groups.list_groups()
        if (not states or g.state.lower() in states) and (not types or g.group_type in types)
    ]
    # Kafka: every group with DESCRIBE on the cluster, else those one may describe.
    if access.enabled(ctx) and not access.authorize_cluster(ctx, Operation.DESCRIBE, log=False):
        describable = access.filter_authorized(
            ctx, Operation.DESCRIBE, ResourceType.GROUP, [g.group_id for g in groups], log=False
        )
        groups = [g for g in groups if g.group_id in describable]
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "groups": [
                {
                    "group_id": g.group_id,
                    "protocol_type": g.protocol_type,
                    "group_state": g.state,
                    "group_type": g.group_type,
                }
                for g in groups
            ],
        },
    )
