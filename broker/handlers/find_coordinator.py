"""FindCoordinator: the agent that coordinates a group (or a transactional id).

The coordinator is the live agent that rendezvous hashing picks for the key
(`broker.placement`, through `Agent.coordinator_for`), re-read for every answer so that
clients move quickly when an agent's lease runs out. Key type GROUP (0) and TRANSACTION
(1) share that placement. SHARE (2) is answered INVALID_REQUEST, as Apache Kafka does
without a share coordinator; so is any other type. v0-v3 ask for one key; v4+ batch
several.

With zones (`broker.zones`), a key is coordinated in its home zone: a key without one
gets the zone of the client that asks, if the client names a zone with a live agent; a
key it may not describe gets none.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.groups.placement import GROUP, TRANSACTION
from broker.handlers import api, response_class

API_KEY = 10


def _answer(agent: AgentServices, key_type: int, key: str, listener: str) -> dict[str, Any]:
    if key_type not in (GROUP, TRANSACTION):
        return {
            "key": key,
            "error_code": ErrorCode.invalid_request,
            "error_message": f"Coordinator key type {key_type} is not supported",
            "node_id": -1,
            "host": "",
            "port": -1,
        }
    node = agent.coordinator_for(key, key_type)
    endpoint = node.endpoint(listener)
    if endpoint is None:  # the coordinator has no address on the client's listener
        return {
            "key": key,
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": f"The coordinator has no {listener} listener",
            "node_id": -1,
            "host": "",
            "port": -1,
        }
    host, port = endpoint
    return {
        "key": key,
        "error_code": ErrorCode.none,
        "error_message": None,
        "node_id": node.node_id,
        "host": host,
        "port": port,
    }


@api(API_KEY, 0, 6)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    await agent.refresh_live_agents(max_age=0.0)
    key_type = int(getattr(request, "key_type", GROUP))
    keys = request.coordinator_keys if ctx.api_version >= 4 else [request.key]
    refusals = {k: _refusal(ctx, key_type, k) for k in keys}
    if key_type in (GROUP, TRANSACTION):
        allowed = [k for k in keys if refusals[k] is None]
        await agent.claim_homes(key_type, allowed, ctx.client_zone)
        # A coordinator elsewhere is named only once it does not refuse connections.
        named = {agent.coordinator_for(k, key_type) for k in allowed}
        await agent.confirm_peers(named)
    answers = [refusals[k] or _answer(agent, key_type, k, ctx.listener) for k in keys]
    if ctx.api_version >= 4:
        return build(response_class(request), {"throttle_time": 0, "coordinators": answers})
    answers[0]["throttle_time"] = 0
    return build(response_class(request), answers[0])


def _refusal(ctx: HandlerContext, key_type: int, key: str) -> dict[str, Any] | None:
    """Kafka's check: DESCRIBE on the group or transactional id; the answer if refused."""
    if key_type == GROUP:
        resource, code = ResourceType.GROUP, ErrorCode.group_authorization_failed
    elif key_type == TRANSACTION:
        resource, code = (
            ResourceType.TRANSACTIONAL_ID,
            ErrorCode.transactional_id_authorization_failed,
        )
    else:
        return None
    if access.authorize(ctx, Operation.DESCRIBE, resource, key):
        return None
    return {
        "key": key,
        "error_code": code,
        "error_message": None,
        "node_id": -1,
        "host": "",
        "port": -1,
    }
