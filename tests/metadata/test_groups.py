"""The consumer-group layer: group records fenced by revision, offsets fenced by
generation, offsets of deleted topics, retention."""

from __future__ import annotations

import uuid

import pytest

from metadata import groups, keys, topics
from metadata.groups import (
    EMPTY,
    STABLE,
    CommittedOffset,
    ExpiryRule,
    GroupFenced,
    OffsetToCommit,
    StoredGroup,
    StoredMember,
)
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")


@pytest.fixture
def kv(tmp_path):
    return SQLiteKV(str(tmp_path / "meta.db"))


@pytest.fixture
def topic(kv) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 3, {}, 0)
    )


def member(member_id: str, assignment: bytes = b"", instance: str | None = None) -> StoredMember:
    return StoredMember(
        member_id, instance, "client", "/127.0.0.1", 30_000, 10_000, (("range", b"m"),), assignment
    )


def stable_group(generation: int = 1, *members: StoredMember) -> StoredGroup:
    return StoredGroup(
        "g", "consumer", "range", generation, members[0].member_id if members else None,
        STABLE if members else EMPTY, 1000, members=members,
    )  # fmt: skip


def offset(topic: topics.Topic, partition: int, value: int, metadata: str = "") -> OffsetToCommit:
    return OffsetToCommit(topic.name, topic.topic_id, partition, value, 7, metadata)


def test_group_round_trip_keeps_members_and_leader_first(kv):
    stored = stable_group(3, member("b-1", b"B"), member("a-1", b"A", instance="i-a"))
    revision = kv.transact_sync(
        lambda tr: groups.put_group(tr, SUB, stored, expected_revision=None)
    )
    assert revision == 1
    loaded = kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "g"))
    assert loaded.revision == 1
    assert loaded.generation == 3 and loaded.leader == "b-1" and loaded.state == STABLE
    assert [m.member_id for m in loaded.members] == ["b-1", "a-1"]
    assert loaded.members[1].group_instance_id == "i-a"
    assert loaded.members[1].assignment == b"A"
    assert loaded.members[0].protocols == (("range", b"m"),)


def test_a_write_names_the_revision_it_read(kv):
    stored = stable_group(1, member("m-1"))
    kv.transact_sync(lambda tr: groups.put_group(tr, SUB, stored, expected_revision=None))
    with pytest.raises(GroupFenced) as exc:
        kv.transact_sync(lambda tr: groups.put_group(tr, SUB, stored, expected_revision=None))
    assert exc.value.error_code == 16  # NOT_COORDINATOR
    assert kv.transact_sync(lambda tr: groups.put_group(tr, SUB, stored, expected_revision=1)) == 2
    with pytest.raises(GroupFenced):
        kv.transact_sync(lambda tr: groups.put_group(tr, SUB, stored, expected_revision=1))


def test_rewriting_a_group_replaces_its_members(kv):
    kv.transact_sync(
        lambda tr: groups.put_group(
            tr, SUB, stable_group(1, member("a"), member("b")), expected_revision=None
        )
    )
    kv.transact_sync(
        lambda tr: groups.put_group(tr, SUB, stable_group(2, member("c")), expected_revision=1)
    )
    loaded = kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "g"))
    assert [m.member_id for m in loaded.members] == ["c"]
    assert [g.group_id for g in kv.transact_sync(lambda tr: groups.list_groups(tr, SUB))] == ["g"]


def test_simple_commit_creates_a_simple_group(kv, topic):
    revision = kv.transact_sync(
        lambda tr: groups.commit_offsets(
            tr, SUB, "simple", [offset(topic, 0, 42, "meta")], generation=None, now_ms=5000
        )
    )
    assert revision == 1
    stored = kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "simple"))
    assert stored.protocol_type is None and stored.state == EMPTY and stored.members == ()
    got = kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "simple"))
    assert got == {("t", 0): CommittedOffset(42, 7, "meta", 5000, None, topic.topic_id)}


def test_simple_commit_is_refused_while_the_group_has_members(kv, topic):
    kv.transact_sync(
        lambda tr: groups.put_group(tr, SUB, stable_group(1, member("m")), expected_revision=None)
    )
    with pytest.raises(GroupFenced):
        kv.transact_sync(
            lambda tr: groups.commit_offsets(
                tr, SUB, "g", [offset(topic, 0, 1)], generation=None, now_ms=0
            )
        )


def test_member_commit_is_fenced_by_the_stored_generation(kv, topic):
    kv.transact_sync(
        lambda tr: groups.put_group(tr, SUB, stable_group(4, member("m")), expected_revision=None)
    )
    kv.transact_sync(
        lambda tr: groups.commit_offsets(
            tr, SUB, "g", [offset(topic, 1, 10)], generation=4, now_ms=0
        )
    )
    for stale in (3, 5):
        with pytest.raises(GroupFenced):
            kv.transact_sync(
                lambda tr, stale=stale: groups.commit_offsets(
                    tr, SUB, "g", [offset(topic, 1, 99)], generation=stale, now_ms=0
                )
            )
    with pytest.raises(GroupFenced):
        kv.transact_sync(
            lambda tr: groups.commit_offsets(
                tr, SUB, "nope", [offset(topic, 1, 99)], generation=1, now_ms=0
            )
        )
    got = kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "g", ["t"]))
    assert {k: v.offset for k, v in got.items()} == {("t", 1): 10}


def test_offsets_of_a_deleted_or_recreated_topic_are_gone(kv, topic):
    kv.transact_sync(
        lambda tr: groups.commit_offsets(
            tr, SUB, "s", [offset(topic, 0, 3), offset(topic, 2, 4)], generation=None, now_ms=0
        )
    )
    assert len(kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "s"))) == 2

    def recreate(tr):
        tr.clear(SUB.key(keys.TOPIC_NAME, "t"))
        topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 3, {}, 0)

    kv.transact_sync(recreate)
    assert kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "s")) == {}
    assert kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "s", ["t"])) == {}


def test_delete_group_and_delete_offsets(kv, topic):
    kv.transact_sync(
        lambda tr: groups.commit_offsets(
            tr, SUB, "s", [offset(topic, p, p) for p in range(3)], generation=None, now_ms=0
        )
    )
    assert (
        kv.transact_sync(lambda tr: groups.delete_offsets(tr, SUB, "s", [("t", 1), ("t", 9)])) == 1
    )
    assert sorted(kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "s"))) == [
        ("t", 0),
        ("t", 2),
    ]
    with pytest.raises(GroupFenced):
        kv.transact_sync(lambda tr: groups.delete_group(tr, SUB, "s", expected_revision=7))
    assert kv.transact_sync(lambda tr: groups.delete_group(tr, SUB, "s", expected_revision=1)) == 2
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "s")) is None
    assert kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "s")) == {}


def test_expiry_rule():
    committed = CommittedOffset(1, -1, "", commit_timestamp_ms=1000, expire_timestamp_ms=None,
                                topic_id=b"x")  # fmt: skip
    by_commit = ExpiryRule(retention_ms=100)
    assert not by_commit.expired("t", committed, 1099)
    assert by_commit.expired("t", committed, 1100)
    since_empty = ExpiryRule(retention_ms=100, base_timestamp_ms=5000)
    assert not since_empty.expired("t", committed, 5099)
    assert since_empty.expired("t", committed, 5100)
    explicit = CommittedOffset(1, -1, "", 1000, expire_timestamp_ms=2000, topic_id=b"x")
    assert not since_empty.expired("t", explicit, 1999)
    assert since_empty.expired("t", explicit, 2000)
    keep = ExpiryRule(retention_ms=0, keep_topics=frozenset({"t"}))
    assert not keep.expired("t", committed, 10**12)
    assert keep.expired("u", committed, 10**12)


def test_expire_offsets_deletes_an_empty_group_left_without_offsets(kv, topic):
    kv.transact_sync(
        lambda tr: groups.commit_offsets(tr, SUB, "s", [offset(topic, 0, 1)], generation=None,
                                         now_ms=1000)
    )  # fmt: skip
    kv.transact_sync(
        lambda tr: groups.commit_offsets(tr, SUB, "s", [offset(topic, 1, 1)], generation=None,
                                         now_ms=2000)
    )  # fmt: skip

    def expire(now):
        return kv.transact_sync(
            lambda tr: groups.expire_offsets(
                tr, SUB, "s", ExpiryRule(retention_ms=500), now_ms=now, expected_revision=1,
                delete_group_when_empty=True,
            )
        )  # fmt: skip

    assert expire(1499) == groups.ExpiryResult(0, 2, False)
    assert expire(1500) == groups.ExpiryResult(1, 1, False)
    assert expire(2500) == groups.ExpiryResult(1, 0, True)
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "s")) is None


def test_apply_offset_of_a_committed_transaction(kv, topic):
    kv.transact_sync(lambda tr: groups.apply_offset(tr, SUB, "txg", "t", 2, 30, 0, None, now_ms=9))
    kv.transact_sync(
        lambda tr: groups.apply_offset(tr, SUB, "txg", "gone", 0, 1, 0, None, now_ms=9)
    )
    assert kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "txg")) == {
        ("t", 2): CommittedOffset(30, 0, "", 9, None, topic.topic_id)
    }
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "txg")).state == EMPTY
