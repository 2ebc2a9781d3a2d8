"""Compacted topics cleaned by a running broker, read by real clients.

Many updates of a few keys go into a compacted topic; the broker's cleaner (a short
back-off here) keeps the latest record of each key at its own offset. Consumers then read
one record per key, the last value written, across the gaps that removed records left;
a consumer that seeks into a gap gets the next record. The same workload into a topic
with cleanup.policy=delete keeps everything.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.e2e.clients_support import create_topic, read_confluent, set_topic_configs
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

FAST = [
    "--log-cleaner-backoff-ms",
    "300",
    "--compaction-interval-ms",
    "200",
    "--compaction-min-age-ms",
    "200",
]
KEYS = 20
ROUNDS = 30
# Clean whenever anything is dirty. At Kafka's default ratio (0.5) whether the last
# rounds get cleaned depends on how the client split them into batches: a round that
# ended while the last one was still being produced leaves that one dirty, and one more
# batch header on the clean side puts the ratio just under 0.5, so both stay for good.
# The ratio rule itself is tested in tests/metadata/test_cleaning.py.
EAGER = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


def produce(broker: BrokerProcess, topic: str) -> dict[bytes, bytes]:
    """ROUNDS updates of KEYS keys, one flush per round; the last value of each key."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    last = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = f"key-{k}".encode(), f"value-{r}-{k}".encode()
            producer.produce(topic, key=key, value=value)
            last[key] = value
        producer.flush(20)
    return last


def stats(broker: BrokerProcess) -> dict:
    path = broker.data_dir / f"stats-{broker.port}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_kafka_python(broker: BrokerProcess, topic: str) -> list[tuple[int, bytes, bytes]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    high = consumer.end_offsets([tp])[tp]
    out = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and consumer.position(tp) < high:
        for records in consumer.poll(timeout_ms=500).values():
            out += [(r.offset, r.key, r.value) for r in records]
    consumer.close()
    return out


def test_a_compacted_topic_reads_as_the_latest_value_of_each_key(start_broker):
    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "table", EAGER)
    create_topic(broker.bootstrap, "history", {"cleanup.policy": "delete"})
    last = produce(broker, "table")
    produce(broker, "history")

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = read_confluent(broker, "table")
        if len(records) == KEYS:
            break
        time.sleep(0.5)
    assert {key: value for _o, key, value in records} == last
    assert len(records) == KEYS  # one record per key
    offsets = [o for o, _k, _v in records]
    # Offsets kept: the last round's records, at the offsets they were given.
    assert offsets == list(range((ROUNDS - 1) * KEYS, ROUNDS * KEYS))
    assert read_kafka_python(broker, "table") == records
    # Seeking into the gap before them gives the next record.
    assert read_confluent(broker, "table", start=5)[0] == records[0]
    deadline = time.monotonic() + 10
    while True:  # the stats file is written every second or so, after the round's commit
        cleaning = stats(broker).get("cleaning", {})
        removed = cleaning.get("records_removed", 0) >= (ROUNDS - 1) * KEYS
        if (cleaning.get("rounds", 0) >= 1 and removed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert cleaning["rounds"] >= 1 and cleaning["records_removed"] >= (ROUNDS - 1) * KEYS
    # The delete topic keeps every record.
    assert len(read_confluent(broker, "history")) == ROUNDS * KEYS


def wait_for_records(broker, topic, count, timeout=60):
    """Read the topic from its start until it holds `count` records (cleaning ran)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_confluent(broker, topic)
        if len(records) == count or time.monotonic() > deadline:
            return records
        time.sleep(0.5)



def test_tombstones_are_read_until_delete_retention_has_passed(start_broker):
    from confluent_kafka import Producer

    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "tomb", {**EAGER, "delete.retention.ms": "3000"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for key in (b"gone", b"kept"):
        producer.produce("tomb", key=key, value=b"v1")
    producer.flush(20)
    producer.produce("tomb", key=b"gone", value=None)  # offset 2
    producer.flush(20)
    # Cleaned once: the first value of "gone" goes, its tombstone stays and is read.
    records = wait_for_records(broker, "tomb", 2)
    assert records == [(1, b"kept", b"v1"), (2, b"gone", None)]
    # Later rounds (new dirt) after delete.retention.ms: the tombstone goes too.
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline:
        producer.produce("tomb", key=f"new-{n}".encode(), value=b"x")
        producer.flush(20)
        n += 1
        records = read_confluent(broker, "tomb")
        if all(key != b"gone" for _o, key, _v in records):
            break
        time.sleep(1)
    assert all(key != b"gone" for _o, key, _v in records)
    assert (1, b"kept", b"v1") in records


def test_min_compaction_lag_holds_records_back_and_max_lag_forces_a_round(start_broker):
    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "lagged", {**EAGER, "min.compaction.lag.ms": "3600000"})
    create_topic(
        broker.bootstrap,
        "forced",
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.99",
            "max.compaction.lag.ms": "1000",
        },
    )
    produce(broker, "lagged")
    last = produce(broker, "forced")
    # Ratio 0.99 is never reached after a first round; max.compaction.lag.ms forces it.
    records = wait_for_records(broker, "forced", KEYS)
    assert {k: v for _o, k, v in records} == last
    # Every record of "lagged" is younger than an hour: none may go.
    time.sleep(3)
    assert len(read_confluent(broker, "lagged")) == ROUNDS * KEYS


def test_an_idempotent_producer_keeps_producing_to_a_cleaned_partition(start_broker):
    from confluent_kafka import Producer

    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "idem", EAGER)
    errors: list = []

    def delivered(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": True}
    )
    for r in range(10):
        for k in range(5):
            producer.produce("idem", key=b"k%d" % k, value=b"%d" % r, on_delivery=delivered)
        producer.flush(20)
    wait_for_records(broker, "idem", 5)
    # Another producer supersedes every key: the first one's last batch is left empty.
    other = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for k in range(5):
        other.produce("idem", key=b"k%d" % k, value=b"other")
    other.flush(20)
    time.sleep(2)
    for k in range(5):  # the idempotent producer goes on with its sequence
        producer.produce("idem", key=b"k%d" % k, value=b"last", on_delivery=delivered)
    producer.flush(20)
    assert errors == []
    records = wait_for_records(broker, "idem", 5)
    assert {k: v for _o, k, v in records} == {b"k%d" % k: b"last" for k in range(5)}
    assert read_kafka_python(broker, "idem") == records


def test_aborted_records_never_come_back_and_committed_ones_are_deduplicated(start_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition

    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "txn", EAGER)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-compacted"})
    producer.init_transactions(20)
    for r in range(6):
        producer.begin_transaction()
        for k in range(4):
            producer.produce(
                "txn", key=b"k%d" % k, value=b"%d-%s" % (r, b"abort" if r % 2 else b"ok")
            )
        producer.flush(20)  # in the log before the outcome, aborted records too
        if r % 2:
            producer.abort_transaction(20)
        else:
            producer.commit_transaction(20)
    # committed: rounds 0, 2, 4; the last committed value of each key is round 4's.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"g-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition("txn", 0, 0)])
        seen = []
        idle = 0
        while idle < 4:
            message = consumer.poll(0.5)
            if message is None or message.error():
                idle += 1
                continue
            seen.append((message.key(), message.value()))
        consumer.close()
        if len(seen) == 4:
            break
        time.sleep(1)
    assert sorted(seen) == [(b"k%d" % k, b"4-ok") for k in range(4)]
    # read_uncommitted sees no aborted record either: they were removed.
    assert all(b"abort" not in v for _o, _k, v in read_confluent(broker, "txn") if v)


def test_the_policy_switched_at_run_time_takes_effect_at_each_step(start_broker):
    broker = start_broker(extra_args=FAST)
    create_topic(broker.bootstrap, "switch", {"cleanup.policy": "delete"})
    produce(broker, "switch")
    time.sleep(2)
    assert len(read_confluent(broker, "switch")) == ROUNDS * KEYS  # delete: all kept
    set_topic_configs(broker.bootstrap, "switch", EAGER)
    assert len(wait_for_records(broker, "switch", KEYS)) == KEYS  # compact: cleaned
    set_topic_configs(broker.bootstrap, "switch", {"cleanup.policy": "delete"})
    last = produce(broker, "switch")
    time.sleep(2)
    records = read_confluent(broker, "switch")
    assert len(records) == KEYS + ROUNDS * KEYS  # delete again: nothing more cleaned
    assert {k: v for _o, k, v in records[-KEYS:]} == last


@pytest.mark.parametrize("fault", ["cleaning.after_upload", "cleaning.after_commit"])
def test_a_cleaning_killed_midway_loses_nothing_and_the_next_round_finishes(
    start_broker, tmp_path, fault
):
    import signal

    data_dir = tmp_path / "data"
    off = ["--log-cleaner-enable", "false", "--compaction", "false"]
    broker = start_broker(extra_args=off, data_dir=data_dir)
    create_topic(broker.bootstrap, "k9", EAGER)
    last = produce(broker, "k9")
    before = read_confluent(broker, "k9")
    assert len(before) == ROUNDS * KEYS
    broker.stop()

    fast = ["--log-cleaner-backoff-ms", "300", "--compaction", "false"]
    try:
        killed = start_broker(
            extra_args=fast, data_dir=data_dir, port=broker.port, env={"BUCKETLOG_FAULT_POINTS": fault}
        )
    except RuntimeError as exc:  # the cleaner's first pass comes at once: maybe before it listens
        assert f"exited with {-signal.SIGKILL} before listening" in str(exc), exc
    else:
        assert killed.proc is not None
        assert killed.proc.wait(30) == -signal.SIGKILL, "the fault point was not reached"

    # What the killed round left, read with the cleaner off: all of it (killed before its
    # commit), or the cleaned partition (killed after it, before the round's end).
    looked = start_broker(extra_args=off, data_dir=data_dir, port=broker.port)
    left = read_confluent(looked, "k9")
    if fault == "cleaning.after_upload":
        assert left == before
    else:
        assert len(left) == KEYS
    assert {k: v for _o, k, v in left[-KEYS:]} == last
    looked.stop()

    again = start_broker(extra_args=fast, data_dir=data_dir, port=broker.port)
    records = wait_for_records(again, "k9", KEYS)
    assert {k: v for _o, k, v in records} == last
    assert [o for o, _k, _v in records] == list(range((ROUNDS - 1) * KEYS, ROUNDS * KEYS))


def test_compact_and_delete_cleans_and_then_retention_takes_the_cleaned_log(start_broker):
    from confluent_kafka import Consumer, TopicPartition

    broker = start_broker(extra_args=[*FAST, "--log-retention-check-interval-ms", "300"])
    retention_ms = 8000
    both = {**EAGER, "cleanup.policy": "compact,delete", "retention.ms": str(retention_ms)}
    create_topic(broker.bootstrap, "both", both)
    create_topic(broker.bootstrap, "only-compact", {**EAGER, "retention.ms": str(retention_ms)})
    produced_at = time.monotonic()
    last = produce(broker, "both")
    produce(broker, "only-compact")
    # Compaction applies: one record per key, well before retention comes.
    records = wait_for_records(broker, "both", KEYS)
    assert time.monotonic() - produced_at < retention_ms / 1000, "too slow to tell apart"
    assert {key: value for _o, key, value in records} == last

    # Then retention applies to the cleaned log: every record expires, the log start
    # offset reaches the end. The topic with cleanup.policy=compact alone keeps its own.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})

    def watermarks(topic: str) -> tuple[int, int]:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)

    deadline = time.monotonic() + 30
    while watermarks("both")[0] < ROUNDS * KEYS and time.monotonic() < deadline:
        time.sleep(0.3)
    assert watermarks("both") == (ROUNDS * KEYS, ROUNDS * KEYS)
    assert watermarks("only-compact")[0] == 0
    assert len(read_confluent(broker, "only-compact")) == KEYS
    consumer.close()
