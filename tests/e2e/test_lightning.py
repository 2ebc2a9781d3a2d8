"""Lightning topics (bucketlog.topic.type=lightning, broker/journal.py): a produce is
answered as soon as its object is durable, with offset -1, and sequenced right after;
consumers read every answered record once it is sequenced, exactly once. Idempotent
producers keep their rules; transactions are refused; an agent killed between the
answer and the sequencing loses nothing, because the journal sweep of the next agent
sequences what it left."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kio.schema.errors import ErrorCode

from protocol.records import build_batch, iter_batches, iter_records
from tests.e2e.wire import WireClient, fetch, init_producer_id, produce
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = pytest.mark.slow

TS = 1_700_000_000_000
LIGHTNING = {"bucketlog.topic.type": "lightning"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("lightning") / "data"
    process = BrokerProcess(
        data_dir=data, port=free_ports(1)[0], extra_args=["--auto-create-topics", "false"]
    )
    try:
        yield process.start()
    finally:
        process.stop()


def create(bootstrap: str, partitions: int = 1, configs: dict | None = None) -> str:
    name = f"lt-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = LIGHTNING if configs is None else configs
    admin.create_topics([NewTopic(name, partitions, config=configs)])[name].result(30)
    return name


def alter(bootstrap: str, topic: str, topic_type: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic, set_config={"bucketlog.topic.type": topic_type})
    admin.alter_configs([resource])[resource].result(30)


def read_all(
    bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 20.0
) -> list[tuple]:
    """(partition, offset, value) of every record, from offset 0, until `count` came (or
    `timeout` s), then a little longer so that a duplicate would show."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "lt-read", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple] = []
        deadline = time.monotonic() + timeout
        quiet_until = None
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.2):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.value()))
            if len(got) >= count:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
        return got
    finally:
        consumer.close()


def in_order(got: list[tuple]) -> dict[int, list[bytes]]:
    by_partition: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for partition, offset, value in got:
        by_partition[partition].append((offset, value))
    return {p: [v for _o, v in sorted(rows)] for p, rows in by_partition.items()}


def test_producers_are_answered_before_offsets_and_every_record_is_read_once(broker):
    from kafka import KafkaProducer

    topic = create(broker.bootstrap, partitions=3)
    sent: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    reports: list[tuple] = []
    for name, idempotent in (("idem", True), ("plain", False)):
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "enable.idempotence": idempotent,
                "acks": "all",
                "linger.ms": 2,
            }
        )
        for i in range(300):
            value = b"%s-%d" % (name.encode(), i)
            sent[name].append((i % 3, value))
            producer.produce(
                topic,
                value=value,
                partition=i % 3,
                on_delivery=lambda err, msg: reports.append((err, msg.offset())),
            )
        assert producer.flush(30) == 0
    assert len(reports) == 600 and all(err is None for err, _offset in reports)
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    futures = []
    for i in range(100):
        value = b"kp-%d" % i
        sent["kp"].append((i % 3, value))
        futures.append(kp.send(topic, value=value, partition=i % 3))
    kp.flush(30)
    # Kafka's answer when the offset is not known: -1.
    assert {f.get(30).offset for f in futures} == {-1}
    kp.close()

    got = read_all(broker.bootstrap, topic, 3, 700)
    assert sorted(v for _p, _o, v in got) == sorted(v for rows in sent.values() for _p, v in rows)
    partitions = in_order(got)
    for name, rows in sent.items():  # each producer's order, in every partition
        for p in range(3):
            mine = [v for v in partitions[p] if v.startswith(name.encode() + b"-")]
            assert mine == [v for q, v in rows if q == p], (name, p)
    for p in range(3):  # offsets dense from 0
        assert sorted(o for q, o, _v in got if q == p) == list(range(len(partitions[p])))


def test_the_topic_type_is_checked_described_and_altered_at_run_time(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = f"lt-bad-{uuid.uuid4().hex[:8]}"
    future = admin.create_topics([NewTopic(name, 1, config={"bucketlog.topic.type": "fast"})])
    with pytest.raises(Exception, match="INVALID_CONFIG"):
        future[name].result(30)
    topic = create(broker.bootstrap, configs={})
    resource = ConfigResource("topic", topic)
    entry = admin.describe_configs([resource])[resource].result(30)["bucketlog.topic.type"]
    assert (entry.value, entry.is_default) == ("classic", True)

    with WireClient(broker.bootstrap) as client:

        def send(i: int) -> int:
            batch = build_batch([(None, b"v%d" % i, [], TS)])
            answer = produce(client, {topic: {0: batch}})[topic, 0]
            assert answer.error_code == ErrorCode.none
            return int(answer.base_offset)

        assert [send(i) for i in range(5)] == [0, 1, 2, 3, 4]
        alter(broker.bootstrap, topic, "lightning")
        time.sleep(1.2)  # the agent's topic cache
        assert [send(i) for i in range(5, 10)] == [-1] * 5
        alter(broker.bootstrap, topic, "classic")
        time.sleep(1.2)
        # Classic again: these wait for the lightning batches to be sequenced first.
        assert [send(i) for i in range(10, 15)] == [10, 11, 12, 13, 14]
        entry = admin.describe_configs([resource])[resource].result(30)["bucketlog.topic.type"]
        assert entry.value == "classic"
        values = [r.value for view in iter_batches(fetch(client, topic, 0, 0).records)
                  for r in iter_records(view)]  # fmt: skip
        assert values == [b"v%d" % i for i in range(15)]


def new_producer(client: WireClient, transactional_id: str | None = None) -> tuple[int, int]:
    answer = init_producer_id(client, transactional_id)
    assert answer.error_code == ErrorCode.none
    return int(answer.producer_id), int(answer.producer_epoch)


def test_idempotent_rules_hold_when_answering_before_sequencing(broker):
    topic = create(broker.bootstrap)
    with WireClient(broker.bootstrap) as client:
        pid, epoch = new_producer(client)

        def send(seq: int, count: int = 1, epoch: int = epoch):
            batch = build_batch(
                [(None, b"s%d" % (seq + i), [], TS) for i in range(count)],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
            )
            answer = produce(client, {topic: {0: batch}})[topic, 0]
            return ErrorCode(answer.error_code), int(answer.base_offset)

        assert send(0, 2) == (ErrorCode.none, -1)
        assert send(0, 2) == (ErrorCode.none, -1)  # a retry: answered, written once
        # Ahead of what is known: the batches between may have been answered by another
        # agent, so a retriable error (OUT_OF_ORDER_SEQUENCE_NUMBER would make the
        # producer resend its unanswered batches under a new epoch).
        assert send(5)[0] == ErrorCode.not_leader_or_follower
        assert send(2) == (ErrorCode.none, -1)
        # Behind it and not a retry of a known batch: out of order, whatever was answered
        # elsewhere.
        assert send(1)[0] == ErrorCode.out_of_order_sequence_number
        assert send(3, epoch=epoch - 1 if epoch > 0 else 32767)[0] in (
            ErrorCode.invalid_producer_epoch,
            ErrorCode.out_of_order_sequence_number,
        )
        deadline = time.monotonic() + 10
        while True:
            records = fetch(client, topic, 0, 0).records
            values = [r.value for v in iter_batches(records or b"") for r in iter_records(v)]
            if len(values) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        values = [
            r.value
            for v in iter_batches(fetch(client, topic, 0, 0).records or b"")
            for r in iter_records(v)
        ]
        assert values == [b"s0", b"s1", b"s2"]


def test_transactional_batches_are_refused_with_a_clear_error(broker):
    topic = create(broker.bootstrap)
    with WireClient(broker.bootstrap) as client:
        pid, epoch = new_producer(client, f"tx-{uuid.uuid4().hex[:6]}")
        batch = build_batch(
            [(None, b"t", [], TS)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        answer = produce(client, {topic: {0: batch}}, transactional_id="tx")[topic, 0]
        assert answer.error_code == ErrorCode.invalid_txn_state
        assert "lightning" in (answer.error_message or "")
        time.sleep(0.5)
        assert not fetch(client, topic, 0, 0).records


def test_an_agent_killed_between_answer_and_sequencing_loses_nothing(tmp_path):
    data = tmp_path / "data"
    port = free_ports(1)[0]
    sweep = ["--journal-sweep-interval-ms", "300", "--journal-idle-ms", "500"]
    first = BrokerProcess(
        data_dir=data,
        port=port,
        extra_args=sweep,
        env={"BUCKETLOG_FAULT_POINTS": "journal.commit_never@1"},
    ).start()
    try:
        topic = create(first.bootstrap, partitions=2)
        producer = Producer(
            {"bootstrap.servers": first.bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        errors = []
        for i in range(40):
            producer.produce(
                topic,
                value=b"k%d" % i,
                partition=i % 2,
                on_delivery=lambda err, msg: errors.append(err),
            )
        assert producer.flush(30) == 0 and errors == [None] * 40
        time.sleep(0.5)
        # Answered, not sequenced: nothing to read for 2 s (the sweep runs every 0.3 s,
        # and leaves a live process's own sequences to it).
        assert read_all(first.bootstrap, topic, 2, 1, timeout=2.0) == []
        assert first.object_keys("journal/"), "the answered objects are in the store"
    finally:
        first.kill9()
    again = BrokerProcess(data_dir=data, port=port, extra_args=sweep).start()
    try:
        got = read_all(again.bootstrap, topic, 2, 40)
        assert sorted(v for _p, _o, v in got) == sorted(b"k%d" % i for i in range(40))
        assert in_order(got) == {p: [b"k%d" % i for i in range(p, 40, 2)] for p in range(2)}
        deadline = time.monotonic() + 5
        while again.stats().get("journal", {}).get("swept_objects", 0) == 0:
            assert time.monotonic() < deadline, "the sweep's objects are not counted"
            time.sleep(0.1)
    finally:
        again.stop()
