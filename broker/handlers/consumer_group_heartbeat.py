"""ConsumerGroupHeartbeat (v0-v1): the one request of a consumer-protocol (KIP-848) member.

A member joins with epoch 0, heartbeats with its epoch, and leaves with -1 (or -2: a static
member that will come back). The coordinator (`broker.groups.consumer_coordinator`) answers
at once with the member's epoch and, when it changed, its assignment (topic ids with
partitions). v0 members get their id from the coordinator; v1 members make their own.
Errors are Apache Kafka's: GROUP_AUTHORIZATION_FAILED without READ on the group, the
machine's errors (`broker.groups.consumer_machine`), GROUP_ID_NOT_FOUND for a classic
group's id, NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build, ms
from broker.groups.consumer_machine import HeartbeatRequest
from broker.handlers import api, response_class
from broker.handlers.join_group import client_host

API_KEY = 68


def _request(request: Any) -> HeartbeatRequest:
    owned = request.topic_partitions
    return HeartbeatRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=ms(request.rebalance_timeout),
        subscribed_topic_names=(
            None
            if request.subscribed_topic_names is None
            else tuple(request.subscribed_topic_names)
        ),
        # v1 on; v0 has no field for it.
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor,
        topic_partitions=(
            None
            if owned is None
            else tuple(
                (t.topic_id.bytes if t.topic_id is not None else bytes(16), tuple(t.partitions))
                for t in owned
            )
        ),
    )


@api(API_KEY, 0, 1)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "error_code": ErrorCode.group_authorization_failed,
                "member_epoch": 0,
                "heartbeat_interval": 0,
            },
        )
    answer = await ctx.agent.groups.consumer_heartbeat(
        _request(request), ctx.client_id or "", client_host(ctx.peer), ctx.api_version
    )
    assignment = None
    if answer.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": topic_id, "partitions": list(partitions)}
                for topic_id, partitions in answer.assignment
            ]
        }
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": answer.error,
            "error_message": answer.error_message,
            "member_id": answer.member_id,
            "member_epoch": answer.member_epoch,
            "heartbeat_interval": answer.heartbeat_interval_ms,
            "assignment": assignment,
        },
    )
