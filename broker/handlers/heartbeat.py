"""Heartbeat (v0-v4): keeps a member's session; tells it when the group rebalances."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.handlers.errors import error_response

API_KEY = 12


@api(API_KEY, 0, 4)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return error_response(request, ErrorCode.group_authorization_failed)
    error = await ctx.agent.groups.heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
    )
    return build(response_class(request), {"throttle_time": 0, "error_code": error})
