"""ACL bindings: who may do what on which resources, as Kafka's CreateAcls stores them.

Rules:

- A binding is a resource pattern (type, name, LITERAL or PREFIXED) and an entry
  (principal, host, operation, ALLOW or DENY), with Kafka's numeric codes. The key holds
  the whole binding, so creating one that exists changes nothing, as in Kafka.
- Every write that changes the bindings adds one to (CLUSTER, "acl_version"), so an agent
  learns of a change from one point read and reloads the bindings only then.
- A filter (DescribeAcls, DeleteAcls) matches with Kafka's semantics: ANY matches every
  value, a null name / principal / host every one, and the MATCH pattern type the literal
  and prefixed patterns that would apply to the name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from metadata import keys
from metadata.kv import ReadTransaction, Transaction, decode_i64

VERSION_KEY = "acl_version"
# Kafka's wildcard resource name (a LITERAL pattern), principal and host.
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def _enum(kind: type[IntEnum], code: int) -> IntEnum:
    """A code as its enum; a code Kafka does not know is UNKNOWN, as Kafka's fromCode."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission: int,
    ) -> AclBinding:
        return cls(
            ResourceType(_enum(ResourceType, resource_type)),
            resource_name,
            PatternType(_enum(PatternType, pattern_type)),
            principal,
            host,
            Operation(_enum(Operation, operation)),
            Permission(_enum(Permission, permission)),
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission: int,
    ) -> AclFilter:
        return cls(
            ResourceType(_enum(ResourceType, resource_type)),
            resource_name,
            PatternType(_enum(PatternType, pattern_type)),
            principal,
            host,
            Operation(_enum(Operation, operation)),
            Permission(_enum(Permission, permission)),
        )

    def unknown(self) -> str | None:
        """What of the filter Kafka cannot read (an UNKNOWN code), or None."""
        if self.resource_type is ResourceType.UNKNOWN or self.pattern_type is PatternType.UNKNOWN:
            return "Unknown patternFilter."
        if self.operation is Operation.UNKNOWN or self.permission is Permission.UNKNOWN:
            return "Unknown entryFilter."
        return None

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation is not Operation.ANY and self.operation != acl.operation:
            return False
        if self.permission is not Permission.ANY and self.permission != acl.permission:
            return False
        return self._matches_pattern(acl)

    def _matches_pattern(self, acl: AclBinding) -> bool:
        kind = self.pattern_type
        if kind not in (PatternType.ANY, PatternType.MATCH) and kind != acl.pattern_type:
            return False
        if self.resource_name is None:
            return True
        if kind is not PatternType.MATCH:
            return self.resource_name == acl.resource_name
        # MATCH: the patterns that apply to this name.
        if acl.pattern_type is PatternType.LITERAL:
            return acl.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(acl.resource_name)


def _key(sub: keys.Subspace, acl: AclBinding) -> bytes:
    return sub.key(
        keys.ACL,
        int(acl.resource_type),
        int(acl.pattern_type),
        acl.resource_name,
        acl.principal,
        acl.host,
        int(acl.operation),
        int(acl.permission),
    )


def version(tr: ReadTransaction, sub: keys.Subspace) -> int:
    """The ACL version: it changes with every write that changes the bindings."""
    return decode_i64(tr.get(sub.key(keys.CLUSTER, VERSION_KEY)))


def list_acls(tr: ReadTransaction, sub: keys.Subspace) -> list[AclBinding]:
    acls = []
    for key, _value in tr.get_range(*sub.range(keys.ACL)):
        _tag, rtype, ptype, name, principal, host, op, perm = sub.unpack(key)
        acls.append(AclBinding.of(rtype, name, ptype, principal, host, op, perm))
    return acls


def load(tr: ReadTransaction, sub: keys.Subspace) -> tuple[int, list[AclBinding]]:
    """The version and the bindings it names, read together."""
    return version(tr, sub), list_acls(tr, sub)


def create_acls(tr: Transaction, sub: keys.Subspace, acls: Iterable[AclBinding]) -> int:
    """Store the bindings; returns how many were new."""
    created = 0
    for acl in acls:
        key = _key(sub, acl)
        if tr.get(key) is None:
            tr.set(key, b"")
            created += 1
    if created:
        tr.add(sub.key(keys.CLUSTER, VERSION_KEY), 1)
    return created


def delete_acls(
    tr: Transaction, sub: keys.Subspace, filters: Iterable[AclFilter]
) -> list[list[AclBinding]]:
    """Delete every binding some filter matches; per filter, the bindings it matched."""
    existing = list_acls(tr, sub)
    matched = [[acl for acl in existing if f.matches(acl)] for f in filters]
    gone = {acl for acls in matched for acl in acls}
    for acl in gone:
        tr.clear(_key(sub, acl))
    if gone:
        tr.add(sub.key(keys.CLUSTER, VERSION_KEY), 1)
    return matched
