"""DescribeUserScramCredentials (v0) and AlterUserScramCredentials (v0): the users' SCRAM
credentials in the metadata store (metadata/scram.py), with Kafka's checks and errors.

Alter takes what the client computed, the salt and the salted password, and keeps only
the stored key and server key. A user named twice in one request is refused with
DUPLICATE_RESOURCE, an unknown mechanism with UNSUPPORTED_SASL_MECHANISM, an empty user
name or iterations outside 4096..16384 with UNACCEPTABLE_CREDENTIAL, the deletion of a
credential that does not exist with RESOURCE_NOT_FOUND (ScramControlManager's rules).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.handlers.errors import error_response
from broker.sasl import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_TYPES, credential_from_salted
from metadata import scram
from metadata.acls import Operation
from metadata.scram import ScramCredential

DESCRIBE_KEY = 50
ALTER_KEY = 51
_TWICE = "A user credential cannot be altered twice in the same request"


def _name_and_mechanism_error(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in SCRAM_TYPES:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


@api(DESCRIBE_KEY, 0, 0)
async def handle_describe(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    if not access.authorize_cluster(ctx, Operation.DESCRIBE):
        return error_response(request, ErrorCode.cluster_authorization_failed)
    names = None if not request.users else [user.name for user in request.users]
    found = await agent.kv.read(lambda tr: scram.describe(tr, agent.sub, names))
    results = []
    if names is None:
        wanted = sorted(found)
    else:
        wanted = list(dict.fromkeys(names))
    for name in wanted:
        if names is not None and names.count(name) > 1:
            code, message = (
                ErrorCode.duplicate_resource,
                "Cannot describe SCRAM credentials for the same user twice in a single request",
            )
        elif name not in found:
            code, message = (
                ErrorCode.resource_not_found,
                "Attempt to describe a user credential that does not exist",
            )
        else:
            code, message = ErrorCode.none, None
        results.append(
            {
                "user": name,
                "error_code": code,
                "error_message": message,
                "credential_infos": [
                    {"mechanism": mechanism, "iterations": iterations}
                    for mechanism, iterations in sorted(found.get(name, ()))
                ]
                if code == ErrorCode.none
                else [],
            }
        )
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "results": results,
        },
    )


@api(ALTER_KEY, 0, 0)
async def handle_alter(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    if not access.authorize_cluster(ctx, Operation.ALTER):
        users = dict.fromkeys(
            [d.name for d in request.deletions] + [u.name for u in request.upsertions]
        )
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "results": [
                    {
                        "user": name,
                        "error_code": ErrorCode.cluster_authorization_failed,
                        "error_message": None,
                    }
                    for name in users
                ],
            },
        )
    errors: dict[str, tuple[ErrorCode, str]] = {}
    deletions: dict[str, tuple[str, int]] = {}
    upsertions: dict[str, tuple[str, int, ScramCredential]] = {}
    for deletion in request.deletions:
        name, mechanism = deletion.name, int(deletion.mechanism)
        if name in errors:
            continue
        if deletions.pop(name, None) is not None:
            errors[name] = (ErrorCode.duplicate_resource, _TWICE)
            continue
        problem = _name_and_mechanism_error(name, mechanism)
        if problem is not None:
            errors[name] = problem
        else:
            deletions[name] = (name, mechanism)
    for upsertion in request.upsertions:
        name, mechanism = upsertion.name, int(upsertion.mechanism)
        if name in errors:
            continue
        if deletions.pop(name, None) is not None or upsertions.pop(name, None) is not None:
            errors[name] = (ErrorCode.duplicate_resource, _TWICE)
            continue
        problem = _name_and_mechanism_error(name, mechanism)
        iterations = int(upsertion.iterations)
        if problem is None and iterations < MIN_ITERATIONS:
            problem = ErrorCode.unacceptable_credential, "Too few iterations"
        elif problem is None and iterations > MAX_ITERATIONS:
            problem = ErrorCode.unacceptable_credential, "Too many iterations"
        elif problem is None and (not upsertion.salt or not upsertion.salted_password):
            problem = ErrorCode.unacceptable_credential, "Salt and salted password must be given"
        if problem is not None:
            errors[name] = problem
            continue
        credential = credential_from_salted(
            SCRAM_TYPES[mechanism], upsertion.salted_password, upsertion.salt, iterations
        )
        upsertions[name] = (name, mechanism, credential)
    outcome = await agent.kv.transact(
        lambda tr: scram.alter(tr, agent.sub, deletions.values(), upsertions.values())
    )
    results = []
    for name, failure in outcome.items():
        if failure is None:
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None})
        else:
            errors[name] = (failure.error_code, failure.message)
    for name, (code, message) in errors.items():
        results.append({"user": name, "error_code": code, "error_message": message})
    return build(response_class(request), {"throttle_time": 0, "results": results})
