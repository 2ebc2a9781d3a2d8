"""The `kafka_broker` fixture (broker.pytest_plugin), used as another project would: a
tiny test suite run by pytest in a subprocess, the plugin found through its entry point;
and `running_broker` for code without pytest."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from broker.testing import running_broker

pytest_plugins = ["pytester"]

A_PROJECTS_TESTS = """
import asyncio

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient


def produce(bootstrap, topic, n):
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0


def test_confluent_kafka_round_trip(kafka_broker):
    produce(kafka_broker.bootstrap, "demo", 5)
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "g",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["demo"])
    got = []
    while len(got) < 5:
        msg = consumer.poll(5)
        assert msg is not None and msg.error() is None
        got.append(msg.value())
    consumer.close()
    assert got == [b"0", b"1", b"2", b"3", b"4"]


def test_aiokafka_on_a_fresh_broker(kafka_broker):
    topics = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=10)
    assert "demo" not in topics.topics  # the last test's broker is gone
    produce(kafka_broker.bootstrap, "demo2", 3)

    async def consume():
        consumer = AIOKafkaConsumer("demo2", bootstrap_servers=kafka_broker.bootstrap,
                                    group_id="g", auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = []
            while len(got) < 3:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    got += [r.value for r in records]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(consume(), 30)) == [b"0", b"1", b"2"]
"""


def test_another_projects_suite_uses_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_with_kafka=A_PROJECTS_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=120)
    result.assert_outcomes(passed=2)


def test_running_broker_serves_and_stops() -> None:
    with running_broker(default_partitions=2) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce("t", value=b"x")
        assert producer.flush(10) == 0
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        assert len(admin.list_topics(timeout=10).topics["t"].partitions) == 2
        data_dir = broker.data_dir
    assert not data_dir.exists()  # its temporary folder went with it


def test_unknown_options_are_refused() -> None:
    with pytest.raises(TypeError, match="flush_intervall_ms"):
        with running_broker(flush_intervall_ms=5):
            pass
