"""Compacted topics cleaned by a running broker, read by real clients.

Many updates of a few keys go into a compacted topic; the broker's cleaner (a short
back-off here) keeps the latest record of each key at its own offset. Consumers then read
one record per key, the last value written, across the gaps that removed records left;
a consumer that seeks into a gap gets the next record. The same workload into a topic
with cleanup.policy=delete keeps everything.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

FAST = [
    "--log-cleaner-backoff-ms",
    "300",
    "--compaction-interval-ms",
    "200",
    "--compaction-min-age-ms",
    "200",
]
KEYS = 20
ROUNDS = 30


def create(broker: BrokerProcess, name: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(timeout=20)


def produce(broker: BrokerProcess, topic: str) -> dict[bytes, bytes]:
    """ROUNDS updates of KEYS keys, one flush per round; the last value of each key."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    last = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = f"key-{k}".encode(), f"value-{r}-{k}".encode()
            producer.produce(topic, key=key, value=value)
            last[key] = value
        producer.flush(20)
    return last


def stats(broker: BrokerProcess) -> dict:
    path = broker.data_dir / f"stats-{broker.port}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_confluent(
    broker: BrokerProcess, topic: str, start: int = 0
) -> list[tuple[int, bytes, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, start)])
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    out = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            if out and out[-1][0] == high - 1:
                break
            continue
        out.append((message.offset(), message.key(), message.value()))
        if message.offset() == high - 1:
            break
    consumer.close()
    return out


def read_kafka_python(broker: BrokerProcess, topic: str) -> list[tuple[int, bytes, bytes]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    high = consumer.end_offsets([tp])[tp]
    out = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and consumer.position(tp) < high:
        for records in consumer.poll(timeout_ms=500).values():
            out += [(r.offset, r.key, r.value) for r in records]
    consumer.close()
    return out


def test_a_compacted_topic_reads_as_the_latest_value_of_each_key(start_broker):
    broker = start_broker(extra_args=FAST)
    create(broker, "table", {"cleanup.policy": "compact"})
    create(broker, "history", {"cleanup.policy": "delete"})
    last = produce(broker, "table")
    produce(broker, "history")

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = read_confluent(broker, "table")
        if len(records) == KEYS:
            break
        time.sleep(0.5)
    assert {key: value for _o, key, value in records} == last
    assert len(records) == KEYS  # one record per key
    offsets = [o for o, _k, _v in records]
    # Offsets kept: the last round's records, at the offsets they were given.
    assert offsets == list(range((ROUNDS - 1) * KEYS, ROUNDS * KEYS))
    assert read_kafka_python(broker, "table") == records
    # Seeking into the gap before them gives the next record.
    assert read_confluent(broker, "table", start=5)[0] == records[0]
    cleaning = stats(broker).get("cleaning", {})
    assert cleaning.get("rounds", 0) >= 1 and cleaning.get("records_removed", 0) > 0
    # The delete topic keeps every record.
    assert len(read_confluent(broker, "history")) == ROUNDS * KEYS
