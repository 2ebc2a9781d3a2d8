"""DescribeClientQuotas (v0-1): no quota is ever set here (AlterClientQuotas is not
supported), so every valid filter matches nothing. Answered so that `kafka-configs
--describe --entity-type users` (which asks for quotas beside SCRAM credentials) works.

A filter is checked as Kafka checks it: match type EXACT (0) needs a name, DEFAULT (1)
and ANY (2) none; entity types are user, client-id and ip, each once, ip alone; anything
else is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.handlers.errors import error_response
from metadata.acls import Operation

API_KEY = 48
EXACT, DEFAULT, ANY = 0, 1, 2
ENTITY_TYPES = ("user", "client-id", "ip")


def filter_error(components: Any) -> str | None:
    """Why a filter is invalid, or None."""
    seen: set[str] = set()
    for component in components:
        kind = component.entity_type
        if kind not in ENTITY_TYPES:
            return f"Unknown entity type: {kind}"
        if kind in seen:
            return f"Duplicate entity type: {kind}"
        seen.add(kind)
        match_type = int(component.match_type)
        if match_type == EXACT and component.match is None:
            return f"Entity name for {kind} must be given with an exact match"
        if match_type in (DEFAULT, ANY) and component.match is not None:
            return f"Entity name for {kind} must be null with match type {match_type}"
        if match_type not in (EXACT, DEFAULT, ANY):
            return f"Unknown match type {match_type}"
    if "ip" in seen and len(seen) > 1:
        return "Invalid entity filter component combination: ip with user or client-id"
    return None


@api(API_KEY, 0, 1)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    if not access.authorize_cluster(ctx, Operation.DESCRIBE_CONFIGS):
        return error_response(request, ErrorCode.cluster_authorization_failed)
    problem = filter_error(request.components)
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.invalid_request if problem else ErrorCode.none,
            "error_message": problem,
            "entries": None if problem else [],
        },
    )
