"""Produce to a compacted topic: a record without a key is refused, as Apache Kafka's
LogValidator.validateKey refuses it.

The whole batch gets INVALID_RECORD, each keyless record is listed by its index in the
batch, and the message is Kafka's; nothing of the batch is appended. cleanup.policy
"compact" and "compact,delete" both refuse; "delete" takes the same batch; a policy
altered at run time applies to the batches produced after it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import build_batch
from tests.e2e.clients_support import create_topic, set_topic_configs
from tests.e2e.wire import WireClient, fetch, produce
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("compacted-produce") / "data"
    process = BrokerProcess(data_dir=data, port=free_ports(1)[0])
    try:
        yield process.start()
    finally:
        process.stop()


def create_compacted(broker: BrokerProcess, policy: str) -> str:
    name = f"cp-{policy.replace(',', '-')}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name, {"cleanup.policy": policy})
    return name


def set_policy(broker: BrokerProcess, topic: str, policy: str) -> None:
    set_topic_configs(broker.bootstrap, topic, {"cleanup.policy": policy})


def expected_message(topic: str, indexes: list[int]) -> str:
    why = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{why}')" for i in indexes[:3])
    return (
        f"One or more records have been rejected due to {len(indexes)} record errors in "
        f"total, and only showing the first three errors at most: [{shown}]"
    )


MIXED = [
    (b"a", b"1", [], TS),
    (None, b"2", [], TS),
    (b"b", None, [], TS),  # a tombstone has a key: taken
    (None, b"4", [], TS),
    (None, b"5", [], TS),
    (None, b"6", [], TS),
]


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
def test_keyless_records_are_refused_with_kafkas_answer(broker, codec):
    compacted = create_compacted(broker, "compact")
    both = create_compacted(broker, "compact,delete")
    deleted = create_compacted(broker, "delete")
    batch = build_batch(MIXED, compression=codec)
    with WireClient(broker.bootstrap) as client:
        answers = produce(client, {compacted: {0: batch}, both: {0: batch}, deleted: {0: batch}})
        for topic in (compacted, both):
            refused = answers[topic, 0]
            assert refused.error_code == ErrorCode.invalid_record
            assert refused.base_offset == -1
            assert [e.batch_index for e in refused.record_errors] == [1, 3, 4, 5]
            assert {e.batch_index_error_message for e in refused.record_errors} == {
                f"Compacted topic cannot accept message without key in topic partition {topic}-0"
            }
            assert refused.error_message == expected_message(topic, [1, 3, 4, 5])
            assert fetch(client, topic, 0, 0).high_watermark == 0
        taken = answers[deleted, 0]
        assert (taken.error_code, taken.base_offset) == (ErrorCode.none, 0)

        keyed = build_batch([(b"k", b"v", [], TS), (b"k", None, [], TS)], compression=codec)
        answers = produce(client, {compacted: {0: keyed}})
        assert (answers[compacted, 0].error_code, answers[compacted, 0].base_offset) == (
            ErrorCode.none,
            0,
        )


def test_clients_see_invalid_record(broker):
    from confluent_kafka import KafkaError, Producer
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    topic = create_compacted(broker, "compact")
    outcomes: list[tuple[bytes | None, int | None]] = []

    def delivered(err, msg) -> None:
        outcomes.append((msg.key(), None if err is None else err.code()))

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    producer.produce(topic, value=b"no key", on_delivery=delivered)
    producer.flush(20)
    producer.produce(topic, key=b"k", value=b"keyed", on_delivery=delivered)
    producer.flush(20)
    assert outcomes == [(None, KafkaError.INVALID_RECORD), (b"k", None)]

    kp = KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0)
    try:
        with pytest.raises(InvalidRecordError):
            kp.send(topic, value=b"no key").get(timeout=20)
        assert kp.send(topic, key=b"k", value=b"again").get(timeout=20).offset == 1
    finally:
        kp.close()


def test_a_policy_altered_at_run_time_applies_to_later_batches(broker):
    topic = create_compacted(broker, "delete")
    keyless = build_batch([(None, b"v", [], TS)])
    with WireClient(broker.bootstrap) as client:
        assert produce(client, {topic: {0: keyless}})[topic, 0].error_code == ErrorCode.none
        set_policy(broker, topic, "compact")
        deadline = time.monotonic() + 20
        while True:  # configs reach the agent through its topic cache
            answer = produce(client, {topic: {0: keyless}})[topic, 0]
            if answer.error_code == ErrorCode.invalid_record or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.error_code == ErrorCode.invalid_record
        set_policy(broker, topic, "delete")
        deadline = time.monotonic() + 20
        while True:
            answer = produce(client, {topic: {0: keyless}})[topic, 0]
            if answer.error_code == ErrorCode.none or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.error_code == ErrorCode.none
