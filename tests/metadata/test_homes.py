"""Home zones of group and transactional ids (metadata.homes). Run on every backend."""

from __future__ import annotations

import threading

import anyio

from metadata import homes, keys

SUB = keys.cluster_subspace("test")
OTHER = keys.cluster_subspace("other")


def claim(kv, kind: int, key: str, zone: str, sub: keys.Subspace = SUB) -> str:
    return kv.transact_sync(lambda tr: homes.claim(tr, sub, kind, key, zone))


def test_the_first_claim_sets_the_home_and_later_ones_keep_it(kv):
    assert kv.transact_sync(lambda tr: homes.get(tr, SUB, homes.GROUP, "orders")) is None
    assert claim(kv, homes.GROUP, "orders", "b") == "b"
    assert claim(kv, homes.GROUP, "orders", "a") == "b"
    assert kv.transact_sync(lambda tr: homes.get(tr, SUB, homes.GROUP, "orders")) == "b"


def test_group_ids_and_transactional_ids_have_homes_of_their_own(kv):
    claim(kv, homes.GROUP, "app", "a")
    assert claim(kv, homes.TRANSACTION, "app", "c") == "c"
    assert kv.transact_sync(lambda tr: homes.get(tr, SUB, homes.GROUP, "app")) == "a"
    # Another cluster in the same store has its own.
    assert claim(kv, homes.GROUP, "app", "b", OTHER) == "b"
    assert kv.transact_sync(lambda tr: homes.get(tr, SUB, homes.GROUP, "app")) == "a"


def test_several_homes_are_read_at_once_by_point_or_range_reads(kv):
    for i, zone in enumerate("abcab"):
        claim(kv, homes.GROUP, f"g{i}", zone)
    claim(kv, homes.TRANSACTION, "t0", "c")
    wanted = ["g0", "g2", "missing", "g4", "t0"]
    assert kv.transact_sync(lambda tr: homes.get_many(tr, SUB, homes.GROUP, wanted)) == {
        "g0": "a",
        "g2": "c",
        "g4": "b",
    }
    assert kv.transact_sync(lambda tr: homes.get_all(tr, SUB, homes.GROUP)) == {
        f"g{i}": zone for i, zone in enumerate("abcab")
    }
    assert kv.transact_sync(lambda tr: homes.get_all(tr, SUB, homes.TRANSACTION)) == {"t0": "c"}


def test_claims_of_one_key_from_two_zones_at_once_agree(kv, backend):
    # Two stores open on the same backend claim the same keys at once, for two zones:
    # both claims of a key are answered with the one home it keeps.
    second = backend.open()
    try:
        answers: list[str] = []
        barrier = threading.Barrier(2)

        def claimer(store, zone: str) -> None:
            barrier.wait()
            for i in range(20):
                answers.append(claim(store, homes.GROUP, f"race-{i}", zone))

        threads = [
            threading.Thread(target=claimer, args=(kv, "a")),
            threading.Thread(target=claimer, args=(second, "b")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stored = kv.transact_sync(lambda tr: homes.get_all(tr, SUB, homes.GROUP))
        assert len(stored) == 20
        assert sorted(answers) == sorted([stored[f"race-{i}"] for i in range(20)] * 2)
    finally:
        anyio.run(second.aclose)
