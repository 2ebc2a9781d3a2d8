"""Transactions end to end with real clients: commit/abort visibility, fencing, timeouts."""

from __future__ import annotations

import json
import random
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.brokerproc import BrokerProcess, free_ports

# Transaction semantics are the coordinator's and the metadata store's: the S3 store is
# covered by the compaction, cleaning and lifecycle tests of aborted transactions.
pytestmark = pytest.mark.store_independent


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory):
    data = tmp_path_factory.mktemp("txn") / "data"
    broker = BrokerProcess(data_dir=data, port=free_ports(1)[0]).start()
    yield broker
    broker.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, settle: float = 2.0):
    """Every record of the topic as (partition, offset, value), read until quiet."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    quiet_since = time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() - quiet_since < settle and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append((msg.partition(), msg.offset(), msg.value()))
        quiet_since = time.monotonic()
    consumer.close()
    return sorted(out)


def txn_producer(bootstrap: str, tid: str, **extra) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **extra})
    producer.init_transactions(15)
    return producer


def test_commit_and_abort_visibility_across_topics(txn_broker):
    bs = txn_broker.bootstrap
    create_topic(bs, "tx-a", 3)
    create_topic(bs, "tx-b", 2)
    producer = txn_producer(bs, "vis")
    producer.begin_transaction()
    for i in range(6):
        producer.produce("tx-a", value=b"commit-a-%d" % i, partition=i % 3)
        producer.produce("tx-b", value=b"commit-b-%d" % i, partition=i % 2)
    producer.commit_transaction(15)
    producer.begin_transaction()
    for i in range(6):
        producer.produce("tx-a", value=b"abort-a-%d" % i, partition=i % 3)
        producer.produce("tx-b", value=b"abort-b-%d" % i, partition=i % 2)
    producer.flush(15)  # the aborted records really reach the log
    producer.abort_transaction(15)

    for topic, parts in (("tx-a", 3), ("tx-b", 2)):
        committed = [v for _p, _o, v in read_all(bs, topic, parts, "read_committed")]
        everything = [v for _p, _o, v in read_all(bs, topic, parts, "read_uncommitted")]
        letter = topic[-1].encode()
        assert sorted(committed) == sorted(b"commit-%s-%d" % (letter, i) for i in range(6))
        assert sorted(everything) == sorted(
            [b"commit-%s-%d" % (letter, i) for i in range(6)]
            + [b"abort-%s-%d" % (letter, i) for i in range(6)]
        )


def test_randomized_transactions_read_committed_is_exactly_the_committed_set(txn_broker):
    bs = txn_broker.bootstrap
    topic, partitions = "tx-random", 8
    create_topic(bs, topic, partitions)
    rng = random.Random(20261122)
    transactional = txn_producer(bs, "random")
    plain = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 1})
    expected: set[bytes] = set()
    everything: set[bytes] = set()
    for t in range(200):
        transactional.begin_transaction()
        values = []
        for i in range(rng.randint(1, 4)):
            value = b"t%d-%d" % (t, i)
            transactional.produce(topic, value=value, partition=rng.randrange(partitions))
            values.append(value)
        if rng.random() < 0.3:
            value = b"plain-%d" % t
            plain.produce(topic, value=value, partition=rng.randrange(partitions))
            expected.add(value)
            everything.add(value)
        transactional.flush(15)
        everything.update(values)
        if rng.random() < 0.5:
            transactional.commit_transaction(15)
            expected.update(values)
        else:
            transactional.abort_transaction(15)
    assert plain.flush(15) == 0
    committed = read_all(bs, topic, partitions, "read_committed")
    assert {v for _p, _o, v in committed} == expected
    assert len(committed) == len(expected)  # no duplicates
    # in offset order per partition: offsets strictly increase in what was returned
    for p in range(partitions):
        offsets = [o for pp, o, _v in committed if pp == p]
        assert offsets == sorted(set(offsets))
    uncommitted = read_all(bs, topic, partitions, "read_uncommitted")
    assert {v for _p, _o, v in uncommitted} == everything


def test_a_second_producer_fences_the_first(txn_broker):
    bs = txn_broker.bootstrap
    create_topic(bs, "tx-fence", 1)
    first = txn_producer(bs, "zombie")
    first.begin_transaction()
    first.produce("tx-fence", value=b"zombie-1")
    first.flush(10)
    second = txn_producer(bs, "zombie")  # bumps the epoch, aborts the open transaction
    second.begin_transaction()
    second.produce("tx-fence", value=b"second")
    second.commit_transaction(15)
    with pytest.raises(KafkaException) as fenced:
        first.produce("tx-fence", value=b"zombie-2")
        first.commit_transaction(15)
    error = fenced.value.args[0]
    assert error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    values = [v for _p, _o, v in read_all(bs, "tx-fence", 1, "read_committed")]
    assert values == [b"second"]


def test_transaction_left_open_is_aborted_at_its_timeout(txn_broker):
    bs = txn_broker.bootstrap
    create_topic(bs, "tx-timeout", 1)
    stuck = txn_producer(bs, "stuck", **{"transaction.timeout.ms": 2000})
    stuck.begin_transaction()
    stuck.produce("tx-timeout", value=b"never-committed")
    stuck.flush(10)
    plain = Producer({"bootstrap.servers": bs, "acks": "all"})
    plain.produce("tx-timeout", value=b"after")
    plain.flush(10)
    consumer = Consumer(
        {"bootstrap.servers": bs, "group.id": "lso", "isolation.level": "read_committed"}
    )
    # While the transaction is open, the last stable offset holds at its first offset.
    _low, high = consumer.get_watermark_offsets(TopicPartition("tx-timeout", 0), timeout=10)
    assert high == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _low, high = consumer.get_watermark_offsets(TopicPartition("tx-timeout", 0), timeout=10)
        if high > 0:
            break
        time.sleep(0.25)
    consumer.close()
    assert high == 3  # record, the plain record, and the abort marker
    values = [v for _p, _o, v in read_all(bs, "tx-timeout", 1, "read_committed")]
    assert values == [b"after"]


def test_kafka_python_transactional_producer(txn_broker):
    from kafka import KafkaProducer

    bs = txn_broker.bootstrap
    create_topic(bs, "tx-kp", 2)
    producer = KafkaProducer(bootstrap_servers=bs, transactional_id="kp-tx")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.send("tx-kp", value=b"kc%d" % i, partition=i % 2)
    producer.commit_transaction()
    producer.begin_transaction()
    for i in range(5):
        producer.send("tx-kp", value=b"ka%d" % i, partition=i % 2)
    producer.flush()
    producer.abort_transaction()
    producer.close()
    committed = sorted(v for _p, _o, v in read_all(bs, "tx-kp", 2, "read_committed"))
    assert committed == [b"kc%d" % i for i in range(5)]


async def test_aiokafka_transactional_producer(txn_broker):
    from aiokafka import AIOKafkaProducer

    bs = txn_broker.bootstrap
    create_topic(bs, "tx-aio", 2)
    producer = AIOKafkaProducer(bootstrap_servers=bs, transactional_id="aio-tx")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(5):
                await producer.send_and_wait("tx-aio", value=b"ac%d" % i, partition=i % 2)
        await producer.begin_transaction()
        for i in range(5):
            await producer.send_and_wait("tx-aio", value=b"aa%d" % i, partition=i % 2)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    committed = sorted(v for _p, _o, v in read_all(bs, "tx-aio", 2, "read_committed"))
    assert committed == [b"ac%d" % i for i in range(5)]


def test_consume_transform_produce_exactly_once_across_kill_9(txn_broker, tmp_path):
    import subprocess
    import sys

    bs = txn_broker.bootstrap
    partitions, total = 4, 3000
    create_topic(bs, "input", partitions)
    create_topic(bs, "output", partitions)
    source = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5})
    for i in range(total):
        source.produce("input", key=b"k%d" % i, value=b"value-%d" % i, partition=i % partitions)
    assert source.flush(30) == 0

    app = [sys.executable, "-m", "tests.e2e.ctp_app", bs, "150"]
    log = open(tmp_path / "app.log", "w+")
    first = subprocess.Popen(app, stdout=subprocess.PIPE, stderr=log, text=True)
    # Let it commit a few transactions, then kill it without warning.
    committed = 0
    deadline = time.monotonic() + 60
    while committed < 500 and time.monotonic() < deadline:
        line = first.stdout.readline()
        if line.startswith("committed"):
            committed = int(line.split()[1])
    first.kill()
    first.wait(10)
    assert 0 < committed < total, committed

    second = subprocess.run(app, stderr=log, stdout=subprocess.DEVNULL, timeout=180)
    assert second.returncode == 0, (tmp_path / "app.log").read_text()
    out = read_all(bs, "output", partitions, "read_committed")
    values = sorted(v for _p, _o, v in out)
    assert values == sorted(b"VALUE-%d" % i for i in range(total))


def test_describe_and_list_transactions_and_producers(txn_broker):
    from kio.index import load_request_schema

    from broker.entities import build
    from tests.e2e.rawclient import roundtrip

    bs = txn_broker.bootstrap
    create_topic(bs, "tx-describe", 2)
    producer = txn_producer(bs, "described", **{"transaction.timeout.ms": 60000})
    producer.begin_transaction()
    producer.produce("tx-describe", value=b"open", partition=1)
    producer.flush(10)

    described = roundtrip(
        txn_broker.port,
        build(load_request_schema(65, 0), {"transactional_ids": ["described"]}),
    ).transaction_states
    assert described[0].error_code == 0
    assert described[0].transaction_state == "Ongoing"
    assert described[0].transaction_timeout.total_seconds() == 60
    assert [(t.topic, list(t.partitions)) for t in described[0].topics] == [("tx-describe", [1])]

    listed = roundtrip(
        txn_broker.port,
        build(
            load_request_schema(66, 1),
            {
                "state_filters": ["Ongoing", "Bogus"],
                "producer_id_filters": [],
                "duration_filter": -1,
            },
        ),
    )
    assert "described" in {t.transactional_id for t in listed.transaction_states}
    assert all(t.transaction_state == "Ongoing" for t in listed.transaction_states)
    assert list(listed.unknown_state_filters) == ["Bogus"]

    producers = (
        roundtrip(
            txn_broker.port,
            build(
                load_request_schema(61, 0),
                {"topics": [{"name": "tx-describe", "partition_indexes": [0, 1]}]},
            ),
        )
        .topics[0]
        .partitions
    )
    assert list(producers[0].active_producers) == []
    (active,) = producers[1].active_producers
    assert active.producer_id == described[0].producer_id
    assert active.current_txn_start_offset == 0
    producer.abort_transaction(15)


def _metadata_stats(broker: BrokerProcess) -> dict[str, int]:
    """The agent's metadata counters, once its stats file has caught up (written each second)."""
    time.sleep(1.5)
    stats = json.loads((broker.data_dir / f"stats-{broker.port}.json").read_text())
    return stats["metadata"]


def test_read_committed_past_more_aborted_transactions_than_a_quick_read_takes(txn_broker):
    """A Fetch from offset 0 must list all 100 aborted transactions, more than a metadata
    read on the event loop may take (64 markers); it reads them in a thread instead."""
    bs = txn_broker.bootstrap
    create_topic(bs, "tx-many", 1)
    producer = txn_producer(bs, "many")
    expected = []
    for t in range(150):
        producer.begin_transaction()
        value = b"many-%d" % t
        producer.produce("tx-many", value=value, partition=0)
        producer.flush(15)
        if t % 3 == 0:
            producer.commit_transaction(15)
            expected.append(value)
        else:
            producer.abort_transaction(15)
    before = _metadata_stats(txn_broker)
    committed = read_all(bs, "tx-many", 1, "read_committed")
    assert [v for _p, _o, v in committed] == expected
    after = _metadata_stats(txn_broker)
    if "quick_reads" in before:  # SQLite: the long read went to a thread
        assert after["reads"] - after["quick_reads"] > before["reads"] - before["quick_reads"]


def test_read_committed_fetches_read_metadata_on_the_event_loop(txn_broker):
    """With no transactions to list, a read_committed Fetch reads its metadata without a
    thread switch, as a read_uncommitted one does."""
    bs = txn_broker.bootstrap
    create_topic(bs, "tx-quick", 1)
    # One record per batch (batch.size), so that a Fetch takes two of them.
    plain = Producer({"bootstrap.servers": bs, "acks": "all", "batch.size": 6000})
    for i in range(200):
        plain.produce("tx-quick", value=b"%05d" % i + b"x" * 5000, partition=0)
    assert plain.flush(15) == 0
    before = _metadata_stats(txn_broker)
    if "quick_reads" not in before:
        pytest.skip("this metadata store has no thread-free reads (FoundationDB)")
    consumer = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "quick",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "max.partition.fetch.bytes": 12000,  # two records per Fetch: about 100 Fetches
        }
    )
    consumer.assign([TopicPartition("tx-quick", 0, 0)])
    got = 0
    deadline = time.monotonic() + 30
    while got < 200 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.close()
    assert got == 200
    after = _metadata_stats(txn_broker)
    quick = after["quick_reads"] - before["quick_reads"]
    threaded = (after["reads"] - after["quick_reads"]) - (before["reads"] - before["quick_reads"])
    # About one quick read per Fetch. What goes to threads meanwhile is the agent's own
    # background reads (topic cache, watermark polls), not one per Fetch.
    assert quick >= 90, (quick, threaded)
    assert threaded < quick / 2, (quick, threaded)
