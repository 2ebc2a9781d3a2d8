"""Helpers for the real-client end-to-end tests (tests/e2e/test_clients.py).

Every helper produces or consumes with one real Kafka client and turns what it sent or
read into `Rec` values, so the tests can compare records exactly: partition, offset,
key, value, headers, timestamp and timestamp type.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.support.brokerproc import BrokerProcess, free_ports

Headers = tuple[tuple[str, bytes | None], ...]

CONSUME_TIMEOUT_S = 30.0
BASE_TS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
CREATE_TIME = "create"
LOG_APPEND_TIME = "append"
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1048588


@dataclass(frozen=True)
class Rec:
    """One record as produced (partition/offset from the ack) or as consumed."""

    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None
    partition: int | None = None
    offset: int | None = None
    ts_type: str = CREATE_TIME

    def short(self) -> str:
        def cut(b: bytes | None) -> str:
            if b is None:
                return "None"
            return repr(b[:40]) + (f"...({len(b)} bytes)" if len(b) > 40 else "")

        hdrs = [(k, cut(v)) for k, v in self.headers]
        return (
            f"p{self.partition}@{self.offset} key={cut(self.key)} value={cut(self.value)} "
            f"headers={hdrs} ts={self.timestamp} ({self.ts_type})"
        )


def norm_headers(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Headers:
    if not headers:
        return ()
    out = []
    for k, v in headers:
        if isinstance(v, str):
            v = v.encode()
        out.append((k, None if v is None else bytes(v)))
    return tuple(out)


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- record sets ----------------------------------------------------------------------


def sample_records(
    tag: str,
    count: int,
    *,
    null_header_values: bool = True,
    null_key_and_value: bool = True,
    kcat_safe: bool = False,
) -> list[Rec]:
    """A deterministic mix: null keys, empty keys, tombstones, empty values, headers
    (none, repeated names, empty and null values, non-ASCII names), binary bytes and
    explicit CreateTime timestamps that are not monotonic within a batch.

    `kcat_safe` leaves out what kcat's text output cannot show unambiguously: binary
    bytes, '|' / ',' / '=' / newlines, and the literal header value NULL.
    Some clients refuse a record whose key and value are both null
    (`null_key_and_value=False`): such a record gets an empty key instead."""
    rng = random.Random(tag)
    records = []
    for i in range(count):
        if i % 7 == 3:
            key = None
        elif i % 23 == 11:
            key = b""
        else:
            key = f"{tag}-key-{i % 41}".encode()
        if i % 13 == 5:
            value = None  # tombstone
        elif i % 17 == 8:
            value = b""
        else:
            value = (f"{tag} value {i} " * (1 + i % 9)).encode()
            if not kcat_safe and i % 4 == 0:
                value += bytes(range(256)) + rng.randbytes(64)
        if key is None and value is None and not null_key_and_value:
            key = b""
        kind = i % 5
        if kind == 0:
            headers: Headers = ()
        elif kind == 1:
            headers = (("trace-id", f"{i:08x}".encode()),)
        elif kind == 2:
            headers = (("dup", b"first"), ("dup", b"second"), ("empty", b""))
        elif kind == 3:
            headers = (("null-value", None),) if null_header_values else (("zero", b"\x00"),)
        else:
            last = b"plain-ascii" if kcat_safe else bytes([0, 255, 10, 13, 44, 61, 124])
            headers = (("ключ-é", "значение".encode()), ("bin", last))
        timestamp = BASE_TS + i * 37 - (i % 3) * 1_000  # jumps backwards now and then
        records.append(Rec(key, value, headers, timestamp))
    return records


def large_record(size: int, tag: str = "large") -> Rec:
    """An incompressible record of `size` value bytes."""
    value = random.Random(tag).randbytes(size)
    return Rec(f"{tag}-key".encode(), value, (("size", str(size).encode()),), BASE_TS + 123_456)


# -- comparison -----------------------------------------------------------------------


def by_partition(records: Iterable[Rec]) -> dict[int, list[Rec]]:
    grouped: dict[int, list[Rec]] = defaultdict(list)
    for rec in records:
        assert rec.partition is not None, f"record without partition: {rec.short()}"
        grouped[rec.partition].append(rec)
    return dict(grouped)


def assert_dense(records: Sequence[Rec], what: str, start: dict[int, int] | None = None) -> None:
    """Offsets in each partition are exactly start, start + 1, ... (start 0 unless given)
    in the given order."""
    for partition, recs in sorted(by_partition(records).items()):
        first = (start or {}).get(partition, 0)
        offsets = [r.offset for r in recs]
        if offsets != list(range(first, first + len(recs))):
            raise AssertionError(
                f"{what}: offsets of partition {partition} are not dense from {first} in "
                f"order: {_abbrev(offsets)}"
            )


def assert_same_records(
    produced: Sequence[Rec], consumed: Sequence[Rec], start: dict[int, int] | None = None
) -> None:
    """`produced` carries the partition/offset of each ack, in send order; `consumed` is
    what a consumer read. Both must be dense from offset 0 in every partition (the
    consumer from `start[partition]` when it began there), and equal field by field."""
    assert_dense(produced, "producer acks")
    consumed_sorted = sorted(consumed, key=lambda r: (r.partition, r.offset))
    assert_dense(consumed_sorted, "consumed records", start)
    if start:
        produced = [r for r in produced if r.offset >= start.get(r.partition, 0)]
    want = by_partition(produced)
    got = by_partition(consumed_sorted)
    problems = []
    if sorted(want) != sorted(got):
        problems.append(f"partitions: produced to {sorted(want)}, consumed from {sorted(got)}")
    for partition in sorted(set(want) | set(got)):
        w, g = want.get(partition, []), got.get(partition, [])
        if len(w) != len(g):
            problems.append(f"partition {partition}: produced {len(w)} records, read {len(g)}")
        for a, b in zip(w, g, strict=False):
            if a != b:
                problems.append(
                    f"partition {partition}:\n  produced {a.short()}\n  consumed {b.short()}"
                )
    if problems:
        raise AssertionError(f"{len(problems)} mismatches (first 10):\n" + "\n".join(problems[:10]))


def assert_same_in_partition_order(sent: Sequence[Rec], consumed: Sequence[Rec]) -> None:
    """For producers that report no offsets (kcat): `sent` has the expected partition of
    every record, in send order; offsets must come out dense from 0."""
    counters: dict[int, int] = defaultdict(int)
    expected = []
    for rec in sent:
        assert rec.partition is not None
        expected.append(replace(rec, offset=counters[rec.partition]))
        counters[rec.partition] += 1
    assert_same_records(expected, consumed)


def _abbrev(values: list) -> str:
    return repr(values) if len(values) <= 20 else f"{values[:10]} ... {values[-10:]}"


def librdkafka_partition(key: bytes | None, partitions: int) -> int | None:
    """librdkafka's default `consistent_random` partitioner (CRC32 of the key); None
    for null or empty keys, which it places at random."""
    if partitions == 1:
        return 0
    if not key:
        return None
    return zlib.crc32(key) % partitions


# -- brokers and topics ------------------------------------------------------------------


@dataclass
class Topic:
    name: str
    bootstrap: str
    partitions: int
    configs_applied: bool
    broker: BrokerProcess


@dataclass
class BrokerPool:
    """Lazily started brokers, one per `--default-partitions` value, shared by a module.

    Topics are made with CreateTopics when the broker has it; otherwise by
    auto-creation on a Metadata request, on the broker whose default partition count
    matches the wanted one (topic configs are then left at their defaults)."""

    base_dir: Path
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)
    create_topics_supported: bool | None = None

    def broker(self, default_partitions: int = 1) -> BrokerProcess:
        if default_partitions not in self.brokers:
            port = free_ports(1)[0]
            data = self.base_dir / f"p{default_partitions}" / "data"
            data.parent.mkdir(parents=True, exist_ok=True)
            proc = BrokerProcess(
                data_dir=data,
                port=port,
                extra_args=["--default-partitions", str(default_partitions)],
            )
            self.brokers[default_partitions] = proc.start()
        return self.brokers[default_partitions]

    def stop(self) -> None:
        for proc in self.brokers.values():
            proc.stop()

    def topic(self, prefix: str, partitions: int, configs: dict[str, str] | None = None) -> Topic:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        broker = self.broker(partitions)
        name = unique_topic(prefix)
        applied = False
        if self.create_topics_supported is not False:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            futures = admin.create_topics(
                [NewTopic(name, partitions, 1, config=dict(configs or {}))],
                operation_timeout=10,
                request_timeout=10,
            )
            try:
                futures[name].result(timeout=15)
                self.create_topics_supported = True
                applied = True
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._UNSUPPORTED_FEATURE:
                    raise
                self.create_topics_supported = False
        if not applied:
            ensure_topic(broker.bootstrap, name)
        found = topic_partitions(broker.bootstrap, name)
        assert found == partitions, f"topic {name} has {found} partitions, wanted {partitions}"
        return Topic(name, broker.bootstrap, partitions, applied, broker)


def ensure_topic(bootstrap: str, name: str) -> None:
    """Auto-create `name` with a Metadata request that allows it (producer metadata)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 15
    while True:
        md = producer.list_topics(name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None and t.partitions:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {name} was not auto-created: {t and t.error}")
        time.sleep(0.1)


def create_topic(
    bootstrap: str, name: str, configs: dict[str, str] | None = None, partitions: int = 1
) -> None:
    """CreateTopics through confluent-kafka's AdminClient; raises if refused."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answer is in
    topic = NewTopic(name, partitions, 1, config=configs or {})
    admin.create_topics([topic])[name].result(timeout=20)


def set_topic_configs(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET of each config; raises if refused."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answer is in
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)


def read_confluent(
    broker: BrokerProcess, topic: str, start: int = 0
) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of partition 0 of `topic` from `start` to its high watermark,
    read with confluent-kafka (assign, no group): a compacted topic's gaps and empty
    batches are passed over."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, start)])
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    out = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            out.append((message.offset(), message.key(), message.value()))
        # Done once the position passed the end (the last offsets may be markers).
        (position,) = consumer.position([TopicPartition(topic, 0)])
        if position.offset >= high:
            break
    consumer.close()
    return out


def topic_partitions(bootstrap: str, name: str) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(name, timeout=10)
    t = md.topics[name]
    assert t.error is None, f"metadata error for {name}: {t.error}"
    return len(t.partitions)


def _deadline_failure(client: str, topic: str, want: dict[int, int], got: dict[int, int]) -> str:
    missing = {p: (got.get(p, 0), n) for p, n in want.items() if got.get(p, 0) < n}
    return (
        f"{client}: timed out after {CONSUME_TIMEOUT_S}s consuming {topic}; "
        f"partitions still short (read, end offset): {missing}"
    )


# -- kafka-python -------------------------------------------------------------------------


def kafka_python_codec_missing(codec: str) -> str | None:
    """Why kafka-python cannot use `codec` here, or None."""
    from kafka import codec as kc

    needs = {
        "gzip": (kc.has_gzip, "gzip"),
        "snappy": (kc.has_snappy, "snappy (python-snappy)"),
        "lz4": (kc.has_lz4, "lz4 (lz4.frame)"),
        "zstd": (kc.has_zstd, "zstandard"),
    }
    if codec == "none":
        return None
    check, module = needs[codec]
    if check():
        return None
    return f"kafka-python cannot use {codec}: module {module} is not installed"


def kp_produce(bootstrap: str, topic: str, records: Sequence[Rec], **config) -> list[Rec]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in records
        ]
        producer.flush(timeout=30)
        acked = []
        for rec, fut in zip(records, futures, strict=True):
            md = fut.get(timeout=30)
            acked.append(replace(rec, partition=md.partition, offset=md.offset))
        return acked
    finally:
        producer.close(timeout=10)


def kp_consume(bootstrap: str, topic: str, partitions: int, **config) -> list[Rec]:
    from kafka import KafkaConsumer, TopicPartition

    settings = {
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
        "fetch_max_bytes": 64 * 1024 * 1024,
        **config,
    }
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **settings
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
        got: list[Rec] = []
        counts: dict[int, int] = defaultdict(int)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(counts[p] < n for p, n in ends.items()):
            if time.monotonic() > deadline:
                raise AssertionError(_deadline_failure("kafka-python", topic, ends, counts))
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                for m in msgs:
                    counts[tp.partition] += 1
                    got.append(
                        Rec(
                            m.key,
                            m.value,
                            norm_headers(m.headers),
                            m.timestamp,
                            m.partition,
                            m.offset,
                            CREATE_TIME if m.timestamp_type == 0 else LOG_APPEND_TIME,
                        )
                    )
        return got
    finally:
        consumer.close()


# -- confluent-kafka ------------------------------------------------------------------------


def ck_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], config: dict | None = None
) -> list[Rec]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})
    acked: dict[int, Rec] = {}
    errors: list[str] = []

    def on_delivery(index: int, rec: Rec):
        def cb(err, msg):
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                acked[index] = replace(rec, partition=msg.partition(), offset=msg.offset())

        return cb

    for i, rec in enumerate(records):
        kwargs = {}
        if rec.partition is not None:
            kwargs["partition"] = rec.partition
        while True:
            try:
                producer.produce(
                    topic,
                    value=rec.value,
                    key=rec.key,
                    headers=list(rec.headers),
                    timestamp=rec.timestamp or 0,
                    on_delivery=on_delivery(i, rec),
                    **kwargs,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"confluent-kafka: {remaining} records still undelivered after 30s"
    assert not errors, "confluent-kafka delivery errors:\n" + "\n".join(errors[:10])
    return [acked[i] for i in range(len(records))]


def ck_produce_expect_error(
    bootstrap: str, topic: str, record: Rec, config: dict | None = None
) -> object:
    """Produce one record that should be refused; returns the delivery error."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **(config or {})})
    outcome: list = []
    producer.produce(
        topic,
        value=record.value,
        key=record.key,
        headers=list(record.headers),
        timestamp=record.timestamp or 0,
        on_delivery=lambda err, msg: outcome.append((err, msg)),
    )
    remaining = producer.flush(30)
    assert remaining == 0 and outcome, "confluent-kafka: no delivery report within 30s"
    err, msg = outcome[0]
    assert err is not None, f"record was accepted at p{msg.partition()}@{msg.offset()}"
    return err


def ck_consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    config: dict | None = None,
    start: dict[int, int] | None = None,
) -> list[Rec]:
    """Everything from offset 0 (or `start[partition]`) to the high watermark, read
    with assign() at explicit offsets; group.id is set but nothing subscribes."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("e2e-group"),
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "receive.message.max.bytes": 80 * 1024 * 1024,
            **(config or {}),
        }
    )
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=10, cached=False
            )
            assert low == 0, f"partition {p} of {topic} starts at {low}, not 0"
            ends[p] = high
        first = {p: (start or {}).get(p, 0) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, first[p]) for p in range(partitions)])
        got: list[Rec] = []
        counts: dict[int, int] = defaultdict(int)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(first[p] + counts[p] < n for p, n in ends.items()):
            if time.monotonic() > deadline:
                read = {p: first[p] + n for p, n in counts.items()}
                raise AssertionError(_deadline_failure("confluent-kafka", topic, ends, read))
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is not None:
                    raise AssertionError(f"confluent-kafka consumer error: {m.error()}")
                ts_type, ts = m.timestamp()
                counts[m.partition()] += 1
                got.append(
                    Rec(
                        m.key(),
                        m.value(),
                        norm_headers(m.headers()),
                        ts,
                        m.partition(),
                        m.offset(),
                        CREATE_TIME if ts_type == TIMESTAMP_CREATE_TIME else LOG_APPEND_TIME,
                    )
                )
        return got
    finally:
        consumer.close()


# -- aiokafka -------------------------------------------------------------------------------


def aiokafka_codec_missing(codec: str) -> str | None:
    from aiokafka import codec as ac

    needs = {
        "gzip": ac.has_gzip,
        "snappy": ac.has_snappy,
        "lz4": ac.has_lz4,
        "zstd": ac.has_zstd,
    }
    if codec == "none" or needs[codec]():
        return None
    return f"aiokafka cannot use {codec}: module cramjam is not installed"


async def aio_produce(bootstrap: str, topic: str, records: Sequence[Rec], **config) -> list[Rec]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=r.value,
                key=r.key,
                partition=r.partition,
                timestamp_ms=r.timestamp,
                headers=list(r.headers),
            )
            for r in records
        ]
        metas = await asyncio.wait_for(asyncio.gather(*futures), 30)
        return [
            replace(r, partition=md.partition, offset=md.offset)
            for r, md in zip(records, metas, strict=True)
        ]
    finally:
        await producer.stop()


async def aio_consume(bootstrap: str, topic: str, partitions: int, **config) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    settings = {
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
        "fetch_max_bytes": 64 * 1024 * 1024,
        **config,
    }
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **settings
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
        got: list[Rec] = []
        counts: dict[int, int] = defaultdict(int)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(counts[p] < n for p, n in ends.items()):
            if time.monotonic() > deadline:
                raise AssertionError(_deadline_failure("aiokafka", topic, ends, counts))
            batches = await consumer.getmany(timeout_ms=200)
            for tp, msgs in batches.items():
                for m in msgs:
                    counts[tp.partition] += 1
                    got.append(
                        Rec(
                            m.key,
                            m.value,
                            norm_headers(m.headers),
                            m.timestamp,
                            m.partition,
                            m.offset,
                            CREATE_TIME if m.timestamp_type == 0 else LOG_APPEND_TIME,
                        )
                    )
        return got
    finally:
        await consumer.stop()


# -- kcat ----------------------------------------------------------------------------------

# Lengths (%K, %S: -1 for NULL) come first so null and empty keys/values differ.
KCAT_FORMAT = "%p|%o|%T|%K|%S|%k|%s|%h\\n"


def kcat(args: list[str], *, stdin: bytes | None = None, timeout: float = 30) -> bytes:
    try:
        done = subprocess.run(
            ["kcat", *args], input=stdin, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"kcat {' '.join(args)} did not finish in {timeout}s") from exc
    if done.returncode != 0:
        raise AssertionError(
            f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return done.stdout


def parse_kcat_headers(text: str) -> Headers:
    """kcat's %h: `name=value` pairs joined by ',', a null value printed as `name=NULL`
    (so the tests never send the literal value NULL)."""
    if not text:
        return ()
    out = []
    for item in text.split(","):
        name, _, value = item.partition("=")
        out.append((name, None if value == "NULL" else value.encode()))
    return tuple(out)


def kcat_consume(bootstrap: str, topic: str) -> list[Rec]:
    """All records of `topic` (every partition, from the beginning, until the end).
    Keys, values and header values must not contain '|', ',' or newlines."""
    out = kcat(
        ["-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", KCAT_FORMAT],
        timeout=CONSUME_TIMEOUT_S,
    )
    got = []
    for line in out.decode().splitlines():
        p, o, ts, klen, vlen, key, value, headers = line.split("|", 7)
        got.append(
            Rec(
                None if klen == "-1" else key.encode(),
                None if vlen == "-1" else value.encode(),
                parse_kcat_headers(headers),
                int(ts),
                int(p),
                int(o),
            )
        )
    return got


def kcat_consume_json(bootstrap: str, topic: str) -> list[dict]:
    out = kcat(
        ["-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-J"],
        timeout=CONSUME_TIMEOUT_S,
    )
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def kafka_python_batch_size(rec: Rec) -> int:
    """Bytes of the uncompressed one-record v2 batch kafka-python sends for `rec`
    (baseOffset and batchLength included, as max.message.bytes counts them)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=64 * 1024 * 1024,
    )
    builder.append(0, rec.timestamp, rec.key, rec.value, list(rec.headers))
    return len(builder.build())


def record_with_batch_size(batch_bytes: int, tag: str) -> Rec:
    """A record whose one-record uncompressed batch is exactly `batch_bytes` long (the
    key grows a little where a varint length would skip the wanted size)."""
    guess = batch_bytes - 128
    overhead = kafka_python_batch_size(large_record(guess, tag)) - guess
    for pad in range(4):
        for size in range(batch_bytes - overhead - 8, batch_bytes - overhead + 8):
            rec = large_record(size, tag)
            rec = replace(rec, key=rec.key + b"+" * pad)
            if kafka_python_batch_size(rec) == batch_bytes:
                return rec
    raise AssertionError(f"no record gives a {batch_bytes}-byte batch")
