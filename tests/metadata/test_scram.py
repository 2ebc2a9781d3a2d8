"""SCRAM credentials in the metadata store: kept per user and mechanism, described,
replaced, deleted, a missing one refused. Run on every backend."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from metadata import keys, scram
from metadata.errors import MetadataError
from metadata.scram import ScramCredential

SUB = keys.cluster_subspace("test")
SHA256, SHA512 = 1, 2


def credential(iterations: int, seed: bytes = b"a") -> ScramCredential:
    return ScramCredential(seed * 16, seed * 32, seed * 32, iterations)


def test_credentials_are_kept_described_replaced_and_deleted(kv):
    outcome = kv.transact_sync(
        lambda tr: scram.alter(
            tr,
            SUB,
            [],
            [("alice", SHA512, credential(8192)), ("bob", SHA256, credential(4096, b"b"))],
        )
    )
    assert outcome == {"alice": None, "bob": None}
    kv.transact_sync(lambda tr: scram.set_credential(tr, SUB, "alice", SHA256, credential(5000)))
    assert kv.transact_sync(lambda tr: scram.get_credential(tr, SUB, "alice", SHA512)) == (
        credential(8192)
    )
    assert kv.transact_sync(lambda tr: scram.get_credential(tr, SUB, "carol", SHA512)) is None
    described = kv.transact_sync(lambda tr: scram.describe(tr, SUB, None))
    assert described == {"alice": [(SHA256, 5000), (SHA512, 8192)], "bob": [(SHA256, 4096)]}
    assert kv.transact_sync(lambda tr: scram.describe(tr, SUB, ["bob", "carol"])) == {
        "bob": [(SHA256, 4096)]
    }
    outcome = kv.transact_sync(
        lambda tr: scram.alter(tr, SUB, [("alice", SHA512), ("carol", SHA256)], [])
    )
    assert outcome["alice"] is None
    assert isinstance(outcome["carol"], MetadataError)
    assert outcome["carol"].error_code == ErrorCode.resource_not_found
    assert kv.transact_sync(lambda tr: scram.describe(tr, SUB, ["alice"])) == {
        "alice": [(SHA256, 5000)]
    }


def test_deleting_a_missing_credential_is_refused(kv):
    with pytest.raises(MetadataError) as refused:
        kv.transact_sync(lambda tr: scram.delete_credential(tr, SUB, "nobody", SHA256))
    assert refused.value.error_code == ErrorCode.resource_not_found
