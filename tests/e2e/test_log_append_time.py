"""message.timestamp.type=LogAppendTime, applied on produce as Apache Kafka applies it.

Kafka's LogValidator stamps every batch produced to such a topic with the broker's
clock: attributes bit 3 (LOG_APPEND_TIME) and maxTimestamp set, CRC recomputed, records
untouched; every record then reads as the batch's maxTimestamp. The Produce answer
carries that time as log_append_time (-1 on CreateTime topics), clients report it for
the records they sent, and ListOffsets finds records by it. A producer's own
LOG_APPEND_TIME batch is refused with INVALID_TIMESTAMP. A config change applies to the
batches produced after it.

Records are sent with explicit CreateTime timestamps from 2023 (BASE_TS), so a
timestamp inside the produce window can only be the broker's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import HEADER_SIZE, RecordBatchView, build_batch, iter_batches
from tests.e2e.clients_support import (
    BASE_TS,
    CREATE_TIME,
    LOG_APPEND_TIME,
    Rec,
    assert_same_records,
    ck_consume,
    kp_consume,
    sample_records,
)
from tests.e2e.wire import WireClient, api_versions, fetch, list_offsets, produce, request
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = pytest.mark.slow

APPEND = {"message.timestamp.type": "LogAppendTime"}
MAX_TIMESTAMP = -3


def now_ms() -> int:
    return int(time.time() * 1000)


def log_append_time(answer) -> int:
    """A Produce partition answer's log_append_time in ms; kio reads -1 as None."""
    value = answer.log_append_time
    return -1 if value is None else round(value.timestamp() * 1000)


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("log-append-time") / "data"
    process = BrokerProcess(data_dir=data, port=free_ports(1)[0])
    try:
        yield process.start()
    finally:
        process.stop()


def admin(broker: BrokerProcess):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(broker: BrokerProcess, prefix: str, configs: dict[str, str]) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = admin(broker)  # kept alive until the answer is in
    futures = client.create_topics([NewTopic(name, 1, 1, config=configs)])
    futures[name].result(timeout=20)
    return name


def set_timestamp_type(broker: BrokerProcess, topic: str, value: str) -> None:
    """IncrementalAlterConfigs SET message.timestamp.type=value; raises if refused."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(
        "message.timestamp.type", value, incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    client = admin(broker)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=20)


def error_code(exc: Exception) -> int:
    return int(exc.args[0].code())


def ck_produce_reports(bootstrap: str, topic: str, records: Sequence[Rec], codec: str) -> list[Rec]:
    """Produce with confluent-kafka; each record as its delivery report tells it: partition,
    offset, and the timestamp and type librdkafka took from the Produce answer."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": codec})
    reports: dict[int, Rec] = {}
    errors: list[str] = []

    def report(index: int, rec: Rec):
        def cb(err, msg):
            if err is not None:
                errors.append(f"record {index}: {err}")
                return
            ts_type, ts = msg.timestamp()
            kind = CREATE_TIME if ts_type == TIMESTAMP_CREATE_TIME else LOG_APPEND_TIME
            reports[index] = replace(
                rec, partition=msg.partition(), offset=msg.offset(), timestamp=ts, ts_type=kind
            )

        return cb

    for i, rec in enumerate(records):
        producer.produce(
            topic,
            value=rec.value,
            key=rec.key,
            headers=list(rec.headers),
            timestamp=rec.timestamp,
            on_delivery=report(i, rec),
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "confluent-kafka: records still undelivered after 30 s"
    assert not errors, errors[:10]
    return [reports[i] for i in range(len(records))]


def kp_produce_reports(bootstrap: str, topic: str, records: Sequence[Rec], codec: str) -> list[Rec]:
    """Produce with kafka-python; each record with the partition, offset and timestamp of
    its RecordMetadata (the broker's log_append_time unless that is -1)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
        acks="all",
    )
    try:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                timestamp_ms=r.timestamp,
            )
            for r in records
        ]
        producer.flush(timeout=30)
        out = []
        for rec, future in zip(records, futures, strict=True):
            md = future.get(timeout=30)
            out.append(
                replace(rec, partition=md.partition, offset=md.offset, timestamp=md.timestamp)
            )
        return out
    finally:
        producer.close(timeout=10)


def assert_appended(records: Sequence[Rec], start: int, end: int) -> None:
    for rec in records:
        assert rec.ts_type == LOG_APPEND_TIME, rec.short()
        assert rec.timestamp is not None and start <= rec.timestamp <= end, (
            f"{rec.short()}: not a time inside the produce window [{start}, {end}]"
        )


# -- real clients --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_confluent_kafka(broker, codec):
    records = sample_records(f"lat-ck-{codec}", 60)
    appended = create_topic(broker, "lat-ck", APPEND)
    start = now_ms()
    reported = ck_produce_reports(broker.bootstrap, appended, records, codec)
    end = now_ms()
    # librdkafka reports the answer's log_append_time as each record's LogAppendTime.
    assert_appended(reported, start, end)
    consumed = ck_consume(broker.bootstrap, appended, 1)
    assert_appended(consumed, start, end)
    # Everything else as sent, and each record's time is the one its answer carried.
    assert_same_records(reported, consumed)
    assert_same_records(reported, kp_consume(broker.bootstrap, appended, 1))

    created = create_topic(broker, "lat-ck-create", {})
    reported = ck_produce_reports(broker.bootstrap, created, records, codec)
    assert [(r.timestamp, r.ts_type) for r in reported] == [
        (r.timestamp, CREATE_TIME) for r in records
    ]
    assert_same_records(reported, ck_consume(broker.bootstrap, created, 1))


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_kafka_python(broker, codec):
    records = sample_records(
        f"lat-kp-{codec}", 60, null_header_values=False, null_key_and_value=False
    )
    appended = create_topic(broker, "lat-kp", APPEND)
    start = now_ms()
    reported = kp_produce_reports(broker.bootstrap, appended, records, codec)
    end = now_ms()
    reported = [replace(r, ts_type=LOG_APPEND_TIME) for r in reported]  # it has no type
    assert_appended(reported, start, end)
    consumed = kp_consume(broker.bootstrap, appended, 1)
    assert_appended(consumed, start, end)
    assert_same_records(reported, consumed)

    created = create_topic(broker, "lat-kp-create", {})
    reported = kp_produce_reports(broker.bootstrap, created, records, codec)
    assert [r.timestamp for r in reported] == [r.timestamp for r in records]
    assert_same_records(reported, kp_consume(broker.bootstrap, created, 1))


# -- the wire: Produce answers and stored batches ------------------------------------------

SENT = [
    (b"k0", b"v0", [("h", b"1")], BASE_TS + 300),
    (None, b"v1", [], BASE_TS + 100),
    (b"k2", None, [], BASE_TS + 200),
]


def stored_batch(client: WireClient, topic: str, offset: int) -> RecordBatchView:
    records = fetch(client, topic, 0, offset).records
    [batch] = [b for b in iter_batches(records) if b.base_offset == offset]
    return batch


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
def test_produce_answer_and_stored_batch(broker, codec):
    appended = create_topic(broker, "lat-raw", APPEND)
    created = create_topic(broker, "lat-raw-create", {})
    sent = build_batch(SENT, compression=codec)
    with WireClient(broker.bootstrap) as client:
        newest = api_versions(client)[0][1]
        for n, version in enumerate(sorted({3, 7, 9, newest})):
            start = now_ms()
            answers = produce(client, {appended: {0: sent}, created: {0: sent}}, version=version)
            end = now_ms()
            answer = answers[appended, 0]
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 3 * n)
            stamp = log_append_time(answer)
            assert start <= stamp <= end, f"v{version}: {answer}"
            control = answers[created, 0]
            assert (control.error_code, log_append_time(control)) == (ErrorCode.none, -1)

            # Stored with the header stamped, records as sent.
            batch = stored_batch(client, appended, 3 * n)
            assert batch.timestamp_type == 1 and batch.crc_valid
            assert batch.attributes == codec | 0x08
            assert batch.max_timestamp == stamp
            assert batch.base_timestamp == BASE_TS + 300
            assert bytes(batch.records_data) == sent[HEADER_SIZE:]
            # The CreateTime topic stores the batch byte for byte after its leader epoch.
            assert bytes(stored_batch(client, created, 3 * n).data)[16:] == sent[16:]


def test_producer_log_append_time_batch_is_invalid_timestamp(broker):
    """Kafka's LogValidator.validateTimestamp: a producer may not send LOG_APPEND_TIME
    batches to a LogAppendTime topic; a CreateTime topic takes them as they are."""
    appended = create_topic(broker, "lat-bad", APPEND)
    created = create_topic(broker, "lat-bad-create", {})
    sent = build_batch(SENT, log_append_time=BASE_TS + 999)
    with WireClient(broker.bootstrap) as client:
        answers = produce(client, {appended: {0: sent}, created: {0: sent}}, version=9)
        refused = answers[appended, 0]
        assert refused.error_code == ErrorCode.invalid_timestamp
        assert (refused.base_offset, log_append_time(refused)) == (-1, -1)
        assert refused.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        assert [e.batch_index for e in refused.record_errors] == [0, 1, 2]
        assert answers[created, 0].error_code == ErrorCode.none
        assert fetch(client, appended, 0, 0).high_watermark == 0


def test_retried_batch_keeps_its_first_stamp(broker):
    """An idempotent producer's retry is answered with the first append's offset and is
    not stamped again. Kafka answers the first append's time from its producer state;
    bucketlog keeps no timestamps there and answers -1, never a time no record carries."""
    topic = create_topic(broker, "lat-retry", APPEND)
    with WireClient(broker.bootstrap) as client:
        init = client.call(
            request(
                22,
                4,
                transactional_id=None,
                transaction_timeout=60_000,
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert init.error_code == ErrorCode.none
        sent = build_batch(
            SENT, producer_id=init.producer_id, producer_epoch=init.producer_epoch, base_sequence=0
        )
        (first,) = produce(client, {topic: {0: sent}}).values()
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        stamp = log_append_time(first)
        assert stamp > BASE_TS
        time.sleep(0.01)
        (retry,) = produce(client, {topic: {0: sent}}).values()
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
        assert log_append_time(retry) == -1
        answer = fetch(client, topic, 0, 0)
        assert answer.high_watermark == 3
        [batch] = iter_batches(answer.records)
        assert batch.max_timestamp == stamp


def test_transaction_markers_are_stamped_too(broker):
    """Kafka's coordinator appends its commit and abort markers through the same
    LogValidator: on a LogAppendTime topic they are LOG_APPEND_TIME batches."""
    from confluent_kafka import Producer

    appended = create_topic(broker, "lat-txn", APPEND)
    created = create_topic(broker, "lat-txn-create", {})
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": f"lat-{appended}"}
    )
    producer.init_transactions(15)
    start = now_ms()
    for commit in (True, False):
        producer.begin_transaction()
        for topic in (appended, created):
            producer.produce(topic, value=b"v", timestamp=BASE_TS)
        producer.flush(15)
        if commit:
            producer.commit_transaction(15)
        else:
            producer.abort_transaction(15)
    end = now_ms()
    with WireClient(broker.bootstrap) as client:
        for topic, stamped in ((appended, True), (created, False)):
            batches = list(iter_batches(fetch(client, topic, 0, 0).records))
            kinds = [(b.is_control, b.timestamp_type) for b in batches]
            assert kinds == [(False, int(stamped)), (True, int(stamped))] * 2, topic
            assert all(batch.crc_valid for batch in batches)
            if stamped:
                assert all(start <= batch.max_timestamp <= end for batch in batches)


# -- ListOffsets -------------------------------------------------------------------------------


def test_list_offsets_by_append_time(broker):
    """Three batches stamped t1 < t2 < t3 at offsets 0-2, 3-5 and 6-8; the timestamps sent
    (2023, out of order) no longer matter."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    topic = create_topic(broker, "lat-lo", APPEND)
    stamps = []
    with WireClient(broker.bootstrap) as client:
        newest = api_versions(client)[2][1]
        for _ in range(3):
            (answer,) = produce(client, {topic: {0: build_batch(SENT)}}).values()
            assert answer.error_code == ErrorCode.none
            stamps.append(log_append_time(answer))
            time.sleep(0.01)
        t1, t2, t3 = stamps
        assert BASE_TS < t1 < t2 < t3, stamps
        expected = [
            (0, (0, t1)),
            (BASE_TS + 300, (0, t1)),  # the largest timestamp sent
            (t1, (0, t1)),
            (t1 + 1, (3, t2)),
            (t2, (3, t2)),
            (t3, (6, t3)),
            (t3 + 1, (-1, -1)),
        ]
        for version in (1, newest):
            for target, found in expected:
                (part,) = list_offsets(client, topic, {0: target}, version=version).values()
                got = (part.error_code, (int(part.offset), int(part.timestamp)))
                assert got == (ErrorCode.none, found), f"v{version} T={target}"
        # The largest timestamp is t3, first carried by offset 6.
        (part,) = list_offsets(client, topic, {0: MAX_TIMESTAMP}, version=newest).values()
        assert (part.error_code, part.offset, part.timestamp) == (ErrorCode.none, 6, t3)

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"lat-{t1}"})
    try:
        for target, (offset, _ts) in expected:
            (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, target)], timeout=10)
            assert (found.error, found.offset) == (None, offset), f"T={target}"
    finally:
        consumer.close()
    kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=15_000)
    try:
        tp = KpTopicPartition(topic, 0)
        for target, (offset, ts) in expected:
            found = kp.offsets_for_times({tp: target}, timeout_ms=10_000)[tp]
            got = None if found is None else (found.offset, found.timestamp)
            assert got == (None if offset < 0 else (offset, ts)), f"T={target}"
    finally:
        kp.close()


# -- changing the config -----------------------------------------------------------------------


def test_incremental_alter_configs_applies_to_later_batches(broker):
    """CreateTime, then LogAppendTime, then CreateTime again: each batch keeps the type
    it was stored with."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topic = create_topic(broker, "lat-switch", {})
    sent = build_batch(SENT, compression=Compression.ZSTD)
    log_append_times = []
    with WireClient(broker.bootstrap) as client:
        for value in (None, "LogAppendTime", "CreateTime"):
            if value is not None:
                set_timestamp_type(broker, topic, value)
            (answer,) = produce(client, {topic: {0: sent}}).values()
            assert answer.error_code == ErrorCode.none
            log_append_times.append(log_append_time(answer))
        first, stamped, last = log_append_times
        assert first == last == -1 and stamped > BASE_TS
        types = [stored_batch(client, topic, offset).timestamp_type for offset in (0, 3, 6)]
        assert types == [0, 1, 0]

    consumed = sorted(ck_consume(broker.bootstrap, topic, 1), key=lambda r: r.offset or 0)
    assert [(r.timestamp, r.ts_type) for r in consumed] == [
        *[(ts, CREATE_TIME) for *_rest, ts in SENT],
        *[(stamped, LOG_APPEND_TIME)] * 3,
        *[(ts, CREATE_TIME) for *_rest, ts in SENT],
    ]

    # Values other than CreateTime and LogAppendTime are INVALID_CONFIG, as in Kafka.
    for value in ("logappendtime", "NoTimestampType", ""):
        with pytest.raises(KafkaException) as refused:
            set_timestamp_type(broker, topic, value)
        assert error_code(refused.value) == KafkaError.INVALID_CONFIG, value
        name = f"lat-invalid-{uuid.uuid4().hex[:8]}"
        client = admin(broker)
        futures = client.create_topics(
            [NewTopic(name, 1, 1, config={"message.timestamp.type": value})]
        )
        with pytest.raises(KafkaException) as refused:
            futures[name].result(timeout=20)
        assert error_code(refused.value) == KafkaError.INVALID_CONFIG, value
