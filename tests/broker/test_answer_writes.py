"""A connection writes the answers that are ready together in one write, in request
order: a flush answers every Produce of a connection that it holds at once."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker import connection
from broker.testing import running_broker

MESSAGES = 400


def test_the_answers_of_one_flush_go_out_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = 0
    writes = 0
    real_handle, real_send = connection._handle_frame, connection.send_frame

    async def handle(*args: Any) -> Any:
        nonlocal requests
        requests += 1
        return await real_handle(*args)

    async def send(stream: Any, frame: Any) -> None:
        nonlocal writes
        writes += 1
        await real_send(stream, frame)

    monkeypatch.setattr(connection, "_handle_frame", handle)
    monkeypatch.setattr(connection, "send_frame", send)
    with running_broker(flush_interval_ms=20) as broker:
        # Every message a request of its own, many in flight, each answered after its
        # flush: the requests that arrive while a flush is in flight share the next one.
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
             "batch.num.messages": 1, "enable.idempotence": False}
        )  # fmt: skip
        delivered: list[int] = []

        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            delivered.append(int(msg.value()))

        for i in range(MESSAGES):
            producer.produce("answers", str(i).encode(), partition=0, on_delivery=on_delivery)
            producer.poll(0)
        assert producer.flush(30) == 0
        assert delivered == list(range(MESSAGES))  # acknowledged in order
        produced = (requests, writes)

        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "answers"})
        try:
            consumer.assign([TopicPartition("answers", 0, 0)])
            read: list[int] = []
            while len(read) < MESSAGES:
                msg = consumer.poll(10)
                assert msg is not None and msg.error() is None, msg and msg.error()
                read.append(int(msg.value()))
            assert read == list(range(MESSAGES))
        finally:
            consumer.close()
    requests, writes = produced
    print(f"{requests} requests, {writes} writes of answers")
    assert requests > MESSAGES  # every request had an answer (acks=all) ...
    assert writes < requests * 0.8, (requests, writes)  # ... many of them written together
