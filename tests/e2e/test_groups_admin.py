"""Groups through admin clients: confluent-kafka's AdminClient (list, describe, offsets,
delete), kafka-python's (OffsetDelete, member removal), and Apache Kafka's own
kafka-consumer-groups tool when the JVM tooling has been fetched."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import KafkaError
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient, MemberToRemove
from kafka.structs import OffsetAndMetadata

try:
    from confluent_kafka import ConsumerGroupTopicPartitions
except ImportError:  # older confluent-kafka
    from confluent_kafka.admin import ConsumerGroupTopicPartitions  # type: ignore[no-redef]

from tests.e2e.rawclient import ensure_topic, produce_raw
from tests.support.group_consumers import ConfluentRunner, KafkaPythonRunner, Tracker, wait_for

pytestmark = pytest.mark.store_independent

ARGS = ["--group-initial-rebalance-delay-ms", "200", "--default-partitions", "3"]
ROOT = Path(__file__).resolve().parents[2]
CONSUMER_GROUPS_TOOL = ROOT / "integration" / "bin" / "kafka-consumer-groups"
KAFKA_JARS = ROOT / "integration" / ".cache" / "jars" / "kafka"


def result(future, timeout: float = 20):
    return future.result(timeout=timeout)


def error_of(future) -> int:
    with pytest.raises(KafkaException) as exc:
        future.result(timeout=20)
    return exc.value.args[0].code()


def test_list_describe_alter_and_delete_with_confluent_admin(start_broker):
    broker = start_broker(extra_args=ARGS)
    ensure_topic(broker.port, "adm")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tracker = Tracker()
    busy = ConfluentRunner("busy-1", broker.bootstrap, "busy", "adm", tracker,
                           settings={"partition.assignment.strategy": "range"})  # fmt: skip
    busy.start()
    try:
        wait_for(lambda: len(tracker.owned_by().get("busy-1", ())) == 3, "the busy group")
        # A simple group, made by committing offsets with no member.
        altered = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("idle", [TopicPartition("adm", 0, 5), TopicPartition("adm", 2, 7)])]
        )  # fmt: skip
        assert [tp.error for tp in result(altered["idle"]).topic_partitions] == [None, None]

        listed = result(admin.list_consumer_groups(request_timeout=10))
        assert {(g.group_id, g.state, g.is_simple_consumer_group) for g in listed.valid} == {
            ("busy", ConsumerGroupState.STABLE, False),
            ("idle", ConsumerGroupState.EMPTY, True),
        }
        stable = result(admin.list_consumer_groups(states={ConsumerGroupState.STABLE}))
        assert [g.group_id for g in stable.valid] == ["busy"]

        described = admin.describe_consumer_groups(["busy", "idle", "never"])
        d_busy, d_idle, d_never = (result(described[g]) for g in ("busy", "idle", "never"))
        assert (d_busy.state, d_busy.partition_assignor, d_busy.is_simple_consumer_group) == (
            ConsumerGroupState.STABLE,
            "range",
            False,
        )
        (member,) = d_busy.members
        assert member.client_id == "busy-1" and member.host == "/127.0.0.1"
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2]
        assert d_busy.coordinator.port == broker.port
        assert (d_idle.state, d_idle.members, d_idle.is_simple_consumer_group) == (
            ConsumerGroupState.EMPTY,
            [],
            True,
        )
        assert d_never.state == ConsumerGroupState.DEAD

        offsets = result(
            admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("idle")])["idle"]
        )
        assert sorted((tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions) == [
            ("adm", 0, 5),
            ("adm", 2, 7),
        ]
        # A group with members is not deleted.
        assert (
            error_of(admin.delete_consumer_groups(["busy"])["busy"]) == KafkaError.NON_EMPTY_GROUP
        )
    finally:
        busy.stop()
    wait_for(
        lambda: (
            result(admin.describe_consumer_groups(["busy"])["busy"]).state
            == ConsumerGroupState.EMPTY
        ),
        "busy to be empty",
    )
    deleted = admin.delete_consumer_groups(["busy", "idle"])
    assert result(deleted["busy"]) is None and result(deleted["idle"]) is None
    assert result(admin.list_consumer_groups()).valid == []
    assert result(admin.describe_consumer_groups(["idle"])["idle"]).state == ConsumerGroupState.DEAD
    assert error_of(admin.delete_consumer_groups(["idle"])["idle"]) == KafkaError.GROUP_ID_NOT_FOUND


def test_delete_offsets_and_remove_members_with_kafka_python_admin(start_broker):
    broker = start_broker(extra_args=ARGS)
    ensure_topic(broker.port, "adm")
    ensure_topic(broker.port, "other")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    # Offsets committed while the group has no member, then a member subscribes to "adm".
    admin.alter_group_offsets(
        "subscribed", {KTP("other", 0): OffsetAndMetadata(4), KTP("adm", 0): OffsetAndMetadata(1)}
    )
    tracker = Tracker()
    member = KafkaPythonRunner("m1", broker.bootstrap, "subscribed", "adm", tracker,
                               instance_id="inst-m1", leave_on_close=False)  # fmt: skip
    member.start()
    try:
        wait_for(lambda: len(tracker.owned_by().get("m1", ())) == 3, "the group")
        answer = admin.delete_group_offsets("subscribed", [KTP("adm", 0), KTP("other", 0)])
        assert {tp: e.errno for tp, e in answer.items()} == {KTP("adm", 0): 86, KTP("other", 0): 0}
        assert set(admin.list_group_offsets("subscribed")["subscribed"]) == {KTP("adm", 0)}
        # An admin removes the static member by its group.instance.id.
        removed = admin.remove_group_members(
            "subscribed", [MemberToRemove(group_instance_id="inst-m1")]
        )
        assert [e.errno for e in removed.values()] == [0]
        # Its only member gone, the group is empty at once; the member finds out later.
        assert admin.describe_groups(["subscribed"])["subscribed"]["group_state"] == "Empty"
    finally:
        member.stop()
    answer = admin.delete_group_offsets("subscribed", [KTP("adm", 0)])
    assert {tp: e.errno for tp, e in answer.items()} == {KTP("adm", 0): 0}
    assert admin.list_group_offsets("subscribed")["subscribed"] == {}
    admin.close()


@pytest.mark.skipif(
    not (CONSUMER_GROUPS_TOOL.exists() and KAFKA_JARS.is_dir()),
    reason="Apache Kafka's tools are not fetched (integration/fetch-jars.sh kafka)",
)
def test_kafka_consumer_groups_tool(start_broker):
    broker = start_broker(extra_args=ARGS)
    ensure_topic(broker.port, "adm")
    produce_raw(broker.port, "adm", 1, [(None, b"x")] * 10)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    result(
        admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("tool", [TopicPartition("adm", 1, 9)])]
        )["tool"]
    )

    def tool(*args: str) -> str:
        run = subprocess.run(
            [str(CONSUMER_GROUPS_TOOL), "--bootstrap-server", broker.bootstrap, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m"},
        )
        assert run.returncode == 0, run.stderr
        return run.stdout

    # One JVM start each: describe every group (ListGroups, DescribeGroups, OffsetFetch,
    # ListOffsets), reset offsets (OffsetCommit), delete (DeleteGroups).
    described = tool("--describe", "--all-groups")
    row = next(line.split() for line in described.splitlines() if line.startswith("tool "))
    assert row[1:6] == ["adm", "1", "9", "10", "1"]  # topic, partition, offset, end, lag
    reset = tool("--reset-offsets", "--group", "tool", "--topic", "adm", "--to-offset", "2",
                 "--execute")  # fmt: skip
    assert "adm" in reset
    time.sleep(0.2)
    offsets = result(
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("tool")])["tool"]
    )
    # The tool resets every partition of the topic, to the end where it has fewer records.
    assert {(tp.partition, tp.offset) for tp in offsets.topic_partitions} == {
        (0, 0),
        (1, 2),
        (2, 0),
    }
    assert "was successful" in tool("--delete", "--group", "tool")
    assert result(admin.list_consumer_groups()).valid == []
