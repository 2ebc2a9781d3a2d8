"""ConsumerGroupDescribe (v0-v1): consumer-protocol (KIP-848) groups this agent coordinates.

Each group: its state, group and assignment epochs, the assignor, and every member with
its subscription, current and target assignments. A group id that does not exist, or that
a classic group has, is GROUP_ID_NOT_FOUND (Apache Kafka's messages); a group this agent
does not coordinate is NOT_COORDINATOR.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.groups import consumer as values
from broker.handlers import api, response_class
from broker.handlers.describe_groups import GROUP_OPERATIONS

API_KEY = 69


@api(API_KEY, 0, 1)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    version = ctx.api_version
    described = []
    for group_id in request.group_ids:
        if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(
                values.describe_error(group_id, ErrorCode.group_authorization_failed, version)
            )
            continue
        group = await ctx.agent.groups.consumer_describe(group_id, version)
        if request.include_authorized_operations and group.error_code == ErrorCode.none:
            operations = GROUP_OPERATIONS
            if access.enabled(ctx):
                operations = access.authorized_operations(ctx, ResourceType.GROUP, group_id)
            group = dataclasses.replace(group, authorized_operations=i32(operations))
        described.append(group)
    return response_class(request)(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)), groups=tuple(described)
    )
