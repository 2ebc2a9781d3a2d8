"""Several agents sharing one data dir are one cluster: any agent serves any partition."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP


def produce_direct(port: int, topic: str, prefix: bytes, count: int) -> list[int]:
    """kafka-python bootstrapped on one agent; partition 0 is whatever agent leads it,
    so force the connection by reading metadata from that agent only."""
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all", linger_ms=1)
    futures = [producer.send(topic, value=prefix + b"%d" % i, partition=0) for i in range(count)]
    producer.flush(30)
    offsets = [f.get(10).offset for f in futures]
    producer.close()
    return offsets


def test_two_agents_appear_as_two_brokers(start_broker):
    broker = start_broker(agents=2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = admin.list_topics(timeout=10)
    assert sorted(b.port for b in md.brokers.values()) == broker.ports


def test_producers_on_both_agents_get_unique_dense_offsets(start_broker):
    broker = start_broker(agents=2, extra_args=["--default-partitions", "1"])
    # Raw Produce requests to each agent, both for partition 0: no client routing involved.
    from tests.e2e.rawclient import produce_raw

    results: dict[int, list[int]] = {}

    def worker(port: int) -> None:
        results[port] = [
            produce_raw(port, "shared", 0, [(b"k", b"agent-%d-%d" % (port, i))]) for i in range(100)
        ]

    threads = [threading.Thread(target=worker, args=(p,)) for p in broker.ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    offsets = sorted(o for port in broker.ports for o in results[port])
    assert offsets == list(range(200))
    # a consumer on each agent reads all 200 records, in the same order
    seen = []
    for port in broker.ports:
        consumer = KafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{port}", enable_auto_commit=False, consumer_timeout_ms=5000
        )
        consumer.assign([KTP("shared", 0)])
        consumer.seek(KTP("shared", 0), 0)
        records = []
        deadline = time.monotonic() + 30
        while len(records) < 200 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend((r.offset, r.value) for r in batch)
        consumer.close()
        assert [o for o, _v in records] == list(range(200))
        seen.append(records)
    assert seen[0] == seen[1]
    for port in broker.ports:
        mine = {v for _o, v in seen[0] if v.startswith(b"agent-%d-" % port)}
        assert len(mine) == 100


def test_consumer_on_one_agent_reads_what_the_other_agent_wrote(start_broker):
    broker = start_broker(agents=2)
    port_a, port_b = broker.ports
    from tests.e2e.rawclient import produce_raw

    offsets = [produce_raw(port_a, "cross", 0, [(None, b"from-a-%d" % i)]) for i in range(20)]
    assert offsets == list(range(20))
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port_b}", "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("cross", 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [b"from-a-%d" % i for i in range(20)]


def test_long_poll_on_one_agent_wakes_for_a_write_on_the_other(start_broker):
    broker = start_broker(agents=2)
    port_a, port_b = broker.ports
    from tests.e2e.rawclient import fetch_raw, produce_raw

    produce_raw(port_a, "wake", 0, [(None, b"first")])
    result: dict[str, object] = {}

    def waiter() -> None:
        start = time.monotonic()
        result["records"] = fetch_raw(port_b, "wake", 0, offset=1, max_wait_ms=10_000)
        result["waited"] = time.monotonic() - start

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(1.0)
    produce_raw(port_a, "wake", 0, [(None, b"second")])
    t.join(15)
    assert result["records"] == [(1, b"second")]
    assert result["waited"] < 5.0  # woken by the write, not by the 10 s max wait


def test_kafka_python_producer_across_agents(start_broker):
    broker = start_broker(agents=2)
    offsets = produce_direct(broker.ports[1], "kp", b"x", 30)
    assert offsets == list(range(30))
    _ = Producer  # confluent producer covered elsewhere
