"""DeleteGroups (v0-v2): delete empty groups with their committed offsets.

A group with members is NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND, one another
agent coordinates NOT_COORDINATOR.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 42


@api(API_KEY, 0, 2)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    results = []
    for group_id in dict.fromkeys(request.groups_names):
        if not access.authorize(ctx, Operation.DELETE, ResourceType.GROUP, group_id):
            results.append(
                {"group_id": group_id, "error_code": ErrorCode.group_authorization_failed}
            )
            continue
        error = await ctx.agent.groups.delete_group(group_id)
        results.append({"group_id": group_id, "error_code": error})
    return build(response_class(request), {"throttle_time": 0, "results": results})
