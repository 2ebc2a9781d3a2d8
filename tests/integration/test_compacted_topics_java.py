"""Compacted topics cleaned by the broker, read by the Java clients of Apache Kafka 4.3.

The Java consumer reads a cleaned partition (offsets with gaps, producers' last batches
kept empty) as confluent-kafka reads it, and a seek into a gap lands on the next record.
A Kafka Streams application (integration/java/CountsApp.java) counts records per key in
a KTable; started again without its local state, it restores the table from its cleaned
changelog and goes on counting exactly.
"""

from __future__ import annotations

import collections
import random
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from kio.index import load_request_schema

from broker.entities import build
from protocol.records import iter_batches
from tests.e2e.clients_support import create_topic, read_confluent
from tests.e2e.rawclient import roundtrip
from tests.integration.support import INTEGRATION, run_tool
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

# The cleaner looks every 300 ms; a group's first rebalance does not wait.
FAST = [
    "--log-cleaner-backoff-ms", "300",
    "--compaction-interval-ms", "200",
    "--compaction-min-age-ms", "200",
    "--group-initial-rebalance-delay-ms", "0",
]  # fmt: skip
# A round cleans a partition as soon as anything in it is dirty.
EAGER = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
JVM_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx512m"]
STREAMS_JARS = INTEGRATION / ".cache" / "jars" / "streams"
COUNTS_APP = INTEGRATION / "java" / "CountsApp.java"
# Given to Streams for the changelog it creates: cleaned once anything in it is dirty, so
# that the cleaning left when the application stops is the whole changelog.
CHANGELOG_CONFIGS = {"min.cleanable.dirty.ratio": "0.01"}


def wait_for_records(broker: BrokerProcess, topic: str, count: int, timeout: float = 30):
    """(offset, key, value) of the topic once it reads as `count` records (cleaned)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_confluent(broker, topic)
        if len(records) == count or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


def raw_batches(broker: BrokerProcess, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, last offset, record count) of every batch of partition 0, from raw
    Fetch requests: what the Java consumer is given to step over."""
    batches: list[tuple[int, int, int]] = []
    offset = 0
    while True:
        request = build(
            load_request_schema(1, 12),
            {
                "replica_id": -1,
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": 50 << 20,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": 0,
                                "fetch_offset": offset,
                                "partition_max_bytes": 10 << 20,
                            }
                        ],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
        part = roundtrip(broker.port, request).responses[0].partitions[0]
        assert part.error_code == 0, part
        views = list(iter_batches(part.records or b""))
        assert views or offset >= part.high_watermark, f"no batch at {offset}: {part}"
        if not views:
            return batches
        for view in views:
            batches.append((view.base_offset, view.last_offset, view.record_count))
        offset = views[-1].next_offset


def java_console_consumer(bootstrap: str, topic: str, offset: int, count: int):
    """(offset, key, value) of the first `count` records of partition 0 of `topic` from
    `offset`, read by the Java KafkaConsumer of kafka-console-consumer (assign, no group)."""
    out = run_tool(
        "kafka-console-consumer",
        "--bootstrap-server", bootstrap,
        "--topic", topic,
        "--partition", "0",
        "--offset", str(offset),
        "--max-messages", str(count),
        "--timeout-ms", "30000",
        "--formatter-property", "print.offset=true",
        "--formatter-property", "print.key=true",
        "--formatter-property", "key.separator=|",
    ).stdout  # fmt: skip
    records = []
    for line in out.splitlines():
        printed_offset, key, value = line.split("|")
        records.append((int(printed_offset.removeprefix("Offset:")), key.encode(), value.encode()))
    return records


def test_the_java_consumer_reads_a_cleaned_partition(jars, start_broker):
    from confluent_kafka import Producer

    keys, producers, rounds_each = 20, 10, 3
    broker = start_broker(extra_args=FAST)
    topic = "cleaned"
    create_topic(broker.bootstrap, topic, EAGER)
    # Idempotent producers one after the other, each writing every key a few times: the
    # cleaner keeps each producer's last batch, emptied when later ones replaced it all.
    last: dict[bytes, bytes] = {}
    for p in range(producers):
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": True}
        )
        for r in range(rounds_each):
            for k in range(keys):
                key, value = f"key-{k}".encode(), f"value-{p}-{r}-{k}".encode()
                producer.produce(topic, key=key, value=value)
                last[key] = value
            assert producer.flush(20) == 0
    total = producers * rounds_each * keys

    records = wait_for_records(broker, topic, keys)
    assert {key: value for _o, key, value in records} == last
    # The last round's records, each at the offset it was given.
    assert [o for o, _k, _v in records] == list(range(total - keys, total))
    batches = raw_batches(broker, topic)
    empty = [(base, end) for base, end, count in batches if count == 0]
    assert len(empty) >= producers - 1, batches
    assert batches[-1][1] == total - 1

    # From offset 0: gaps and empty batches passed over, the same records. Their last
    # offset is the partition's last, so nothing can follow them.
    assert java_console_consumer(broker.bootstrap, topic, 0, keys) == records
    # Into the middle of an empty batch: the next record.
    base, end = empty[-1]
    assert java_console_consumer(broker.bootstrap, topic, (base + end) // 2, 1) == records[:1]


# -- Kafka Streams ---------------------------------------------------------------------


class CountsApp:
    """integration/java/CountsApp.java run from source; stopped by closing its stdin,
    killed on leaving the `with` block if still running."""

    def __init__(self, bootstrap: str, app_id: str, source: str, sink: str, state: Path, log: Path):
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [
                    "java",
                    *JVM_OPTIONS,
                    f"-Dlog4j2.configurationFile={INTEGRATION / 'log4j2.properties'}",
                    "-cp", f"{STREAMS_JARS}/*",
                    str(COUNTS_APP),
                    bootstrap, app_id, source, sink, str(state),
                    *(f"{name}={value}" for name, value in CHANGELOG_CONFIGS.items()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )  # fmt: skip

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            out = self.proc.stdout.read() if self.proc.stdout else ""
            raise AssertionError(
                f"CountsApp exited with {self.proc.returncode}\nstdout:\n{out}\n"
                f"stderr:\n{self.log.read_text()[-4000:]}"
            )

    def stop(self) -> list[str]:
        """Close stdin, wait for a clean close; the lines it printed."""
        out, _ = self.proc.communicate(input="", timeout=60)
        assert self.proc.returncode == 0 and "closed" in out.splitlines(), (
            f"CountsApp exited with {self.proc.returncode}\nstdout:\n{out}\n"
            f"stderr:\n{self.log.read_text()[-4000:]}"
        )
        return out.splitlines()

    def __enter__(self) -> CountsApp:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def produce_words(broker: BrokerProcess, topic: str, keys: list[str], rng: random.Random, n: int):
    """`n` records of keys drawn from `keys`; how many each key got."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    drawn = [rng.choice(keys) for _ in range(n)]
    for key in drawn:
        producer.produce(topic, key=key.encode(), value=b"x")
    assert producer.flush(20) == 0
    return collections.Counter(drawn)


def wait_for_counts(broker: BrokerProcess, app: CountsApp, sink: str, want, timeout: float = 40):
    """The latest count of each key in the output topic, once it equals `want`."""
    deadline = time.monotonic() + timeout
    while True:
        app.check_alive()
        latest = {
            key.decode(): int.from_bytes(value, "big", signed=True)
            for _o, key, value in read_confluent(broker, sink)
        }
        if latest == want or time.monotonic() > deadline:
            return latest
        time.sleep(0.5)


def restorations(lines: list[str]) -> list[tuple[str, int, int, int]]:
    """(changelog topic, from offset, to offset, records restored) of each restoration
    CountsApp reported."""
    started, out = {}, []
    for line in lines:
        kind, *fields = line.split()
        if kind == "restore-start":
            topic, partition, _store, start, end = fields
            started[topic, partition] = (int(start), int(end))
        elif kind == "restore-end":
            topic, partition, _store, total = fields
            out.append((topic, *started[topic, partition], int(total)))
    return out


def test_kafka_streams_restores_a_ktable_from_its_cleaned_changelog(jars, start_broker, tmp_path):
    from confluent_kafka.admin import AdminClient, ConfigResource

    broker = start_broker(extra_args=FAST)
    app_id = f"counts-{uuid.uuid4().hex[:6]}"
    source, sink = "words", "counts"
    changelog = f"{app_id}-counts-changelog"  # <application.id>-<store>-changelog
    create_topic(broker.bootstrap, source)
    create_topic(broker.bootstrap, sink)
    keys = [f"word-{i}" for i in range(10)]
    rng = random.Random(7)
    state = tmp_path / "streams-state"

    # Input in chunks, each counted before the next, so the changelog gets many batches;
    # each chunk updates fewer keys, so that the last updates of the keys, those cleaning
    # keeps, lie in batches far apart.
    first: collections.Counter[str] = collections.Counter()
    with CountsApp(broker.bootstrap, app_id, source, sink, state, tmp_path / "app-1.log") as app:
        for chunk in range(4):
            first += produce_words(broker, source, keys[: 10 - 2 * chunk], rng, 100)
            counts = wait_for_counts(broker, app, sink, dict(first))
            assert counts == dict(first)
        lines = app.stop()
    assert restorations(lines) in ([], [(changelog, 0, 0, 0)])  # nothing to restore yet

    # Streams created its changelog compacted; with no record cache, one update per input
    # record went into it. The cleaner leaves the last update of each key.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, changelog)
    configs = admin.describe_configs([resource])[resource].result(timeout=20)
    assert configs["cleanup.policy"].value == "compact"
    assert all(configs[name].value == value for name, value in CHANGELOG_CONFIGS.items())
    updates = first.total()
    cleaned = wait_for_records(broker, changelog, len(keys))
    assert len(cleaned) == len(keys) < updates
    kept = {key.decode(): int.from_bytes(value, "big", signed=True) for _o, key, value in cleaned}
    assert kept == dict(first)

    # No local state: the second run restores the table from the cleaned changelog.
    shutil.rmtree(state)
    second = produce_words(broker, source, keys, rng, 200)
    total = dict(first + second)
    with CountsApp(broker.bootstrap, app_id, source, sink, state, tmp_path / "app-2.log") as app:
        counts = wait_for_counts(broker, app, sink, total)
        lines = app.stop()
    assert counts == total
    # It read the changelog's offsets 0 to `updates`, but only the records cleaning left.
    assert restorations(lines) == [(changelog, 0, updates, len(keys))], lines
