"""LeaveGroup (v0-v5): one member leaves (v0-v2), or several at once (v3+, by member id
and/or group.instance.id, the latter for an admin removing static members).

v0-v2 have no per-member answers: the first member error becomes the top-level error.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.handlers.errors import error_response

API_KEY = 13


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return error_response(request, ErrorCode.group_authorization_failed)
    if ctx.api_version < 3:
        members = [(request.member_id, None)]
    else:
        members = [(m.member_id, m.group_instance_id) for m in request.members]
    error, answers = await ctx.agent.groups.leave(request.group_id, members)
    if ctx.api_version < 3 and error == ErrorCode.none:
        error = next((e for _m, _i, e in answers if e != ErrorCode.none), ErrorCode.none)
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": error,
            "members": [
                {"member_id": m, "group_instance_id": i, "error_code": e} for m, i, e in answers
            ],
        },
    )
