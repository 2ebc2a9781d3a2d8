"""The server-side assignors `uniform` and `range`: every subscribed partition to exactly one
subscriber, even shares, stickiness, and the same answer whatever the input order."""

from __future__ import annotations

import random

import pytest

from broker.groups.assignors import ASSIGNORS, MemberSpec, range_, uniform

T1, T2, T3 = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16


def spec(*topics: bytes, current=()) -> MemberSpec:
    return MemberSpec(frozenset(topics), frozenset(current))


def parts(topic: bytes, *ps: int) -> frozenset[tuple[bytes, int]]:
    return frozenset((topic, p) for p in ps)


def check_valid(members, partitions, result) -> None:
    """Every partition of a subscribed topic goes to exactly one of its subscribers."""
    assert set(result) == set(members)
    seen: dict[tuple[bytes, int], str] = {}
    for member_id, assigned in result.items():
        for topic, p in assigned:
            assert topic in members[member_id].subscribed, (member_id, topic)
            assert 0 <= p < partitions[topic]
            assert (topic, p) not in seen, f"{(topic, p)} to {seen.get((topic, p))} and {member_id}"
            seen[(topic, p)] = member_id
    subscribed = {t for m in members.values() for t in m.subscribed if t in partitions}
    expected = {(t, p) for t in subscribed for p in range(partitions[t])}
    assert set(seen) == expected


def test_uniform_spreads_twelve_partitions_over_three_members():
    members = {m: spec(T1) for m in ("a", "b", "c")}
    result = uniform(members, {T1: 12})
    check_valid(members, {T1: 12}, result)
    assert sorted(len(v) for v in result.values()) == [4, 4, 4]


def test_uniform_with_a_remainder_gives_one_more_to_some():
    members = {m: spec(T1, T2) for m in ("a", "b", "c")}
    result = uniform(members, {T1: 5, T2: 3})
    check_valid(members, {T1: 5, T2: 3}, result)
    assert sorted(len(v) for v in result.values()) == [2, 3, 3]


def test_uniform_a_joining_member_takes_partitions_only_from_the_others_surplus():
    before = uniform({m: spec(T1) for m in ("a", "b")}, {T1: 12})
    members = {"a": spec(T1, current=before["a"]), "b": spec(T1, current=before["b"])}
    members["c"] = spec(T1)
    after = uniform(members, {T1: 12})
    check_valid(members, {T1: 12}, after)
    assert sorted(len(v) for v in after.values()) == [4, 4, 4]
    # a and b keep 4 of their 6 each: only 4 partitions move, all to c.
    assert after["a"] <= before["a"] and after["b"] <= before["b"]


def test_uniform_a_leaving_member_only_its_partitions_move():
    before = uniform({m: spec(T1) for m in ("a", "b", "c")}, {T1: 12})
    members = {m: spec(T1, current=before[m]) for m in ("a", "b")}
    after = uniform(members, {T1: 12})
    check_valid(members, {T1: 12}, after)
    assert before["a"] <= after["a"] and before["b"] <= after["b"]
    assert sorted(len(v) for v in after.values()) == [6, 6]


def test_uniform_keeps_current_partitions_when_already_balanced():
    current = {"a": parts(T1, 0, 5, 7), "b": parts(T1, 1, 2, 3), "c": parts(T1, 4, 6, 8)}
    members = {m: spec(T1, current=c) for m, c in current.items()}
    assert uniform(members, {T1: 9}) == current


def test_uniform_heterogeneous_subscriptions_balance_where_they_can():
    members = {"a": spec(T1), "b": spec(T1, T2), "c": spec(T2)}
    partitions = {T1: 6, T2: 6}
    result = uniform(members, partitions)
    check_valid(members, partitions, result)
    assert sorted(len(v) for v in result.values()) == [4, 4, 4]
    assert all(t == T1 for t, _ in result["a"]) and all(t == T2 for t, _ in result["c"])


def test_uniform_ignores_current_partitions_of_unsubscribed_or_missing_topics():
    members = {"a": spec(T1, current=parts(T2, 0, 1) | parts(T1, 9)), "b": spec(T1)}
    result = uniform(members, {T1: 4, T2: 2})
    check_valid(members, {T1: 4, T2: 2}, result)


def test_range_gives_contiguous_ranges_and_co_partitions_topics():
    members = {m: spec(T1, T2) for m in ("a", "b", "c")}
    result = range_(members, {T1: 7, T2: 7})
    check_valid(members, {T1: 7, T2: 7}, result)
    assert result["a"] == parts(T1, 0, 1, 2) | parts(T2, 0, 1, 2)
    assert result["b"] == parts(T1, 3, 4) | parts(T2, 3, 4)
    assert result["c"] == parts(T1, 5, 6) | parts(T2, 5, 6)


def test_range_is_sticky_per_topic():
    current = {"a": parts(T1, 0, 1, 2, 3), "b": parts(T1, 4, 5, 6, 7)}
    members = {m: spec(T1, current=c) for m, c in current.items()}
    members["c"] = spec(T1)
    result = range_(members, {T1: 8})
    check_valid(members, {T1: 8}, result)
    assert result["a"] == parts(T1, 0, 1, 2)
    assert result["b"] == parts(T1, 4, 5, 6)
    assert result["c"] == parts(T1, 3, 7)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_assignors_on_random_inputs_are_valid_balanced_and_order_free(name):
    assignor = ASSIGNORS[name]
    rng = random.Random(848)
    topics = [bytes([i]) * 16 for i in range(1, 5)]
    for _ in range(150):
        partitions = {t: rng.randint(1, 9) for t in rng.sample(topics, rng.randint(1, 4))}
        homogeneous = rng.random() < 0.5
        shared = frozenset(rng.sample(topics, rng.randint(1, 4)))
        members = {}
        for i in range(rng.randint(1, 6)):
            subscribed = shared if homogeneous else frozenset(rng.sample(topics, rng.randint(1, 4)))
            every = [(t, p) for t in subscribed if t in partitions for p in range(partitions[t])]
            current = frozenset(rng.sample(every, rng.randint(0, len(every))))
            members[f"m{i}"] = MemberSpec(subscribed, current)
        result = assignor(members, partitions)
        check_valid(members, partitions, result)
        shuffled = dict(rng.sample(list(members.items()), len(members)))
        assert assignor(shuffled, dict(reversed(list(partitions.items())))) == result
        if homogeneous and name == "uniform":
            counts = [len(v) for v in result.values()]
            assert max(counts) - min(counts) <= 1
        if not homogeneous and name == "uniform":
            # No partition could go to one of its topic's subscribers with two fewer.
            for assigned in result.values():
                for topic, _p in assigned:
                    for other, s in members.items():
                        if topic in s.subscribed:
                            assert len(result[other]) >= len(assigned) - 1
        if name == "range":
            for topic, count in partitions.items():
                subscribers = [m for m in members if topic in members[m].subscribed]
                shares = [sum(1 for t, _ in result[m] if t == topic) for m in subscribers]
                if shares:
                    assert max(shares) - min(shares) <= 1 and sum(shares) == count
        # Given its own answer as the current assignment, an assignor changes nothing.
        again = {m: MemberSpec(s.subscribed, result[m]) for m, s in members.items()}
        assert assignor(again, partitions) == result
