"""Ripcord mode (`serve --ripcord`, broker/ripcord.py): the metadata store made
unreachable (faulty+sqlite://...?unavailable_when=FILE) while producers write.

- Producers of a classic topic see no error and are answered the whole time; every
  acknowledged record is readable once the store is back; coordinator requests get a
  retriable error meanwhile, and a group consumer that joins during the outage reads
  everything once it is over, without a restart of anything.
- An agent started while the store is down starts from the snapshot in the object store
  and accepts produces.

`BUCKETLOG_RIPCORD_OUTAGE_S` sets the outage's length (default 6 s).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.e2e.wire import WireClient, init_producer_id
from tests.support.brokerproc import BrokerProcess

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

OUTAGE_S = float(os.environ.get("BUCKETLOG_RIPCORD_OUTAGE_S", "6"))


def ripcord_args(tmp_path: Path, switch: Path) -> list[str]:
    return [
        "--ripcord",
        "--metadata",
        f"faulty+sqlite://{tmp_path}/metadata.db?unavailable_when={switch}",
        "--journal-sweep-interval-ms",
        "500",
        "--journal-idle-ms",
        "1000",
    ]


def wait_for_snapshot(broker: BrokerProcess, topic: str) -> None:
    """Until the object store's snapshot names the topic (rewritten every 5 s)."""
    path = broker.data_dir / "objects" / "ripcord" / "snapshot.json"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if topic in {t["name"] for t in json.loads(path.read_text())["topics"]}:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"no snapshot naming {topic} in {path}")


def init_producer_id_error(bootstrap: str) -> ErrorCode:
    with WireClient(bootstrap) as client:
        return ErrorCode(init_producer_id(client).error_code)


def wait_until(condition, timeout: float = 15.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Writer(threading.Thread):
    """A producer without idempotence writing `rate` records a second to `topic`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float = 100) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.stopping = threading.Event()
        self.acked: list[tuple[bytes, float]] = []  # value, when the acknowledgement came
        self.errors: list[str] = []
        self.pending = -1

    def _delivered(self, err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked.append((msg.value(), time.monotonic()))

    def run(self) -> None:
        began, sent = time.monotonic(), 0
        while not self.stopping.is_set():
            if sent >= (time.monotonic() - began) * self.rate:
                self.producer.poll(0.01)
                continue
            self.producer.produce(
                self.topic,
                value=b"r%06d" % sent,
                partition=sent % self.partitions,
                on_delivery=self._delivered,
            )
            sent += 1
            self.producer.poll(0)
        self.pending = self.producer.flush(90)


def read_all(bootstrap: str, topic: str, partitions: int, want: set[bytes]) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ripcord-read"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        deadline = time.monotonic() + 90
        while not want <= set(values) and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.2):
                if m.error() is None:
                    values.append(m.value())
        return values
    finally:
        consumer.close()


def test_producers_write_through_a_metadata_outage_and_everything_is_read_after(
    start_broker, tmp_path
):
    switch = tmp_path / "metadata-down"
    # Two agents: each answers its partitions from what it remembers.
    broker = start_broker(agents=2, extra_args=ripcord_args(tmp_path, switch))
    topic, partitions = "ripcord", 3
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    wait_for_snapshot(broker, topic)
    writer = Writer(broker.bootstrap, topic, partitions)
    writer.start()
    try:
        wait_until(lambda: len(writer.acked) >= 50, what="acknowledgements before the outage")
        switch.touch()
        wait_until(
            lambda: all(
                broker.stats(port).get("ripcord", {}).get("metadata_reachable") is False
                for port in broker.ports
            ),
            what="the agents to notice the outage",
        )
        down_at = time.monotonic()
        # What needs the store gets a retriable error; produces go on. A group consumer
        # that joins now gets nothing, and no fatal error, until the store is back.
        assert init_producer_id_error(broker.bootstrap) == ErrorCode.coordinator_not_available
        group = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "ripcord-group",
                "auto.offset.reset": "earliest",
            }
        )
        group.subscribe([topic])
        consumed: list[bytes] = []
        while time.monotonic() - down_at < OUTAGE_S:
            for m in group.consume(100, timeout=0.2):
                if m.error() is None:
                    consumed.append(m.value())
                else:
                    assert not m.error().fatal(), m.error()
        backlog = sum(broker.stats(port)["journal"]["backlog_objects"] for port in broker.ports)
        switch.unlink()
        up_at = time.monotonic()
        during = [v for v, at in writer.acked if down_at < at < up_at]
        # Answered all along: at least half the outage's records, acknowledged in it.
        assert len(during) >= OUTAGE_S * writer.rate / 2, len(during)
        assert backlog > 0  # answered, waiting for the store to be sequenced
        wait_until(
            lambda: all(
                broker.stats(port).get("ripcord", {}).get("metadata_reachable") is True
                for port in broker.ports
            ),
            what="the agents to find the store again",
        )
        assert init_producer_id_error(broker.bootstrap) == ErrorCode.none
        time.sleep(1)
    finally:
        writer.stopping.set()
        writer.join(120)
    assert writer.errors == []
    assert writer.pending == 0
    acked = {v for v, _at in writer.acked}
    # The consumer that joined during the outage reads everything once it is over.
    deadline = time.monotonic() + 90
    while not acked <= set(consumed) and time.monotonic() < deadline:
        for m in group.consume(500, timeout=0.2):
            if m.error() is None:
                consumed.append(m.value())
    group.close()
    assert acked <= set(consumed), f"{len(acked - set(consumed))} acknowledged records missing"
    wait_until(
        lambda: all(broker.stats(p)["journal"]["backlog_objects"] == 0 for p in broker.ports),
        what="the backlog to drain",
    )
    assert "Traceback" not in broker.log_text()


def test_an_agent_started_while_the_store_is_down_accepts_produces(start_broker, tmp_path):
    switch = tmp_path / "metadata-down"
    args = ripcord_args(tmp_path, switch)
    first = start_broker(extra_args=args)
    topic = "ripcord-start"
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    wait_for_snapshot(first, topic)
    switch.touch()
    wait_until(
        lambda: first.stats().get("ripcord", {}).get("metadata_reachable") is False,
        what="the agent to notice the outage",
    )
    first.stop()
    second = start_broker(extra_args=args, data_dir=first.data_dir, port=first.port)
    assert "from the Ripcord snapshot" in second.log_text()
    producer = Producer(
        {"bootstrap.servers": second.bootstrap, "acks": "all", "enable.idempotence": False}
    )
    errors: list[str | None] = []
    for i in range(20):
        producer.produce(
            topic,
            value=b"s%d" % i,
            partition=i % 2,
            on_delivery=lambda err, _msg: errors.append(None if err is None else str(err)),
        )
    # Answered while the store is still down: durable in the journal, sequenced later.
    assert producer.flush(30) == 0
    assert errors == [None] * 20
    assert switch.exists()
    switch.unlink()
    values = read_all(second.bootstrap, topic, 2, {b"s%d" % i for i in range(20)})
    assert sorted(values) == sorted(b"s%d" % i for i in range(20))
