"""SyncGroup (v0-v5): the leader hands in the assignment; every member gets its own.

From v5 the client must name the protocol type and name (KIP-559); a request without
them, or with others than the group's, is INCONSISTENT_GROUP_PROTOCOL.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.groups.classic import SyncResult
from broker.groups.coordinator import SyncRequest
from broker.handlers import api, response_class
from broker.handlers.errors import error_response

API_KEY = 14


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return error_response(request, ErrorCode.group_authorization_failed)
    protocol_type = getattr(request, "protocol_type", None)
    protocol_name = getattr(request, "protocol_name", None)
    if ctx.api_version >= 5 and (protocol_type is None or protocol_name is None):
        result = SyncResult(ErrorCode.inconsistent_group_protocol)
    else:
        result = await ctx.agent.groups.sync(
            SyncRequest(
                group_id=request.group_id,
                generation=request.generation_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
            )
        )
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": result.error,
            "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name,
            "assignment": result.assignment,
        },
    )
