"""Helpers of the integration tests: records produced with confluent-kafka and read back
with kafka-python, the Apache Kafka command-line tools, and what the broker advertises.

Records are compared as `Rec` values: topic, partition, offset, timestamp, key, value and
headers, exactly as they were acknowledged to the producer.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition
from kio.index import load_request_schema

from broker.entities import build
from tests.e2e.rawclient import roundtrip

ROOT = Path(__file__).resolve().parents[2]
INTEGRATION = ROOT / "integration"
TOOLS = INTEGRATION / "bin"

FIND_COORDINATOR = 10
END_TXN = 26
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
NO_GROUPS = "the broker does not implement consumer groups yet (issue 3)"
NO_TRANSACTIONS = "the broker does not implement transactions yet (issue 4)"

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, order=True)
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def advertised_apis(port: int) -> dict[int, tuple[int, int]]:
    """The broker's ApiVersions answer: api key -> (min version, max version)."""
    request = build(
        load_request_schema(18, 3),
        {"client_software_name": "bucketlog-tests", "client_software_version": "0"},
    )
    response = roundtrip(port, request)
    assert response.error_code == 0, response
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


def missing_groups_or_transactions(port: int, *, transactions: bool) -> str | None:
    """Why a test of groups (or transactions) cannot run yet, or None when it can."""
    apis = advertised_apis(port)
    if FIND_COORDINATOR not in apis:
        return NO_GROUPS
    if transactions and not {END_TXN, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS} <= apis.keys():
        return NO_TRANSACTIONS
    return None


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)],
        operation_timeout=30,
    )
    futures[name].result(30)
    return name


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[int, int, bytes | None, bytes | None, Headers]],
    **config: str | int | bool,
) -> list[Rec]:
    """Produce (partition, timestamp ms, key, value, headers) with confluent-kafka, one
    record at a time in order (so offsets follow the input order in each partition);
    returns the records as acknowledged, in input order."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True, **config}
    )
    acked: list[Rec] = []
    errors: list[object] = []
    for partition, timestamp, key, value, headers in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp=timestamp,
            headers=list(headers) or None,
            on_delivery=lambda err, msg, h=headers: (
                errors.append(err)
                if err
                else acked.append(
                    Rec(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.timestamp()[1],
                        msg.key(),
                        msg.value(),
                        tuple(h),
                    )
                )
            ),
        )
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, (remaining, errors)
    return acked


def consume_all(
    bootstrap: str, topic: str, *, isolation_level: str = "read_uncommitted"
) -> list[Rec]:
    """Every record of `topic` up to its current end, read with kafka-python (assign, no
    group), sorted by (partition, offset)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation_level,
        consumer_timeout_ms=1000,
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + 20
        while not partitions and time.monotonic() < deadline:
            time.sleep(0.2)
            partitions = consumer.partitions_for_topic(topic)
        # An unknown topic is the caller's mistake or the broker's fault, never "no records".
        assert partitions, f"{topic}: no partitions known to the consumer after 20 s"
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[Rec] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: stuck before {end}"
            for tp, messages in consumer.poll(timeout_ms=500).items():
                for m in messages:
                    if m.offset < end[tp]:
                        out.append(
                            Rec(
                                m.topic,
                                m.partition,
                                m.offset,
                                m.timestamp,
                                m.key,
                                m.value,
                                tuple((k, v) for k, v in m.headers),
                            )
                        )
        return sorted(out)
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def assert_dense(records: Sequence[Rec]) -> None:
    """Offsets of each partition are 0, 1, 2, ... with no gap and no repeat."""
    by_partition: dict[int, list[int]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r.offset)
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition}"


def run_tool(
    tool: str, *args: str, stdin: str | None = None, timeout: float = 90, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run integration/bin/<tool> with `args`; stdout and stderr as text."""
    env = {**os.environ, "KAFKA_JVM_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    result = subprocess.run(
        [str(TOOLS / tool), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{tool} {' '.join(args)} exited with {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result
