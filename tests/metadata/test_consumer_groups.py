"""The consumer-protocol group layer, on every KV backend (the `kv` fixture): a group and
its members stored and read back, writes fenced by revision, only changed members written
when the previous form is given."""

from __future__ import annotations

import pytest

from metadata import consumer_groups as cg
from metadata import keys
from metadata.groups import GroupFenced

SUB = keys.cluster_subspace("test")
T = b"\x07" * 16


def member(member_id: str, epoch: int = 3, **changes) -> cg.StoredConsumerMember:
    fields = dict(
        member_id=member_id,
        instance_id=None,
        rack_id="rack-1",
        client_id="client",
        client_host="/127.0.0.1",
        subscribed_topic_names=("orders",),
        subscribed_topic_regex="orders-.*",
        server_assignor="range",
        rebalance_timeout_ms=60_000,
        member_epoch=epoch,
        previous_member_epoch=epoch - 1,
        state="unrevoked_partitions",
        assigned=((T, 0), (T, 1)),
        pending_revocation=((T, 2),),
        target=((T, 0), (T, 1), (T, 5)),
    )
    fields.update(changes)
    return cg.StoredConsumerMember(**fields)


def group(*members: cg.StoredConsumerMember, epoch: int = 3) -> cg.StoredConsumerGroup:
    return cg.StoredConsumerGroup("g", epoch, epoch, (("orders", T, 12),), members=members)


def test_a_group_round_trips_with_its_members(kv):
    stored = group(member("a"), member("b", instance_id="inst-b", subscribed_topic_regex=None))
    revision = kv.transact_sync(
        lambda tr: cg.put_consumer_group(tr, SUB, stored, expected_revision=None)
    )
    assert revision == 1
    read = kv.transact_sync(lambda tr: cg.get_consumer_group(tr, SUB, "g"))
    assert read.revision == 1 and read.members == stored.members
    assert (read.group_epoch, read.assignment_epoch) == (3, 3)
    assert read.subscription_metadata == (("orders", T, 12),)
    listed = kv.transact_sync(lambda tr: cg.list_consumer_groups(tr, SUB))
    assert [(x.group_id, x.revision, x.members) for x in listed] == [("g", 1, ())]


def test_a_stale_writer_is_fenced(kv):
    kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, group(), expected_revision=None))
    with pytest.raises(GroupFenced):
        kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, group(), expected_revision=None))
    kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, group(), expected_revision=1))
    with pytest.raises(GroupFenced):
        kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, group(), expected_revision=1))
    with pytest.raises(GroupFenced):
        kv.transact_sync(lambda tr: cg.delete_consumer_group(tr, SUB, "g", expected_revision=1))
    kv.transact_sync(lambda tr: cg.delete_consumer_group(tr, SUB, "g", expected_revision=2))
    assert kv.transact_sync(lambda tr: cg.get_consumer_group(tr, SUB, "g")) is None


def test_with_the_previous_form_only_changes_are_written(kv):
    first = group(member("a"), member("b"), member("c"))
    kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, first, expected_revision=None))
    second = group(member("a", epoch=4), member("c"), member("d"), epoch=4)
    kv.transact_sync(
        lambda tr: cg.put_consumer_group(tr, SUB, second, expected_revision=1, previous=first)
    )
    read = kv.transact_sync(lambda tr: cg.get_consumer_group(tr, SUB, "g"))
    assert read.members == second.members and read.group_epoch == 4


def test_a_transactions_offset_goes_to_a_consumer_group_without_a_classic_record(kv):
    from metadata import groups, topics

    kv.transact_sync(lambda tr: topics.create_topic(tr, SUB, "orders", T, 12, {}, 0))
    kv.transact_sync(lambda tr: cg.put_consumer_group(tr, SUB, group(), expected_revision=None))
    kv.transact_sync(
        lambda tr: groups.apply_offset(tr, SUB, "g", "orders", 3, 17, -1, "", now_ms=1)
    )
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "g")) is None
    fetched = kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "g", None))
    assert fetched[("orders", 3)].offset == 17
    # A group of neither kind gets a simple classic record, as before.
    kv.transact_sync(lambda tr: groups.apply_offset(tr, SUB, "h", "orders", 0, 1, -1, "", now_ms=1))
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "h")) is not None


def test_an_empty_classic_group_is_replaced_keeping_its_offsets(kv):
    from metadata import groups, topics

    kv.transact_sync(lambda tr: topics.create_topic(tr, SUB, "orders", T, 12, {}, 0))
    kv.transact_sync(lambda tr: groups.apply_offset(tr, SUB, "g", "orders", 0, 9, -1, "", now_ms=1))
    classic = kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "g"))
    with pytest.raises(GroupFenced):
        kv.transact_sync(
            lambda tr: cg.take_over_classic(
                tr, SUB, group(member("a")), classic_revision=classic.revision + 1
            )
        )
    kv.transact_sync(
        lambda tr: cg.take_over_classic(
            tr, SUB, group(member("a")), classic_revision=classic.revision
        )
    )
    assert kv.transact_sync(lambda tr: groups.get_group(tr, SUB, "g")) is None
    assert kv.transact_sync(lambda tr: cg.get_consumer_group(tr, SUB, "g")) is not None
    fetched = kv.transact_sync(lambda tr: groups.fetch_offsets(tr, SUB, "g", None))
    assert fetched[("orders", 0)].offset == 9
    with pytest.raises(GroupFenced):  # it has a member
        kv.transact_sync(lambda tr: cg.drop_consumer_group(tr, SUB, "g", expected_revision=1))
