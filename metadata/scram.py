"""SCRAM credentials of users, as a server keeps them (RFC 5802): salt, iterations,
stored key and server key per user and mechanism. Never the password, nor the salted
password.

Mechanisms are Kafka's ScramMechanism numbers (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
`alter` applies a request's deletions and upsertions in one transaction: a deletion of
a credential that does not exist is refused with RESOURCE_NOT_FOUND, as Kafka refuses it,
and the request's other changes are applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from metadata import keys
from metadata.errors import MetadataError
from metadata.kv import ReadTransaction, Transaction


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def get_credential(
    tr: ReadTransaction, sub: keys.Subspace, user: str, mechanism: int
) -> ScramCredential | None:
    raw = tr.get(sub.key(keys.SCRAM_CREDENTIAL, user, mechanism))
    if raw is None:
        return None
    salt, stored_key, server_key, iterations = keys.unpack_value(raw)
    return ScramCredential(salt, stored_key, server_key, int(iterations))


def describe(
    tr: ReadTransaction, sub: keys.Subspace, users: Iterable[str] | None
) -> dict[str, list[tuple[int, int]]]:
    """(mechanism, iterations) of each user's credentials; `users` None: every user with
    one. A user without any is left out."""
    found: dict[str, list[tuple[int, int]]] = {}
    ranges = (
        [sub.range(keys.SCRAM_CREDENTIAL)]
        if users is None
        else [sub.range(keys.SCRAM_CREDENTIAL, user) for user in users]
    )
    for begin, end in ranges:
        for key, value in tr.get_range(begin, end):
            _tag, user, mechanism = sub.unpack(key)
            iterations = int(keys.unpack_value(value)[3])
            found.setdefault(user, []).append((int(mechanism), iterations))
    return found


def set_credential(
    tr: Transaction, sub: keys.Subspace, user: str, mechanism: int, credential: ScramCredential
) -> None:
    tr.set(
        sub.key(keys.SCRAM_CREDENTIAL, user, mechanism),
        keys.pack_value(
            (credential.salt, credential.stored_key, credential.server_key, credential.iterations)
        ),
    )


def delete_credential(tr: Transaction, sub: keys.Subspace, user: str, mechanism: int) -> None:
    key = sub.key(keys.SCRAM_CREDENTIAL, user, mechanism)
    if tr.get(key) is None:
        raise MetadataError(
            ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"
        )
    tr.clear(key)


def alter(
    tr: Transaction,
    sub: keys.Subspace,
    deletions: Iterable[tuple[str, int]],
    upsertions: Iterable[tuple[str, int, ScramCredential]],
) -> dict[str, MetadataError | None]:
    """Apply the deletions, then the upsertions; each user's outcome (None: done)."""
    outcome: dict[str, MetadataError | None] = {}
    for user, mechanism in deletions:
        try:
            delete_credential(tr, sub, user, mechanism)
            outcome[user] = None
        except MetadataError as exc:
            outcome[user] = exc
    for user, mechanism, credential in upsertions:
        set_credential(tr, sub, user, mechanism, credential)
        outcome[user] = None
    return outcome
