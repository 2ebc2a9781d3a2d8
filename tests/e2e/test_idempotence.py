"""Idempotent producers: InitProducerId and the per-partition sequence rules, end to end.

The raw tests drive the rules with hand-built batches (producer id, epoch, base
sequence) so each answer can be checked exactly; the last test runs a real
confluent-kafka idempotent producer with five requests in flight.

Kafka references (apache/kafka): `ProducerAppendInfo.checkProducerEpoch` /
`checkSequence`, `ProducerStateEntry.findDuplicateBatch` (the last 5 batches per
producer and partition), `UnifiedLog.append` (a duplicate is answered with the
original batch's offsets and no error).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from protocol.records import build_batch, iter_batches, iter_records
from tests.e2e.wire import WireClient, api_versions, fetch, metadata, produce, request
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("idempotence") / "data"
    process = BrokerProcess(data_dir=data, port=free_ports(1)[0])
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture
def client(broker) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap) as c:
        yield c


def new_topic(client: WireClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    (topic,) = metadata(client, [name]).topics
    assert topic.error_code == ErrorCode.none
    return name


def init_producer_id(client: WireClient, version: int = 4) -> tuple[int, int]:
    fields = {"transactional_id": None, "transaction_timeout": 60_000}
    if version >= 3:
        fields.update(producer_id=-1, producer_epoch=-1)
    answer = client.call(request(22, version, **fields))
    assert answer.error_code == ErrorCode.none
    return int(answer.producer_id), int(answer.producer_epoch)


def idempotent_batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return build_batch(
        [(None, v, [], TS) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def send(client: WireClient, topic: str, records: bytes) -> tuple[ErrorCode, int]:
    answer = produce(client, {topic: {0: records}})[topic, 0]
    return answer.error_code, int(answer.base_offset)


def log_of(client: WireClient, topic: str) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in partition 0, via raw Fetch."""
    out: list[tuple[int, bytes | None]] = []
    offset = 0
    while True:
        answer = fetch(client, topic, 0, offset)
        assert answer.error_code == ErrorCode.none
        if not answer.records:
            return out
        for view in iter_batches(answer.records):
            out.extend((view.base_offset + r.offset_delta, r.value) for r in iter_records(view))
        offset = out[-1][0] + 1


def kp_consume_all(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """Read partition 0 from the start with kafka-python until `count` records (or 20 s),
    then poll a little longer so that a duplicate would show up too."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=15_000,
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.offset, r.value) for r in records)
        for records in consumer.poll(timeout_ms=300).values():
            got.extend((r.offset, r.value) for r in records)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("version", [0, 4])
def test_init_producer_id_without_transactional_id(client, version):
    """No transactional id: a fresh producer id with epoch 0, different every time."""
    newest = api_versions(client)[22][1]
    versions = {version, newest}
    ids = set()
    for v in sorted(versions):
        pid, epoch = init_producer_id(client, v)
        assert pid >= 0
        assert epoch == 0
        ids.add(pid)
    assert len(ids) == len(versions)


def test_sequences_retries_and_gaps(broker, client):
    topic = new_topic(client, "idem-seq")
    pid, epoch = init_producer_id(client)

    first = idempotent_batch(pid, epoch, 0, b"r0", b"r1", b"r2")
    assert send(client, topic, first) == (ErrorCode.none, 0)

    # A retry of the very same request: the original offset again, no error, no append.
    assert send(client, topic, first) == (ErrorCode.none, 0)
    # Retries usually come on a new connection.
    with WireClient(broker.bootstrap) as other:
        assert send(other, topic, first) == (ErrorCode.none, 0)

    assert send(client, topic, idempotent_batch(pid, epoch, 3, b"r3", b"r4", b"r5")) == (
        ErrorCode.none,
        3,
    )
    # The retry of an older batch still among the last five is still a duplicate.
    assert send(client, topic, first) == (ErrorCode.none, 0)

    # A gap: sequence 10 when 6 is next.
    gap = idempotent_batch(pid, epoch, 10, b"gap")
    assert send(client, topic, gap) == (ErrorCode.out_of_order_sequence_number, -1)
    # Same base sequence as a cached batch but another length: no duplicate, out of order.
    assert send(client, topic, idempotent_batch(pid, epoch, 0, b"r0", b"r1")) == (
        ErrorCode.out_of_order_sequence_number,
        -1,
    )
    # Refused batches leave no trace: 6 is still next.
    assert send(client, topic, idempotent_batch(pid, epoch, 6, b"r6")) == (ErrorCode.none, 6)

    expected = [(i, f"r{i}".encode()) for i in range(7)]
    assert log_of(client, topic) == expected
    assert kp_consume_all(broker.bootstrap, topic, len(expected)) == expected


def test_duplicates_are_remembered_for_five_batches_only(client):
    topic = new_topic(client, "idem-window")
    pid, epoch = init_producer_id(client)
    batches = [idempotent_batch(pid, epoch, i, f"v{i}".encode()) for i in range(7)]
    for i, records in enumerate(batches[:6]):
        assert send(client, topic, records) == (ErrorCode.none, i)
    # Batches 1..5 are the last five: batch 1 is a duplicate, batch 0 is too old.
    assert send(client, topic, batches[1]) == (ErrorCode.none, 1)
    assert send(client, topic, batches[0]) == (ErrorCode.out_of_order_sequence_number, -1)
    assert send(client, topic, batches[6]) == (ErrorCode.none, 6)
    assert [offset for offset, _ in log_of(client, topic)] == list(range(7))


def test_epochs(client):
    topic = new_topic(client, "idem-epoch")
    pid, epoch = init_producer_id(client)
    assert epoch == 0
    assert send(client, topic, idempotent_batch(pid, 0, 0, b"e0-0")) == (ErrorCode.none, 0)
    assert send(client, topic, idempotent_batch(pid, 0, 1, b"e0-1")) == (ErrorCode.none, 1)
    # A newer epoch starts again at sequence 0 and is accepted.
    assert send(client, topic, idempotent_batch(pid, 1, 0, b"e1-0")) == (ErrorCode.none, 2)
    # The old epoch is now fenced on this partition.
    assert send(client, topic, idempotent_batch(pid, 0, 2, b"stale")) == (
        ErrorCode.invalid_producer_epoch,
        -1,
    )
    # A newer epoch that does not start at sequence 0 is out of order.
    assert send(client, topic, idempotent_batch(pid, 2, 5, b"e2-5")) == (
        ErrorCode.out_of_order_sequence_number,
        -1,
    )
    assert send(client, topic, idempotent_batch(pid, 1, 1, b"e1-1")) == (ErrorCode.none, 3)
    assert log_of(client, topic) == [(0, b"e0-0"), (1, b"e0-1"), (2, b"e1-0"), (3, b"e1-1")]


def test_unknown_producer_id(client):
    """A producer id the cluster never handed out is refused with UNKNOWN_PRODUCER_ID.

    This is the broker's own, stricter rule: Apache Kafka does not track which ids were
    handed out and accepts such a batch (`ProducerAppendInfo.checkSequence` takes any
    sequence from a producer without state on the partition; KIP-360 / KAFKA-8710 took
    UNKNOWN_PRODUCER_ID out of the produce path in 2.5). Clients treat the error as
    retriable after resetting their producer id."""
    topic = new_topic(client, "idem-unknown")
    pid, _ = init_producer_id(client)
    stranger = pid + 1_000_000
    assert send(client, topic, idempotent_batch(stranger, 0, 0, b"who")) == (
        ErrorCode.unknown_producer_id,
        -1,
    )
    assert log_of(client, topic) == []


def test_confluent_idempotent_producer_exactly_once_in_order(broker, client):
    from confluent_kafka import Producer

    topic = new_topic(client, "idem-ck")
    count = 2000
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight": 5,
            "linger.ms": 0,
        }
    )
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def report(index: int):
        def callback(err, msg):
            if err is not None:
                errors.append(f"{index}: {err}")
            else:
                offsets[index] = msg.offset()

        return callback

    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=b"m%05d" % i, partition=0, on_delivery=report(i))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0, "records still undelivered after 60 s"
    assert not errors, errors[:10]
    # Acknowledged in send order with dense offsets.
    assert [offsets[i] for i in range(count)] == list(range(count))

    got = kp_consume_all(broker.bootstrap, topic, count)
    assert got == [(i, b"m%05d" % i) for i in range(count)]


def test_retry_in_flight_with_the_original(client):
    """A retry sent before the original's answer (both in flight at once, so possibly
    in one flush) is still answered with the original's offset, and stored once."""
    topic = new_topic(client, "idem-inflight")
    pid, epoch = init_producer_id(client)
    records = idempotent_batch(pid, epoch, 0, b"a", b"b")
    entity = request(
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=30_000,
        topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    )
    ids = [client.send(entity) for _ in range(3)]
    answers = [client.receive(i).responses[0].partition_responses[0] for i in ids]
    assert [(a.error_code, a.base_offset) for a in answers] == [(ErrorCode.none, 0)] * 3
    assert log_of(client, topic) == [(0, b"a"), (1, b"b")]


def test_duplicates_survive_a_restart(start_broker):
    """Producer state is durable: a retry after a broker restart is still a duplicate,
    and the next sequence still continues where it was."""
    broker = start_broker()
    with WireClient(broker.bootstrap) as c:
        topic = new_topic(c, "idem-restart")
        pid, epoch = init_producer_id(c)
        first = idempotent_batch(pid, epoch, 0, b"x", b"y")
        assert send(c, topic, first) == (ErrorCode.none, 0)
    broker.stop()
    broker.start()
    with WireClient(broker.bootstrap) as c:
        assert send(c, topic, first) == (ErrorCode.none, 0)
        assert send(c, topic, idempotent_batch(pid, epoch, 5, b"gap")) == (
            ErrorCode.out_of_order_sequence_number,
            -1,
        )
        assert send(c, topic, idempotent_batch(pid, epoch, 2, b"z")) == (ErrorCode.none, 2)
        assert log_of(c, topic) == [(0, b"x"), (1, b"y"), (2, b"z")]


def test_pipelined_requests_on_one_connection_keep_their_order(broker, client):
    """Five requests in flight at once, for a topic whose cached metadata has expired (each
    lookup waits on the metadata store, and lookups may finish in any order): they must
    reach the log in the order sent, as Kafka handles a connection's requests one after
    another."""
    pid, epoch = init_producer_id(client)
    for round_ in range(10):
        topic = f"pipelined-{round_}-{uuid.uuid4().hex[:8]}"
        with WireClient(broker.bootstrap) as other:
            metadata(other, [topic])
        time.sleep(1.2)  # past the agent's topic cache (1 s)
        requests = [
            request(
                0,
                9,
                transactional_id=None,
                acks=-1,
                timeout=30_000,
                topic_data=[
                    {
                        "name": topic,
                        "partition_data": [
                            {"index": 0, "records": idempotent_batch(pid, epoch, seq, b"%d" % seq)}
                        ],
                    }
                ],
            )
            for seq in range(5)
        ]
        ids = [client.send(r) for r in requests]
        answers = [client.receive(cid).responses[0].partition_responses[0] for cid in ids]
        assert [(a.error_code, a.base_offset) for a in answers] == [
            (ErrorCode.none, seq) for seq in range(5)
        ], round_


def test_a_produce_past_its_timeout_is_answered_so_and_never_committed(broker, client):
    # Kafka answers an acks=all produce REQUEST_TIMED_OUT once its timeout passes. Here
    # the batch is then never committed either: a producer that gave up on it and sent
    # it again (librdkafka, after its own timer, may do so under a new epoch) must not
    # find the first try written after all.
    db = broker.data_dir / "metadata.db"
    if not db.exists():
        pytest.skip("holds the SQLite metadata store's write lock: another store is in use")
    topic = new_topic(client, "late")
    pid, epoch = init_producer_id(client)
    records = build_batch(
        [(None, b"late", [], TS)], producer_id=pid, producer_epoch=epoch, base_sequence=0
    )
    timed_out_before = broker.stats().get("pipeline", {}).get("timed_out_batches", 0)
    lock = sqlite3.connect(db, timeout=30, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        began = time.monotonic()
        answer = produce(client, {topic: {0: records}}, timeout_ms=2000)[topic, 0]
        waited = time.monotonic() - began
        time.sleep(1)  # the flush's commit still waits for the lock
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert answer.error_code == ErrorCode.request_timed_out
    assert 1.5 <= waited < 3  # at its timeout (less a margin), not when the lock went
    deadline = time.monotonic() + 10
    while broker.stats().get("pipeline", {}).get("timed_out_batches", 0) == timed_out_before:
        assert time.monotonic() < deadline, "the late batch's commit never ran"
        time.sleep(0.1)
    assert log_of(client, topic) == []
    retry = produce(client, {topic: {0: records}})[topic, 0]
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
    assert log_of(client, topic) == [(0, b"late")]
