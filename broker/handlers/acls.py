"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31), v1-v3 (v0 left Kafka in 4.0).

Describing needs DESCRIBE on the cluster, creating and deleting ALTER (else
CLUSTER_AUTHORIZATION_FAILED). Without --authorizer each answers SECURITY_DISABLED
("No Authorizer is configured."), as Kafka does without an authorizer. A binding Kafka
would refuse is INVALID_REQUEST with Kafka's message: an UNKNOWN or ANY code, MATCH as a
pattern type, PREFIXED "*", an empty name, a CLUSTER not named kafka-cluster, a principal
without its type; DELEGATION_TOKEN and USER resources are refused too (nothing here checks
them). The agent reloads its ACLs at once after a change; the others within 0.5 s.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access, eventlog
from broker.authorizer import CLUSTER_NAME
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from metadata import acls
from metadata.acls import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType

DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
NO_AUTHORIZER = "No Authorizer is configured."
# DescribeAcls says it in other words (Kafka's AclApis).
NO_AUTHORIZER_DESCRIBE = "No Authorizer is configured on the broker"
# Resource types whose bindings take effect here.
SUPPORTED_TYPES = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)


def invalid_binding(acl: AclBinding) -> str | None:
    """Why Kafka refuses to create the binding, or None."""
    if acl.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {acl.resource_type.name}"
    if acl.resource_type not in SUPPORTED_TYPES:
        return f"ACLs on {acl.resource_type.name} resources are not supported by this broker"
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {acl.pattern_type.name}"
    if acl.operation in (Operation.UNKNOWN, Operation.ANY):
        return f"Invalid operation {acl.operation.name}"
    if acl.permission not in (Permission.ALLOW, Permission.DENY):
        return f"Invalid permissionType {acl.permission.name}"
    if not acl.resource_name:
        return "Invalid empty resource name"
    if acl.pattern_type is PatternType.PREFIXED and acl.resource_name == acls.WILDCARD:
        return "A PREFIXED pattern cannot be the wildcard '*' (use LITERAL '*' for every name)"
    if acl.resource_type is ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if ":" not in acl.principal:
        return (
            f"Could not parse principal from `{acl.principal}` (no colon is present"
            " separating the principal type from the principal name)"
        )
    return None


def _refused(ctx: HandlerContext, api: str, why: str) -> None:
    ctx.agent.events.record(
        eventlog.INVALID_ACL_REQUEST,
        "%s from %s (%s) refused: %s",
        api,
        ctx.peer,
        ctx.principal,
        why,
    )


def _filter(entry: Any) -> AclFilter:
    return AclFilter.of(
        entry.resource_type_filter,
        entry.resource_name_filter,
        entry.pattern_type_filter,
        entry.principal_filter,
        entry.host_filter,
        entry.operation,
        entry.permission_type,
    )


@api(DESCRIBE_ACLS, 1, 3)
async def describe_acls(request: Any, ctx: HandlerContext) -> Any:
    def answer(code: ErrorCode, message: str | None, found: list[AclBinding]) -> Any:
        by_pattern: dict[tuple[int, str, int], list[AclBinding]] = {}
        for acl in sorted(found):
            by_pattern.setdefault(
                (acl.resource_type, acl.resource_name, acl.pattern_type), []
            ).append(acl)
        resources = [
            {
                "resource_type": rtype,
                "resource_name": name,
                "pattern_type": ptype,
                "acls": [
                    {
                        "principal": a.principal,
                        "host": a.host,
                        "operation": a.operation,
                        "permission_type": a.permission,
                    }
                    for a in bound
                ],
            }
            for (rtype, name, ptype), bound in by_pattern.items()
        ]
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "error_code": code,
                "error_message": message,
                "resources": resources,
            },
        )

    if not access.authorize_cluster(ctx, Operation.DESCRIBE):
        return answer(ErrorCode.cluster_authorization_failed, None, [])
    if not access.enabled(ctx):
        return answer(ErrorCode.security_disabled, NO_AUTHORIZER_DESCRIBE, [])
    wanted = _filter(request)
    unknown = wanted.unknown()
    if unknown is not None:
        _refused(ctx, "DescribeAcls", unknown)
        return answer(ErrorCode.invalid_request, unknown, [])
    agent = ctx.agent
    found = await agent.kv.read(lambda tr: acls.list_acls(tr, agent.sub))
    return answer(ErrorCode.none, None, [a for a in found if wanted.matches(a)])


@api(CREATE_ACLS, 1, 3)
async def create_acls(request: Any, ctx: HandlerContext) -> Any:
    def answer(results: list[tuple[ErrorCode, str | None]]) -> Any:
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "results": [
                    {"error_code": code, "error_message": message} for code, message in results
                ],
            },
        )

    creations = request.creations
    if not access.authorize_cluster(ctx, Operation.ALTER):
        return answer([(ErrorCode.cluster_authorization_failed, None)] * len(creations))
    if not access.enabled(ctx):
        return answer([(ErrorCode.security_disabled, NO_AUTHORIZER)] * len(creations))
    bindings = [
        AclBinding.of(
            c.resource_type,
            c.resource_name,
            c.resource_pattern_type,
            c.principal,
            c.host,
            c.operation,
            c.permission_type,
        )
        for c in creations
    ]
    problems = [invalid_binding(b) for b in bindings]
    for problem in problems:
        if problem is not None:
            _refused(ctx, "CreateAcls", problem)
    valid = [b for b, problem in zip(bindings, problems, strict=True) if problem is None]
    if valid:
        agent = ctx.agent
        await agent.kv.transact(lambda tr: acls.create_acls(tr, agent.sub, valid))
        await agent.reload_acls()
    return answer(
        [
            (ErrorCode.none, None) if problem is None else (ErrorCode.invalid_request, problem)
            for problem in problems
        ]
    )


@api(DELETE_ACLS, 1, 3)
async def delete_acls(request: Any, ctx: HandlerContext) -> Any:
    def answer(results: list[tuple[ErrorCode, str | None, list[AclBinding]]]) -> Any:
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "filter_results": [
                    {
                        "error_code": code,
                        "error_message": message,
                        "matching_acls": [
                            {
                                "error_code": ErrorCode.none,
                                "error_message": None,
                                "resource_type": a.resource_type,
                                "resource_name": a.resource_name,
                                "pattern_type": a.pattern_type,
                                "principal": a.principal,
                                "host": a.host,
                                "operation": a.operation,
                                "permission_type": a.permission,
                            }
                            for a in matched
                        ],
                    }
                    for code, message, matched in results
                ],
            },
        )

    filters = [_filter(f) for f in request.filters]
    if not access.authorize_cluster(ctx, Operation.ALTER):
        return answer([(ErrorCode.cluster_authorization_failed, None, [])] * len(filters))
    if not access.enabled(ctx):
        return answer([(ErrorCode.security_disabled, NO_AUTHORIZER, [])] * len(filters))
    problems = [f.unknown() for f in filters]
    for problem in problems:
        if problem is not None:
            _refused(ctx, "DeleteAcls", problem)
    valid = [f for f, problem in zip(filters, problems, strict=True) if problem is None]
    agent = ctx.agent
    matched = iter(await agent.kv.transact(lambda tr: acls.delete_acls(tr, agent.sub, valid)))
    await agent.reload_acls()
    return answer(
        [
            (ErrorCode.none, None, sorted(next(matched)))
            if problem is None
            else (ErrorCode.invalid_request, problem, [])
            for problem in problems
        ]
    )
