"""JoinGroup (v0-v9): join or rejoin a classic group; parked until the rebalance completes.

v0 has no rebalance timeout (the session timeout serves as one); v4+ hand a new member
its id with MEMBER_ID_REQUIRED first; v5+ carry group.instance.id (static membership);
v9 may tell a rejoining static leader to skip the assignment.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build, ms
from broker.groups.coordinator import JoinRequest
from broker.handlers import api, response_class
from broker.handlers.errors import error_response

API_KEY = 11


def client_host(peer: str) -> str:
    """The client's address as Apache Kafka shows it (InetAddress.toString: "/host")."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host.strip("[]")


@api(API_KEY, 0, 9)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return error_response(request, ErrorCode.group_authorization_failed)
    version = ctx.api_version
    session_ms = ms(request.session_timeout)
    rebalance_ms = ms(request.rebalance_timeout) if version >= 1 else session_ms
    if rebalance_ms < 0:
        rebalance_ms = session_ms
    result = await ctx.agent.groups.join(
        JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            client_id=ctx.client_id or "",
            client_host=client_host(ctx.peer),
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            require_known_member_id=version >= 4,
            supports_skip_assignment=version >= 9,
            reason=getattr(request, "reason", None),
        )
    )
    protocol_name = result.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # nullable only from v7
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": result.error,
            "generation_id": result.generation,
            "protocol_type": result.protocol_type,
            "protocol_name": protocol_name,
            "leader": result.leader,
            "skip_assignment": result.skip_assignment,
            "member_id": result.member_id,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "metadata": m.metadata,
                }
                for m in result.members
            ],
        },
    )
