"""Authorization as the handlers ask for it: one request's principal and host, the agent's
authorizer, and the denials counted and logged.

Rules:

- With authorization off (`ctx.agent.authorizer` is None) every check allows at the cost
  of one attribute test; nothing else runs.
- A denial the client is told of is counted (stats: "authorization") and logged as one
  line within the connection events' rate limit (broker.eventlog), never per request.
  Checks that only filter what is listed (Metadata of all topics, ListGroups) are not
  denials, as in Kafka (logIfDenied=false).
- The SASL and SCRAM handlers ask `authorize_cluster(ctx, Operation.ALTER)` before
  AlterUserScramCredentials and `authorize_cluster(ctx, Operation.DESCRIBE)` before
  DescribeUserScramCredentials (CLUSTER_AUTHORIZATION_FAILED otherwise), as Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from broker import eventlog
from broker.authorizer import CLUSTER_NAME, SUPPORTED_OPERATIONS
from broker.context import HandlerContext
from metadata.acls import Operation, ResourceType

__all__ = [
    "CLUSTER_NAME",
    "Operation",
    "ResourceType",
    "authorize",
    "authorize_any",
    "authorize_cluster",
    "authorized_operations",
    "cluster_operations",
    "enabled",
    "filter_authorized",
]

T = TypeVar("T")
# Kafka's "authorized operations" value when they were not asked for, or cannot be given.
OPERATIONS_NOT_ASKED = -(2**31)


def client_host(ctx: HandlerContext) -> str:
    """The client's address without its port ("127.0.0.1", "::1")."""
    return ctx.peer.rsplit(":", 1)[0].strip("[]")


def enabled(ctx: HandlerContext) -> bool:
    return ctx.agent.authorizer is not None


def authorize(
    ctx: HandlerContext,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
    *,
    log: bool = True,
) -> bool:
    """Whether the request's principal may do `operation` on the resource."""
    authorizer = ctx.agent.authorizer
    if authorizer is None:
        return True
    host = client_host(ctx)
    if authorizer.authorize(ctx.principal, host, operation, resource_type, name):
        return True
    if log:
        _denied(ctx, host, operation, resource_type.name, name)
    return False


def authorize_cluster(ctx: HandlerContext, operation: Operation, *, log: bool = True) -> bool:
    return authorize(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME, log=log)


def authorize_any(ctx: HandlerContext, operation: Operation, resource_type: ResourceType) -> bool:
    """Whether some resource of the type allows the operation (authorizeByResourceType)."""
    authorizer = ctx.agent.authorizer
    if authorizer is None:
        return True
    return authorizer.authorize_any(ctx.principal, client_host(ctx), operation, resource_type)


def filter_authorized(
    ctx: HandlerContext,
    operation: Operation,
    resource_type: ResourceType,
    names: Iterable[str],
    *,
    log: bool = True,
) -> set[str]:
    """The names (of resources of one type) the request may do `operation` on."""
    if ctx.agent.authorizer is None:
        return set(names)
    return {n for n in names if authorize(ctx, operation, resource_type, n, log=log)}


def authorized_operations(ctx: HandlerContext, resource_type: ResourceType, name: str) -> int:
    """Kafka's bit field of the operations the principal may do on the resource; with
    authorization off, every operation the resource type supports (Kafka without an
    authorizer answers the same)."""
    authorizer = ctx.agent.authorizer
    if authorizer is None:
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            bits |= 1 << int(op)
        return bits
    return authorizer.authorized_operations(ctx.principal, client_host(ctx), resource_type, name)


def cluster_operations(ctx: HandlerContext) -> int:
    """The cluster's authorized operations, as Metadata and DescribeCluster answer them:
    none at all without DESCRIBE on the cluster (Kafka)."""
    if enabled(ctx) and not authorize_cluster(ctx, Operation.DESCRIBE, log=False):
        return 0
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)


def _denied(ctx: HandlerContext, host: str, operation: Operation, kind: str, name: str) -> None:
    authorizer = ctx.agent.authorizer
    assert authorizer is not None
    denied = authorizer.stats.denied
    denied[kind] = denied.get(kind, 0) + 1
    ctx.agent.events.record(
        eventlog.AUTHORIZATION_DENIED,
        "authorization denied: %s from %s may not %s %s %r (client %s)",
        ctx.principal,
        host,
        operation.name,
        kind,
        name,
        ctx.client_id,
    )
