"""The authorizer's decisions, with Kafka's semantics, for many principals and hosts."""

from __future__ import annotations

import pytest

from broker.authorizer import CLUSTER_NAME, AclAuthorizer, parse_super_users
from metadata.acls import AclBinding, Operation, PatternType, Permission, ResourceType

TOPIC, GROUP, CLUSTER, TXN = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(rtype, name, op, perm=ALLOW, *, pattern=LITERAL, principal=ALICE, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def authorizer(*bindings, **kwargs) -> AclAuthorizer:
    a = AclAuthorizer(**kwargs)
    a.load(1, bindings)
    return a


def test_no_acl_refuses_unless_allow_everyone():
    assert not authorizer().authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize(
        ALICE, HOST, Op.READ, TOPIC, "t"
    )
    # Any binding on the resource, even another principal's, ends "no ACL found".
    other = authorizer(acl(TOPIC, "t", Op.READ, principal=BOB), allow_everyone_if_no_acl_found=True)
    assert not other.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    assert other.authorize(ALICE, HOST, Op.READ, TOPIC, "u")


@pytest.mark.parametrize(
    ("granted", "asked", "allowed"),
    [
        (Op.READ, Op.READ, True),
        (Op.READ, Op.WRITE, False),
        (Op.READ, Op.DESCRIBE, True),
        (Op.WRITE, Op.DESCRIBE, True),
        (Op.DELETE, Op.DESCRIBE, True),
        (Op.ALTER, Op.DESCRIBE, True),
        (Op.CREATE, Op.DESCRIBE, False),
        (Op.DESCRIBE, Op.READ, False),
        (Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, True),
        (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, False),
        (Op.ALTER, Op.ALTER_CONFIGS, False),
        (Op.ALL, Op.DELETE, True),
        (Op.ALL, Op.DESCRIBE_CONFIGS, True),
    ],
)
def test_implications(granted, asked, allowed):
    assert authorizer(acl(TOPIC, "t", granted)).authorize(ALICE, HOST, asked, TOPIC, "t") is allowed


def test_a_deny_implies_nothing_but_deny_all_denies_everything():
    # DENY READ does not deny DESCRIBE, which the ALLOW WRITE implies.
    a = authorizer(acl(TOPIC, "t", Op.WRITE), acl(TOPIC, "t", Op.READ, DENY))
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    b = authorizer(acl(TOPIC, "t", Op.ALL), acl(TOPIC, "t", Op.ALL, DENY))
    assert not b.authorize(ALICE, HOST, Op.DESCRIBE, TOPIC, "t")


def test_deny_wins_from_any_pattern():
    a = authorizer(
        acl(TOPIC, "*", Op.READ),
        acl(TOPIC, "orders-", Op.READ, pattern=PREFIXED),
        acl(TOPIC, "orders-secret", Op.READ, DENY),
        acl(TOPIC, "orders-x", Op.READ, DENY, pattern=PREFIXED, principal="User:*"),
    )
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-1")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-secret")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-x1")
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "anything")


def test_prefixed_and_literal_patterns():
    a = authorizer(acl(TOPIC, "orders-", Op.READ, pattern=PREFIXED), acl(GROUP, "billing", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-eu")
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders-")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "orders")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "xorders-eu")
    assert a.authorize(ALICE, HOST, Op.READ, GROUP, "billing")
    assert not a.authorize(ALICE, HOST, Op.READ, GROUP, "billing-2")  # literal: exact
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "billing")  # other resource type
    # A PREFIXED "*" names the topics starting with "*", not every topic.
    star = authorizer(acl(TOPIC, "*", Op.READ, pattern=PREFIXED))
    assert not star.authorize(ALICE, HOST, Op.READ, TOPIC, "t")


def test_principal_and_host_wildcards():
    a = authorizer(
        acl(TOPIC, "t", Op.READ, principal="User:*"),
        acl(TOPIC, "u", Op.READ, host="10.0.0.2"),
    )
    assert a.authorize(BOB, HOST, Op.READ, TOPIC, "t")
    assert a.authorize(ALICE, "10.0.0.2", Op.READ, TOPIC, "u")
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "u")
    assert not a.authorize(BOB, "10.0.0.2", Op.READ, TOPIC, "u")


def test_super_users_pass_every_check_even_a_deny():
    users = parse_super_users("User:admin; User:ops")
    assert users == {"User:admin", "User:ops"}
    a = authorizer(acl(TOPIC, "t", Op.ALL, DENY, principal="User:*"), super_users=users)
    assert a.authorize("User:ops", HOST, Op.DELETE, TOPIC, "t")
    assert a.authorize("User:admin", HOST, Op.ALTER, CLUSTER, CLUSTER_NAME)
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    with pytest.raises(ValueError):
        parse_super_users("admin")


def test_reload_drops_cached_decisions():
    a = authorizer(acl(TOPIC, "t", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    a.load(2, [acl(TOPIC, "t", Op.READ, DENY)])
    assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
    assert (a.version, a.stats.acls, a.stats.reloads) == (2, 1, 2)


def test_authorize_any_as_idempotent_write_fallback():
    # Kafka's authorizeByResourceType: WRITE on some topic, not covered by a DENY.
    assert authorizer(acl(TOPIC, "t", Op.WRITE)).authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    assert not authorizer(acl(TOPIC, "t", Op.READ)).authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    covered = authorizer(
        acl(TOPIC, "logs-a", Op.WRITE), acl(TOPIC, "logs-", Op.WRITE, DENY, pattern=PREFIXED)
    )
    assert not covered.authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    same = authorizer(acl(TOPIC, "t", Op.WRITE), acl(TOPIC, "t", Op.WRITE, DENY))
    assert not same.authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    wild = authorizer(acl(TOPIC, "*", Op.WRITE), acl(TOPIC, "t", Op.WRITE, DENY))
    assert wild.authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    wild_deny = authorizer(acl(TOPIC, "a", Op.WRITE), acl(TOPIC, "*", Op.ALL, DENY))
    assert not wild_deny.authorize_any(ALICE, HOST, Op.WRITE, TOPIC)
    assert authorizer(acl(TOPIC, "t", Op.WRITE), super_users={BOB}).authorize_any(
        BOB, HOST, Op.WRITE, TOPIC
    )
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize_any(
        ALICE, HOST, Op.WRITE, TOPIC
    )


def test_authorized_operations_bit_field():
    a = authorizer(acl(GROUP, "g", Op.READ))
    bits = a.authorized_operations(ALICE, HOST, GROUP, "g")
    assert bits == (1 << Op.READ) | (1 << Op.DESCRIBE)
