"""ACL bindings in the metadata store, on every KV backend: create, list, filter, delete,
and the version every agent polls."""

from __future__ import annotations

import pytest

from metadata import acls, keys
from metadata.acls import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType

SUB = keys.cluster_subspace("test")
R, P, Op, A = ResourceType, PatternType, Operation, Permission

READ_ORDERS = AclBinding(R.TOPIC, "orders-", P.PREFIXED, "User:alice", "*", Op.READ, A.ALLOW)
READ_ALL = AclBinding(R.TOPIC, "*", P.LITERAL, "User:bob", "*", Op.READ, A.ALLOW)
DENY_SECRET = AclBinding(R.TOPIC, "orders-secret", P.LITERAL, "User:*", "*", Op.ALL, A.DENY)
GROUP_READ = AclBinding(R.GROUP, "billing", P.LITERAL, "User:alice", "10.0.0.1", Op.READ, A.ALLOW)
ALL = [READ_ORDERS, READ_ALL, DENY_SECRET, GROUP_READ]


def filt(rtype=R.ANY, name=None, pattern=P.ANY, principal=None, host=None, op=Op.ANY, perm=A.ANY):
    return AclFilter(rtype, name, pattern, principal, host, op, perm)


def test_create_is_idempotent_and_bumps_the_version(kv):
    assert kv.transact_sync(lambda tr: acls.version(tr, SUB)) == 0
    assert kv.transact_sync(lambda tr: acls.create_acls(tr, SUB, ALL)) == 4
    v1, stored = kv.transact_sync(lambda tr: acls.load(tr, SUB))
    assert v1 > 0 and sorted(stored) == sorted(ALL)
    # The same bindings again: nothing new, the version stays.
    assert kv.transact_sync(lambda tr: acls.create_acls(tr, SUB, [READ_ALL])) == 0
    assert kv.transact_sync(lambda tr: acls.version(tr, SUB)) == v1


def test_delete_by_filter_reports_matches_per_filter(kv):
    kv.transact_sync(lambda tr: acls.create_acls(tr, SUB, ALL))
    v1 = kv.transact_sync(lambda tr: acls.version(tr, SUB))
    matched = kv.transact_sync(
        lambda tr: acls.delete_acls(
            tr, SUB, [filt(R.GROUP), filt(principal="User:alice"), filt(name="nothing")]
        )
    )
    assert matched[0] == [GROUP_READ]
    assert sorted(matched[1]) == sorted([READ_ORDERS, GROUP_READ])
    assert matched[2] == []
    v2, left = kv.transact_sync(lambda tr: acls.load(tr, SUB))
    assert v2 != v1 and sorted(left) == sorted([READ_ALL, DENY_SECRET])
    # A delete that matches nothing leaves the version.
    kv.transact_sync(lambda tr: acls.delete_acls(tr, SUB, [filt(name="nothing")]))
    assert kv.transact_sync(lambda tr: acls.version(tr, SUB)) == v2


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        (filt(), ALL),
        (filt(R.TOPIC, pattern=P.LITERAL), [READ_ALL, DENY_SECRET]),
        (filt(R.TOPIC, "orders-", P.LITERAL), []),
        (filt(R.TOPIC, "orders-", P.ANY), [READ_ORDERS]),
        (filt(R.TOPIC, "orders-", P.PREFIXED), [READ_ORDERS]),
        # MATCH: every pattern that applies to the name: prefix, wildcard, literal.
        (filt(R.TOPIC, "orders-secret", P.MATCH), [READ_ORDERS, READ_ALL, DENY_SECRET]),
        (filt(R.TOPIC, "other", P.MATCH), [READ_ALL]),
        (filt(host="10.0.0.1"), [GROUP_READ]),
        (filt(op=Op.ALL), [DENY_SECRET]),
        (filt(perm=A.DENY), [DENY_SECRET]),
        (filt(principal="User:*"), [DENY_SECRET]),
    ],
)
def test_filters_match_as_kafka(kv, wanted, expected):
    kv.transact_sync(lambda tr: acls.create_acls(tr, SUB, ALL))
    stored = kv.transact_sync(lambda tr: acls.list_acls(tr, SUB))
    assert sorted(a for a in stored if wanted.matches(a)) == sorted(expected)


def test_unknown_codes_read_as_unknown():
    binding = AclBinding.of(99, "t", 99, "User:a", "*", 99, 99)
    assert (binding.resource_type, binding.pattern_type) == (R.UNKNOWN, P.UNKNOWN)
    assert AclFilter.of(2, None, 3, None, None, 99, 1).unknown() == "Unknown entryFilter."
    assert AclFilter.of(0, None, 3, None, None, 1, 1).unknown() == "Unknown patternFilter."
