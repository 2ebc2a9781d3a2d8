"""The log's second half with real clients: DeleteRecords, retention by time and size,
deleted topics and orphan uploads, and the objects each frees (after the delete delay).

Brokers here run every lifecycle job often (a short retention check interval, delete
delay and orphan sweep), so that a test sees in seconds what takes minutes by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from protocol.records import build_batch
from tests.e2e.wire import WireClient, list_offsets, produce, request
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

T = TypeVar("T")
DELETE_DELAY_MS = 2000
FAST = [
    "--log-retention-check-interval-ms",
    "200",
    "--object-delete-delay-ms",
    str(DELETE_DELAY_MS),
]
EARLIEST, LATEST = -2, -1
DELETE_RECORDS = 21


def wait_for(what: str, check: Callable[[], T], timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {value!r})")
        time.sleep(0.1)


def create(broker: BrokerProcess, name: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic(
        name, partitions, 1, config={k.replace("_", "."): v for k, v in configs.items()}
    )
    admin.create_topics([topic])[name].result(10)


def produce_each(broker: BrokerProcess, topic: str, values: list[bytes], ts: int, p: int = 0):
    """Each value in a produce request (and so a flush, an object) of its own."""
    with WireClient(broker.bootstrap) as client:
        for value in values:
            answer = produce(client, {topic: {p: build_batch([(None, value, [], ts)])}})
            assert answer[topic, p].error_code == ErrorCode.none


def offsets(broker: BrokerProcess, topic: str, p: int = 0) -> tuple[int, int]:
    """(earliest, latest) by ListOffsets."""
    with WireClient(broker.bootstrap) as client:
        earliest = list_offsets(client, topic, {p: EARLIEST}, version=7)[p].offset
        latest = list_offsets(client, topic, {p: LATEST}, version=7)[p].offset
    return earliest, latest


def consume_from_start(broker: BrokerProcess, topic: str, expect: int) -> list[tuple[int, bytes]]:
    """(offset, value) of `expect` records read by a consumer asking for offset 0 with
    auto.offset.reset=earliest, as a consumer behind the log start does."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 15
    while len(got) < expect and time.monotonic() < deadline:
        msg = consumer.poll(0.3)
        if msg is not None and msg.error() is None:
            got.append((msg.offset(), msg.value()))
    consumer.close()
    return got


def test_delete_records_from_confluent_kafka_and_kafka_python(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "dr", partitions=2)
    create(broker, "dr-compact", cleanup_policy="compact")
    now = int(time.time() * 1000)
    for p in (0, 1):
        produce_each(broker, "dr", [b"v%d" % i for i in range(10)], now, p)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    done = admin.delete_records([TopicPartition("dr", 0, 4)])
    (result,) = [f.result(10) for f in done.values()]
    assert result.low_watermark == 4
    # Past the watermark, a compacted topic: Kafka's errors.
    for tp, code in [
        (TopicPartition("dr", 0, 11), KafkaError.OFFSET_OUT_OF_RANGE),
        (TopicPartition("dr-compact", 0, 0), KafkaError.POLICY_VIOLATION),
    ]:
        with pytest.raises(Exception) as failed:
            for f in admin.delete_records([tp]).values():
                f.result(10)
        assert failed.value.args[0].code() == code, failed.value
    assert offsets(broker, "dr", 0) == (4, 10)
    # Clients ask only for partitions they know; by hand, each error on its partition.
    with WireClient(broker.bootstrap) as client:
        answer = client.call(
            request(
                DELETE_RECORDS,
                2,
                timeout=10_000,
                topics=[
                    {"name": "dr", "partitions": [{"partition_index": 5, "offset": 1}]},
                    {"name": "nope", "partitions": [{"partition_index": 0, "offset": 1}]},
                    {"name": "dr", "partitions": [{"partition_index": 0, "offset": -3}]},
                ],
            )
        )
    codes = [
        (p.partition_index, p.error_code, p.low_watermark)
        for t in answer.topics
        for p in t.partitions
    ]
    assert codes == [
        (5, ErrorCode.unknown_topic_or_partition, -1),
        (0, ErrorCode.unknown_topic_or_partition, -1),
        (0, ErrorCode.offset_out_of_range, -1),
    ]

    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    answer = kp.delete_records({KpTopicPartition("dr", 1): -1})  # -1: the high watermark
    kp.close()
    assert [v["low_watermark"] for v in answer.values()] == [10]
    assert offsets(broker, "dr", 1) == (10, 10)
    # The log start never moves back.
    (again,) = [f.result(10) for f in admin.delete_records([TopicPartition("dr", 0, 2)]).values()]
    assert again.low_watermark == 4

    # A consumer asking for offset 0 is out of range and resets to the log start.
    assert [o for o, _v in consume_from_start(broker, "dr", 6)] == list(range(4, 10))
    # The object of offsets 0-3 of partition 0 is deleted after the delete delay; the
    # others hold records still (every object holds one record of one partition).
    wait_for(
        "objects deleted",
        lambda: broker.stats().get("lifecycle", {}).get("objects_deleted", 0) == 4 + 10,
    )
    assert len(broker.object_keys("ingest/")) == 6


def test_time_retention_moves_the_log_start_and_frees_the_objects(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "old", retention_ms="3000")
    old = int(time.time() * 1000) - 60_000  # written long ago, by its timestamps
    produce_each(broker, "old", [b"o%d" % i for i in range(5)], old)
    moved_at = wait_for(
        "log start moved", lambda: offsets(broker, "old") == (5, 5) and time.monotonic()
    )
    # Dropped from the index at once; the objects stay for the delete delay.
    assert len(broker.object_keys("ingest/")) == 5
    wait_for("objects deleted", lambda: broker.object_keys("ingest/") == [])
    assert time.monotonic() - moved_at >= DELETE_DELAY_MS / 1000 - 0.5
    # New records are kept, and a consumer from offset 0 resets to them.
    produce_each(broker, "old", [b"new"], int(time.time() * 1000))
    assert consume_from_start(broker, "old", 1) == [(5, b"new")]
    assert offsets(broker, "old") == (5, 6)


def test_retention_ms_altered_at_run_time_takes_effect(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "kept")  # the default: seven days
    produce_each(broker, "kept", [b"k%d" % i for i in range(3)], int(time.time() * 1000) - 60_000)
    time.sleep(1.0)  # five retention checks
    assert offsets(broker, "kept") == (0, 3)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(
        ResourceType.TOPIC,
        "kept",
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(10)
    wait_for("log start moved", lambda: offsets(broker, "kept") == (3, 3))


def test_size_retention_keeps_at_least_retention_bytes(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "sized", retention_bytes="2500")
    value = b"x" * 1000  # a batch of about 1070 bytes, one per object
    produce_each(broker, "sized", [value] * 10, int(time.time() * 1000))
    # Kafka drops the oldest while what is left still holds retention.bytes: three stay.
    wait_for("log start moved", lambda: offsets(broker, "sized") == (7, 10))
    assert [o for o, _v in consume_from_start(broker, "sized", 3)] == [7, 8, 9]
    wait_for("objects deleted", lambda: len(broker.object_keys("ingest/")) == 3)


def test_a_deleted_topics_objects_go_but_objects_shared_with_another_topic_stay(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "gone")
    create(broker, "stays")
    ts = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as client:
        for i in range(3):  # one object holding both topics
            both = {
                t: {0: build_batch([(None, b"%s-%d" % (t.encode(), i), [], ts)])}
                for t in ("gone", "stays")
            }
            assert all(a.error_code == 0 for a in produce(client, both).values())
    produce_each(broker, "gone", [b"alone-%d" % i for i in range(4)], ts)
    assert len(broker.object_keys("ingest/")) == 7
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["gone"])["gone"].result(10)
    wait_for("objects of the deleted topic gone", lambda: len(broker.object_keys("ingest/")) == 3)
    time.sleep(DELETE_DELAY_MS / 1000 + 0.5)
    assert len(broker.object_keys("ingest/")) == 3
    assert [v for _o, v in consume_from_start(broker, "stays", 3)] == [
        b"stays-0",
        b"stays-1",
        b"stays-2",
    ]
    admin.delete_topics(["stays"])["stays"].result(10)
    wait_for("every object gone", lambda: broker.object_keys("ingest/") == [])


def test_an_orphan_upload_is_deleted_and_referenced_objects_never_are(start_broker):
    # 5 s: S3 lists LastModified in whole seconds, so an object may look up to 1 s older
    # than it is; the 1.5 s below (and the listings around it) stay well inside the rest.
    broker = start_broker(
        extra_args=[*FAST, "--orphan-sweep-interval-ms", "300", "--orphan-min-age-ms", "5000"]
    )
    create(broker, "kept")
    produce_each(broker, "kept", [b"a", b"b"], int(time.time() * 1000))
    orphan = "ingest/00000000000000000000000000"
    broker.put_object(orphan, b"an upload whose commit never came")
    keys = set(broker.object_keys("ingest/"))
    assert orphan in keys and len(keys) == 3
    time.sleep(1.5)  # younger than the minimum age: kept
    assert orphan in broker.object_keys("ingest/")
    wait_for("orphan deleted", lambda: orphan not in broker.object_keys("ingest/"))
    time.sleep(1.0)  # several sweeps more
    assert set(broker.object_keys("ingest/")) == keys - {orphan}
    assert broker.stats()["lifecycle"]["orphans_deleted"] == 1
    assert [v for _o, v in consume_from_start(broker, "kept", 2)] == [b"a", b"b"]
