"""DescribeGroups (v0-v5): state, protocol and members of groups this agent coordinates.

A group that does not exist is described as Dead, without error. Member metadata is
given only while the group is Stable (then the protocol too); assignments always.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class

API_KEY = 15
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: every group operation (no ACLs).
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    include_ops = getattr(request, "include_authorized_operations", False)
    described = []
    for group_id in request.groups:
        if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(
                {
                    "error_code": ErrorCode.group_authorization_failed,
                    "group_id": group_id,
                    "group_state": "",
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                }
            )
            continue
        d = await ctx.agent.groups.describe(group_id)
        operations = GROUP_OPERATIONS
        if access.enabled(ctx):
            operations = access.authorized_operations(ctx, ResourceType.GROUP, group_id)
        described.append(
            {
                "error_code": d.error,
                "group_id": d.group_id,
                "group_state": d.state,
                "protocol_type": d.protocol_type,
                "protocol_data": d.protocol_data,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": m.metadata,
                        "member_assignment": m.assignment,
                    }
                    for m in d.members
                ],
                "authorized_operations": operations
                if include_ops and d.error == ErrorCode.none
                else AUTHORIZED_OPERATIONS_OMITTED,
            }
        )
    return build(response_class(request), {"throttle_time": 0, "groups": described})
