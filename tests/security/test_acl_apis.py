"""The ACL APIs' answers, handler by handler: Kafka's errors for a broker without an
authorizer, a principal without the cluster's ALTER or DESCRIBE, and invalid bindings or
filters; DescribeAcls and DeleteAcls filters on stored bindings."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from broker.authorizer import AclAuthorizer
from broker.eventlog import EventLog
from broker.groups.admin import ListedGroup
from broker.handlers import scram_credentials
from broker.handlers.acls import create_acls, delete_acls, describe_acls
from broker.handlers.list_groups import handle as list_groups
from broker.handlers.txn import describe_transactions
from metadata import acls, keys
from metadata.sqlite_kv import SQLiteKV
from tests.e2e.wire import request

ADMIN, ALICE = "User:admin", "User:alice"


@dataclass
class _Agent:
    kv: Any
    authorizer: AclAuthorizer | None
    sub: keys.Subspace = field(default_factory=lambda: keys.cluster_subspace("test"))
    groups: Any = None
    events: EventLog = field(default_factory=lambda: EventLog(logging.getLogger(__name__)))

    async def reload_acls(self, *, if_changed: bool = True) -> None:
        if self.authorizer is not None:
            version, bindings = await self.kv.read(lambda tr: acls.load(tr, self.sub))
            self.authorizer.load(version, bindings)


@dataclass
class _Ctx:
    agent: _Agent
    principal: str = ADMIN
    peer: str = "10.0.0.7:50000"
    client_id: str | None = "tests"
    api_version: int = 3


@pytest.fixture
def agent(tmp_path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    yield _Agent(kv, AclAuthorizer({ADMIN}))
    anyio.run(kv.aclose)


def creation(rtype=2, name="t", pattern=3, principal=ALICE, host="*", op=3, perm=3):
    return {
        "resource_type": rtype,
        "resource_name": name,
        "resource_pattern_type": pattern,
        "principal": principal,
        "host": host,
        "operation": op,
        "permission_type": perm,
    }


def acl_filter(rtype=1, name=None, pattern=1, principal=None, host=None, op=1, perm=1):
    return {
        "resource_type_filter": rtype,
        "resource_name_filter": name,
        "pattern_type_filter": pattern,
        "principal_filter": principal,
        "host_filter": host,
        "operation": op,
        "permission_type": perm,
    }


def create(ctx, *creations):
    return anyio.run(create_acls, request(30, 3, creations=list(creations)), ctx)


def describe(ctx, **wanted):
    return anyio.run(describe_acls, request(29, 3, **acl_filter(**wanted)), ctx)


def delete(ctx, *filters):
    return anyio.run(delete_acls, request(31, 3, filters=list(filters)), ctx)


def test_without_an_authorizer_every_acl_api_is_security_disabled(agent):
    ctx = _Ctx(_Agent(agent.kv, None))
    (result,) = create(ctx, creation()).results
    assert (result.error_code, result.error_message) == (
        ErrorCode.security_disabled,
        "No Authorizer is configured.",
    )
    assert describe(ctx).error_code == ErrorCode.security_disabled
    (deleted,) = delete(ctx, acl_filter()).filter_results
    assert deleted.error_code == ErrorCode.security_disabled
    assert anyio.run(agent.kv.read, lambda tr: acls.list_acls(tr, agent.sub)) == []


def test_managing_acls_needs_alter_and_describing_them_describe_on_the_cluster(agent):
    ctx = _Ctx(agent, principal=ALICE)
    (result,) = create(ctx, creation()).results
    assert result.error_code == ErrorCode.cluster_authorization_failed
    assert describe(ctx).error_code == ErrorCode.cluster_authorization_failed
    (deleted,) = delete(ctx, acl_filter()).filter_results
    assert deleted.error_code == ErrorCode.cluster_authorization_failed
    assert agent.authorizer.stats.denied == {"CLUSTER": 3}
    # Granted ALTER on the cluster (which implies DESCRIBE), alice manages ACLs.
    create(_Ctx(agent), creation(rtype=4, name="kafka-cluster", op=7))
    assert [r.error_code for r in create(ctx, creation()).results] == [ErrorCode.none]
    assert describe(ctx).error_code == ErrorCode.none


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (creation(pattern=2), "Invalid patternType MATCH"),
        (creation(pattern=1), "Invalid patternType ANY"),
        (creation(rtype=1), "Invalid resourceType ANY"),
        (creation(rtype=42), "Invalid resourceType UNKNOWN"),
        (creation(rtype=7), "not supported"),
        (creation(op=1), "Invalid operation ANY"),
        (creation(perm=1), "Invalid permissionType ANY"),
        (creation(name="*", pattern=4), "PREFIXED pattern cannot be the wildcard"),
        (creation(name=""), "empty resource name"),
        (creation(rtype=4, name="other"), "only valid name for the CLUSTER resource"),
        (creation(principal="alice"), "no colon"),
    ],
)
def test_invalid_bindings_are_invalid_request_and_the_valid_ones_still_created(agent, bad, why):
    results = create(_Ctx(agent), bad, creation(name="fine")).results
    assert results[0].error_code == ErrorCode.invalid_request
    assert why in results[0].error_message
    assert results[1].error_code == ErrorCode.none
    stored = anyio.run(agent.kv.read, lambda tr: acls.list_acls(tr, agent.sub))
    assert [a.resource_name for a in stored] == ["fine"]
    assert agent.events.counts["invalid_acl_requests"] == 1  # one line, rate-limited


def test_describe_and_delete_filter_as_kafka(agent):
    ctx = _Ctx(agent)
    create(
        ctx,
        creation(name="orders-", pattern=4),
        creation(name="*"),
        creation(name="orders-eu", op=4, perm=2),
        creation(rtype=3, name="g"),
    )
    matched = describe(ctx, rtype=2, name="orders-eu", pattern=2)
    assert matched.error_code == ErrorCode.none
    assert sorted((r.resource_name, r.pattern_type) for r in matched.resources) == [
        ("*", 3),
        ("orders-", 4),
        ("orders-eu", 3),
    ]
    assert describe(ctx, pattern=0).error_code == ErrorCode.invalid_request
    results = delete(ctx, acl_filter(rtype=3), acl_filter(op=0), acl_filter(perm=2)).filter_results
    assert [r.error_code for r in results] == [
        ErrorCode.none,
        ErrorCode.invalid_request,
        ErrorCode.none,
    ]
    assert [a.resource_name for a in results[0].matching_acls] == ["g"]
    assert [a.resource_name for a in results[2].matching_acls] == ["orders-eu"]
    left = describe(ctx).resources
    assert sorted(r.resource_name for r in left) == ["*", "orders-"]
    # The agent reloaded its authorizer after each change.
    assert agent.authorizer.stats.acls == 2


class _Groups:
    async def list_groups(self) -> list[ListedGroup]:
        return [ListedGroup(g, "consumer", "Stable") for g in ("billing", "orders", "other")]


def test_list_groups_lists_what_the_principal_may_describe(agent):
    agent.groups = _Groups()
    create(_Ctx(agent), creation(rtype=3, name="billing"), creation(rtype=3, name="ord", pattern=4))

    def listed(ctx):
        answer = anyio.run(list_groups, request(16, 5, states_filter=[], types_filter=[]), ctx)
        return sorted(g.group_id for g in answer.groups)

    assert listed(_Ctx(agent, principal=ALICE)) == ["billing", "orders"]
    assert agent.authorizer.stats.denied == {}  # filtering is no denial
    # DESCRIBE on the cluster lists every group.
    create(_Ctx(agent), creation(rtype=4, name="kafka-cluster", op=8))
    assert listed(_Ctx(agent, principal=ALICE)) == ["billing", "orders", "other"]


def test_describe_transactions_needs_describe_on_the_transactional_id(agent):
    create(_Ctx(agent), creation(rtype=5, name="tx-", pattern=4, op=4))  # WRITE on tx-*
    answer = anyio.run(
        describe_transactions,
        request(65, 0, transactional_ids=["tx-mine", "other"]),
        _Ctx(agent, principal=ALICE),
    )
    assert [s.error_code for s in answer.transaction_states] == [
        ErrorCode.transactional_id_not_found,  # WRITE implies DESCRIBE: looked up
        ErrorCode.transactional_id_authorization_failed,
    ]


def test_scram_credential_apis_need_the_clusters_alter_and_describe(agent) -> None:
    """AlterUserScramCredentials needs ALTER on the cluster, its Describe DESCRIBE, as
    in Kafka; a super user passes."""
    upsert = {
        "deletions": [],
        "upsertions": [
            {
                "name": "bob",
                "mechanism": 1,
                "iterations": 8192,
                "salt": b"s",
                "salted_password": b"p" * 32,
            }
        ],
    }
    alice, admin = _Ctx(agent, principal=ALICE, api_version=0), _Ctx(agent, api_version=0)
    refused = anyio.run(scram_credentials.handle_alter, request(51, 0, **upsert), alice)
    assert [r.error_code for r in refused.results] == [ErrorCode.cluster_authorization_failed]
    refused = anyio.run(scram_credentials.handle_describe, request(50, 0, users=None), alice)
    assert refused.error_code == ErrorCode.cluster_authorization_failed
    altered = anyio.run(scram_credentials.handle_alter, request(51, 0, **upsert), admin)
    assert [r.error_code for r in altered.results] == [ErrorCode.none]
    described = anyio.run(scram_credentials.handle_describe, request(50, 0, users=None), admin)
    assert described.error_code == ErrorCode.none
    assert [r.user for r in described.results] == ["bob"]
