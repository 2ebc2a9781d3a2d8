"""The ACL authorizer: whether a principal, from a host, may do an operation on a resource.

Pure decision logic over the bindings it was last given (no I/O), with Apache Kafka's
semantics (its AclAuthorizer and StandardAuthorizer):

- A super user (`super.users`) may do everything.
- The bindings that apply to a resource are the LITERAL ones of its name, the LITERAL ones
  of the wildcard name "*", and the PREFIXED ones whose name starts the resource's. With
  none at all (whoever they name), `allow.everyone.if.no.acl.found` decides.
- A binding applies to a request when its principal is the request's or "User:*", and its
  host the client's address or "*".
- DENY wins: a DENY for the operation (or ALL) refuses, whatever ALLOWs there are.
- An ALLOW for the operation or ALL allows; DESCRIBE is also allowed by READ, WRITE,
  DELETE and ALTER, DESCRIBE_CONFIGS by ALTER_CONFIGS. A DENY implies nothing.
- `authorize_any` is Kafka's authorizeByResourceType: whether some resource of the type
  may be operated on (InitProducerId without a transactional id: WRITE on any topic).

Decisions are cached per (principal, host, operation, resource) and dropped when new
bindings are loaded (`load`), which the agent does when the store's ACL version changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from metadata.acls import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

CLUSTER_NAME = "kafka-cluster"  # Kafka's name of the one CLUSTER resource
# The operations an ALLOW of each implies, besides itself (Kafka's AclEntry).
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}
# The cache is dropped whole when it reaches this many decisions: a client naming endless
# new topics cannot grow it without bound.
CACHE_LIMIT = 100_000
# What each resource type supports, for the "authorized operations" fields (Kafka's
# AclEntry.supportedOperations).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka's `super.users`: principals separated by ';' ("User:admin;User:ops")."""
    users = frozenset(p.strip() for p in value.split(";") if p.strip())
    for user in users:
        if ":" not in user:
            raise ValueError(
                f"super user {user!r} is not a principal of the form Type:name (User:alice)"
            )
    return users


@dataclass(slots=True)
class AuthorizerStats:
    acls: int = 0  # bindings loaded
    version: int = -1  # the store's ACL version they came with
    reloads: int = 0
    denied: dict[str, int] = field(default_factory=dict)  # by resource type, as logged


class AclAuthorizer:
    def __init__(
        self, super_users: Iterable[str] = (), *, allow_everyone_if_no_acl_found: bool = False
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self.stats = AuthorizerStats()
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        self._cache: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}

    @property
    def version(self) -> int:
        return self.stats.version

    def load(self, version: int, acls: Iterable[AclBinding]) -> None:
        """Replace the bindings (those of the store's ACL `version`); drops the cache."""
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        prefixed: dict[ResourceType, list[AclBinding]] = {}
        by_type: dict[ResourceType, list[AclBinding]] = {}
        count = 0
        for acl in acls:
            count += 1
            by_type.setdefault(acl.resource_type, []).append(acl)
            if acl.pattern_type is PatternType.PREFIXED:
                prefixed.setdefault(acl.resource_type, []).append(acl)
            else:
                literal.setdefault((acl.resource_type, acl.resource_name), []).append(acl)
        self._literal, self._prefixed, self._by_type = literal, prefixed, by_type
        self._cache = {}
        self.stats.acls = count
        self.stats.version = version
        self.stats.reloads += 1

    def _applying(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        found.extend(
            acl
            for acl in self._prefixed.get(resource_type, ())
            if name.startswith(acl.resource_name)
        )
        return found

    def authorize(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        key = (principal, host, operation, resource_type, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, name)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache = {}
            self._cache[key] = decision
        return decision

    def _decide(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        if principal in self.super_users:
            return True
        acls = self._applying(resource_type, name)
        if not acls:
            return self.allow_everyone_if_no_acl_found
        mine = [a for a in acls if _names(a, principal, host)]
        if any(
            a.permission is Permission.DENY and a.operation in (operation, Operation.ALL)
            for a in mine
        ):
            return False
        allowing = _IMPLIED_BY.get(operation, frozenset()) | {operation, Operation.ALL}
        return any(a.permission is Permission.ALLOW and a.operation in allowing for a in mine)

    def authorize_any(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether some resource of the type allows the operation (Kafka's
        authorizeByResourceType): an ALLOW not covered by a DENY of the same literal
        name or of a prefix of it; a LITERAL "*" DENY refuses, a LITERAL "*" ALLOW allows."""
        # A name no binding names: super users, and allow.everyone.if.no.acl.found.
        if self._decide(principal, host, operation, resource_type, "\x00no resource\x00"):
            return True
        denied_literal: set[str] = set()
        denied_prefixes: set[str] = set()
        allowed: list[AclBinding] = []
        wildcard_allowed = False
        for acl in self._by_type.get(resource_type, ()):
            if not _names(acl, principal, host) or acl.operation not in (
                operation,
                Operation.ALL,
            ):
                continue
            wildcard = acl.pattern_type is PatternType.LITERAL and acl.resource_name == WILDCARD
            if acl.permission is Permission.DENY:
                if wildcard:
                    return False
                if acl.pattern_type is PatternType.LITERAL:
                    denied_literal.add(acl.resource_name)
                else:
                    denied_prefixes.add(acl.resource_name)
            elif acl.permission is Permission.ALLOW:
                if wildcard:
                    wildcard_allowed = True  # unless a wildcard DENY comes after it
                else:
                    allowed.append(acl)
        if wildcard_allowed:
            return True
        for acl in allowed:
            if acl.pattern_type is PatternType.LITERAL and acl.resource_name in denied_literal:
                continue
            name = acl.resource_name
            if not any(name[:i] in denied_prefixes for i in range(1, len(name) + 1)):
                return True
        return False

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, name: str
    ) -> int:
        """Kafka's "authorized operations" bit field of a resource (bit = operation code)."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << int(op)
        return bits


def _names(acl: AclBinding, principal: str, host: str) -> bool:
    """Whether the binding's entry names this principal from this host."""
    return acl.principal in (principal, WILDCARD_PRINCIPAL) and acl.host in (host, WILDCARD)
