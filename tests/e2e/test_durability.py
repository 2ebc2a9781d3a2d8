"""Acknowledged means durable: kill -9 the broker, restart it, every acked record is there."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "durability-check",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {}
    deadline = time.monotonic() + timeout
    try:
        while sum(len(v) for v in got.values()) < expected:
            assert time.monotonic() < deadline, f"read {got and sum(map(len, got.values()))} of {expected}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.setdefault(msg.partition(), []).append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def test_acknowledged_records_survive_kill_9(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=["--default-partitions", "4"], data_dir=data_dir)
    acked: dict[int, list[tuple[int, bytes, bytes]]] = {}

    def on_delivery(err, msg):
        if err is None:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.key(), msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 1,
            "message.timeout.ms": 5000,
        }
    )
    # Keep producing while the broker is killed: some records are acked, some are not.
    for i in range(3000):
        producer.produce("durable", key=b"k%d" % i, value=b"value-%d" % i, on_delivery=on_delivery)
        if i % 100 == 0:
            producer.poll(0)
        if i == 2000:
            producer.flush(10)
            broker.kill9()
    producer.flush(10)
    acked_count = sum(len(v) for v in acked.values())
    assert acked_count >= 2001

    port = broker.port
    restarted = start_broker(data_dir=data_dir, port=port)
    got = consume_all(restarted.bootstrap, "durable", 4, acked_count)
    for partition, records in acked.items():
        stored = {offset: (k, v) for offset, k, v in got.get(partition, [])}
        for offset, key, value in records:
            assert stored.get(offset) == (key, value), (partition, offset)
    # offsets dense from 0 in every partition
    for partition, records in got.items():
        assert [o for o, _k, _v in records] == list(range(len(records))), partition


def test_restart_keeps_offsets_and_continues_them(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir=data_dir)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce("restart", value=b"a%d" % i)
    assert producer.flush(10) == 0
    broker.stop()
    restarted = start_broker(data_dir=data_dir, port=broker.port)
    producer = Producer({"bootstrap.servers": restarted.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce("restart", value=b"b%d" % i)
    assert producer.flush(10) == 0
    got = consume_all(restarted.bootstrap, "restart", 1, 100)
    assert [v for _o, _k, v in got[0]] == [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]
    assert [o for o, _k, _v in got[0]] == list(range(100))
