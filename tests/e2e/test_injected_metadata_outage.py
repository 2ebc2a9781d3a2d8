"""A metadata outage injected through the metadata URL (faulty+sqlite://...?
unavailable_when=FILE, metadata/injected_kv.py): while the file exists, a classic
produce is answered with a retriable error; once it is removed, produce works again in
the same agent process, and a producer that kept retrying meanwhile gets its records
delivered, once."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from protocol.records import build_batch
from tests.e2e.wire import WireClient, produce

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

TOPIC = "outage"


def produce_one(client: WireClient, value: bytes) -> ErrorCode:
    answer = produce(client, {TOPIC: {0: build_batch([(None, value, [], 0)])}})
    return ErrorCode(answer[TOPIC, 0].error_code)


def read_values(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "outage-read"})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(values) < count and time.monotonic() < deadline:
            for m in consumer.consume(100, timeout=0.2):
                assert m.error() is None, m.error()
                values.append(m.value())
        return values
    finally:
        consumer.close()


def test_a_classic_produce_fails_retriably_while_the_switch_is_on_and_works_after(
    start_broker, tmp_path
):
    switch = tmp_path / "metadata-down"
    broker = start_broker(
        extra_args=[
            "--metadata",
            f"faulty+sqlite://{tmp_path}/metadata.db?unavailable_when={switch}",
        ]
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(30)
    pid = broker.proc.pid
    with WireClient(broker.bootstrap) as client:
        assert produce_one(client, b"before") == ErrorCode.none

        switch.touch()
        # The batch is uploaded, its commit fails: KAFKA_STORAGE_ERROR, which clients
        # retry. (The topic was read just before: the agent has it cached for 1 s.)
        error = produce_one(client, b"refused")
        assert error == ErrorCode.kafka_storage_error and error.retriable

    # A real producer keeps retrying through the outage; nothing is delivered before the
    # switch is removed.
    delivered: list[tuple[object, bytes]] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 30_000,
            "retry.backoff.ms": 100,
        }
    )
    producer.produce(TOPIC, b"during", on_delivery=lambda err, msg: delivered.append((err, msg)))
    waited_until = time.monotonic() + 2.0
    while time.monotonic() < waited_until:
        producer.poll(0.1)
    assert delivered == []

    switch.unlink()
    assert producer.flush(25) == 0
    assert len(delivered) == 1 and delivered[0][0] is None
    with WireClient(broker.bootstrap) as client:
        assert produce_one(client, b"after") == ErrorCode.none

    assert broker.proc.poll() is None and broker.proc.pid == pid  # the same process
    assert read_values(broker.bootstrap, 3) == [b"before", b"during", b"after"]
