"""Compaction with real clients: many small ingest files become a few objects per
partition, and every record reads back exactly as it was produced.

Brokers here look for jobs every 200 ms and merge ingest files as soon as they exist,
four at a time at each level (so that a few dozen flushes reach level 2); data is
produced with compaction off first where the test compares before with after.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from metadata import keys, log
from metadata import topics as topics_layer
from protocol.compression import Compression
from protocol.records import build_batch
from tests.e2e.test_retention import create, offsets, wait_for
from tests.e2e.wire import WireClient, fetch, produce
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

DELETE_DELAY_MS = 2000
COMPACT_L1 = [
    "--compaction-interval-ms",
    "200",
    "--compaction-min-age-ms",
    "1",
    "--compaction-max-inputs",
    "4",
    "--compaction-lease-ms",
    "3000",
    "--object-delete-delay-ms",
    str(DELETE_DELAY_MS),
]
COMPACT = [*COMPACT_L1, "--compaction-l2-max-inputs", "4"]
OFF = ["--compaction", "false", "--object-delete-delay-ms", str(DELETE_DELAY_MS)]
CODECS = list(Compression)  # none, gzip, snappy, lz4, zstd
READ_COMMITTED = {"isolation.level": "read_committed"}  # librdkafka's default
READ_UNCOMMITTED = {"isolation.level": "read_uncommitted"}

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]


def objects_per_partition(broker: BrokerProcess, topic: str, partitions: int) -> list[int]:
    """How many objects hold each partition's chunk entries, from the metadata store."""
    sub = keys.cluster_subspace("default")

    def read(tr):
        found = topics_layer.get_topic(tr, sub, topic)
        return [
            len({e.object_key for e in log.read_chunks(tr, sub, found.topic_id, p, 0)})
            for p in range(partitions)
        ]

    return broker.read_metadata(read)


def referenced_objects(broker: BrokerProcess) -> set[str]:
    """Every object a chunk entry names."""
    sub = keys.cluster_subspace("default")

    def read(tr):
        rows = tr.get_range(*sub.range(keys.CHUNK))
        return {str(keys.unpack_value(v)[0]) for _k, v in rows}

    return broker.read_metadata(read)


def queued_ingest_files(broker: BrokerProcess) -> int:
    sub = keys.cluster_subspace("default")
    return len(broker.read_metadata(lambda tr: tr.get_range(*sub.range(keys.L0_OBJECT))))


def read_records(
    broker: BrokerProcess, topic: str, partitions: int, expect: int, **config: str
) -> dict[int, list[Record]]:
    """Per partition, (offset, key, value, headers, timestamp) of `expect` records in all,
    read from offset 0 by confluent-kafka (every codec decoded by librdkafka)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"read-{topic}-{time.monotonic()}",
            "enable.auto.commit": False,
            **config,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    count = 0
    deadline = time.monotonic() + 30
    while count < expect and time.monotonic() < deadline:
        msg = consumer.poll(0.3)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        headers = [(k, bytes(v)) for k, v in (msg.headers() or [])]
        got[msg.partition()].append(
            (msg.offset(), msg.key(), msg.value(), headers, msg.timestamp()[1])
        )
        count += 1
    time.sleep(0.5)  # nothing more comes
    while (msg := consumer.poll(0.2)) is not None:
        raise AssertionError(f"an extra record: {msg.partition()}/{msg.offset()}")
    consumer.close()
    return got


def produce_flushes(
    broker: BrokerProcess, topics: dict[str, int], flushes: int, per_batch: int = 3
) -> dict[tuple[str, int], list[Record]]:
    """`flushes` Produce requests (one ingest file each), every one holding a batch for
    every partition of every topic, in codecs taking turns; what each partition holds."""
    expected: dict[tuple[str, int], list[Record]] = {
        (t, p): [] for t, n in topics.items() for p in range(n)
    }
    ts0 = int(time.time() * 1000) - 100_000
    with WireClient(broker.bootstrap) as client:
        for i in range(flushes):
            data: dict[str, dict[int, bytes]] = {}
            for t, n in topics.items():
                data[t] = {}
                for p in range(n):
                    records = []
                    for r in range(per_batch):
                        offset = len(expected[t, p])
                        key = None if r == 1 else b"key-%d" % offset
                        value = b"%s/%d/%d " % (t.encode(), p, offset) * (1 + offset % 7)
                        headers = [("h", b"%d" % offset)] if r != 2 else []
                        records.append((key, value, headers, ts0 + i * 10 + r))
                        expected[t, p].append((offset, key, value, headers, ts0 + i * 10 + r))
                    data[t][p] = build_batch(records, compression=CODECS[(i + p) % len(CODECS)])
            answer = produce(client, data)
            assert all(a.error_code == 0 for a in answer.values()), answer
    return expected


def test_many_flushes_end_in_a_few_objects_per_partition_and_read_back_exactly(
    start_broker, tmp_path
):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    topics = {"c1": 3, "c2": 2}  # both in every ingest file
    for name, partitions in topics.items():
        create(broker, name, partitions)
    expected = produce_flushes(broker, topics, flushes=48)
    assert objects_per_partition(broker, "c1", 3) == [48, 48, 48]
    before = {t: read_records(broker, t, n, 48 * 3 * n) for t, n in topics.items()}
    for t, n in topics.items():
        assert before[t] == {p: expected[t, p] for p in range(n)}
    broker.stop()

    again = start_broker(extra_args=COMPACT, data_dir=data_dir, port=broker.port)
    # 48 ingest files -> 12 level-1 objects (4 each) -> per partition 3 level-2 objects
    # (4 level-1 objects' entries each), a topic's partitions sharing each job and its
    # object: 3 jobs per topic. The replaced objects go after the delete delay.
    wait_for("ingest files deleted", lambda: again.object_keys("ingest/") == [], timeout=60)
    wait_for(
        "level-2 jobs done",
        lambda: again.stats().get("compaction", {}).get("l2_jobs") == 6,
        timeout=30,
    )
    assert objects_per_partition(again, "c1", 3) == [3, 3, 3]
    assert objects_per_partition(again, "c2", 2) == [3, 3]
    wait_for(
        "level-1 objects deleted",
        lambda: len(again.object_keys("compacted/")) == 6,
        timeout=30,
    )
    assert set(again.object_keys("compacted/")) == referenced_objects(again)
    stats = again.stats()["compaction"]
    assert (stats["l1_jobs"], stats["l1_dropped"], stats["l2_dropped"], stats["failures"]) == (
        12,
        0,
        0,
        0,
    )
    assert stats["bytes_written"] > 0 and stats["cpu_seconds"] > 0
    assert stats["entries_replaced"] == 48 * 5 + 12 * 5
    for t, n in topics.items():
        assert read_records(again, t, n, 48 * 3 * n) == before[t]
        for p in range(n):
            assert offsets(again, t, p) == (0, 48 * 3)


def test_level_two_comes_once_the_oldest_level_one_data_has_waited(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    create(broker, "slow", 2)
    expected = produce_flushes(broker, {"slow": 2}, flushes=12)
    broker.stop()

    # 12 ingest files -> 3 level-1 objects, far from 256 or 64 MiB: only the wait (2 s
    # here, 10 minutes by default) brings them to level 2, one job for both partitions.
    again = start_broker(
        extra_args=[*COMPACT_L1, "--compaction-l2-max-wait-ms", "2000"],
        data_dir=data_dir,
        port=broker.port,
    )
    wait_for("level 2", lambda: objects_per_partition(again, "slow", 2) == [1, 1], timeout=30)
    wait_for(
        "level-2 jobs counted",
        lambda: again.stats().get("compaction", {}).get("l2_jobs") == 1,
        timeout=10,
    )
    stats = again.stats()["compaction"]
    assert (stats["l1_jobs"], stats["l2_dropped"], stats["failures"]) == (3, 0, 0)
    assert read_records(again, "slow", 2, 12 * 3 * 2) == {p: expected["slow", p] for p in range(2)}


def test_aborted_transactions_stay_hidden_in_compacted_objects(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    create(broker, "tx", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "t1"})
    producer.init_transactions(15)
    committed = []
    for i in range(12):
        producer.begin_transaction()
        for j in range(4):
            value = b"txn-%d-%d" % (i, j)
            producer.produce("tx", value=value, partition=j % 2)
            producer.flush(10)  # an ingest file each
            if i % 3 != 1:
                committed.append(value)
        if i % 3 == 1:
            producer.abort_transaction(15)
        else:
            producer.commit_transaction(15)
    plain = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "zstd"})
    for k in range(6):
        plain.produce("tx", value=b"plain-%d" % k, key=b"k", partition=k % 2)
        plain.flush(10)
        committed.append(b"plain-%d" % k)

    def read_both(b: BrokerProcess):
        return (
            read_records(b, "tx", 2, len(committed), **READ_COMMITTED),
            read_records(b, "tx", 2, 12 * 4 + 6, **READ_UNCOMMITTED),
        )

    before_committed, before_all = read_both(broker)
    assert sorted(r[2] for rs in before_committed.values() for r in rs) == sorted(committed)
    aborted = {r[2] for rs in before_all.values() for r in rs} - set(committed)
    assert len(aborted) == 4 * 4  # read_uncommitted sees the aborted records
    before_objects = objects_per_partition(broker, "tx", 2)
    assert min(before_objects) >= 30
    broker.stop()

    again = start_broker(extra_args=COMPACT, data_dir=data_dir, port=broker.port)
    wait_for("ingest files compacted", lambda: queued_ingest_files(again) <= 1, timeout=60)
    # Each partition's level-2 job comes in its own round: wait for both.
    wait_for(
        "each partition in at most 8 objects",
        lambda: max(objects_per_partition(again, "tx", 2)) <= 8,
        timeout=60,
    )
    # Offsets, values, and what read_committed hides: all as before.
    assert read_both(again) == (before_committed, before_all)


def test_a_fetch_with_an_index_lookup_from_before_a_compaction_still_reads(start_broker):
    # Entries an agent read are used for half the delete delay (7 s here); the objects
    # they name are deleted 14 s after the compaction that replaced them.
    broker = start_broker(
        extra_args=[
            *COMPACT,
            "--compaction-min-age-ms",
            "2500",
            "--object-delete-delay-ms",
            "14000",
        ]
    )
    create(broker, "held")
    ts = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as client:
        for i in range(8):
            batch = build_batch([(None, b"v%d" % i, [], ts + i)], compression=CODECS[i % 5])
            assert produce(client, {"held": {0: batch}})["held", 0].error_code == 0

        def read() -> list[bytes]:
            answer = fetch(client, "held", 0, 0)
            assert answer.error_code == 0, answer
            return [r.value for r in _records(answer.records)]

        first = read()  # the entries of the 8 ingest files are now held in memory
        assert first == [b"v%d" % i for i in range(8)]
        # Two jobs at least (4 inputs each at most), until 7 of the 8 entries are replaced:
        # on a busy machine the last files can be too young for the first two jobs and
        # go in a third.
        wait_for(
            "compacted",
            lambda: (
                (c := broker.stats().get("compaction", {})).get("l1_jobs", 0) >= 2
                and c.get("entries_replaced", 0) >= 7
            ),
        )
        # Read again with the entries held: they name the ingest files, still there.
        assert len(broker.object_keys("ingest/")) == 8
        assert read() == first
        # Each ingest file holds one entry. The last one may have come too late for the
        # jobs (younger than the minimum age) and wait alone, uncompacted, for a partner.
        replaced = broker.stats()["compaction"]["entries_replaced"]
        assert replaced >= 7
        wait_for(
            "replaced ingest files deleted",
            lambda: len(broker.object_keys("ingest/")) == 8 - replaced,
            timeout=40,
        )
        # The entries held have expired: read again from the index, the compacted object.
        assert read() == first
    wait_for("expiry counted", lambda: broker.stats()["chunk_cache"]["expired"] >= 1)


def _settled(broker: BrokerProcess, topic: str, partitions: int) -> list[int] | None:
    """Objects per partition once two reads a second apart agree (no job moved them)."""
    before = objects_per_partition(broker, topic, partitions)
    time.sleep(1.0)
    after = objects_per_partition(broker, topic, partitions)
    return after if after == before else None


def _records(data: bytes) -> list:
    from protocol.records import iter_batches, iter_records

    return [r for view in iter_batches(data) for r in iter_records(view)]


def test_two_agents_share_the_jobs_and_commit_each_once(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(agents=2, extra_args=OFF, data_dir=data_dir)
    create(broker, "two", 4)
    expected = produce_flushes(broker, {"two": 4}, flushes=48)
    broker.stop()

    # Claims that outlive every job (a claim that lapses mid-job lets the other agent take
    # its inputs, and one of the two commits is dropped, as designed).
    lease = ["--compaction-lease-ms", "60000"]
    # Level 1 first, level 2 held back (12 level-1 objects a partition are fewer than its
    # default of 32 inputs and have not waited 10 minutes): the agents finish the level-1
    # jobs in any order, and level 2 then finds every partition's 12 pieces in place.
    again = start_broker(
        agents=2, extra_args=[*COMPACT_L1, *lease], data_dir=data_dir, port=broker.port
    )

    def total(name: str) -> int:  # over the agents started last (`again` at the call)
        return sum(again.stats(port).get("compaction", {}).get(name, 0) for port in again.ports)

    wait_for("ingest files deleted", lambda: again.object_keys("ingest/") == [], timeout=60)
    # Claims kept the agents apart: 12 level-1 jobs in all, none dropped (the counters
    # reach the stats files a second or so after the jobs).
    wait_for("12 level-1 jobs counted", lambda: total("l1_jobs") >= 12, timeout=10)
    assert (total("l1_jobs"), total("l1_dropped")) == (12, 0)
    assert total("l2_jobs") == 0
    assert objects_per_partition(again, "two", 4) == [12, 12, 12, 12]
    again.stop()

    again = start_broker(
        agents=2, extra_args=[*COMPACT, *lease], data_dir=data_dir, port=broker.port
    )
    # Level 2: three runs of four level-1 objects per partition, whichever agent runs each.
    wait_for(
        "three objects per partition",
        lambda: objects_per_partition(again, "two", 4) == [3, 3, 3, 3],
        timeout=90,
    )
    assert _settled(again, "two", 4) == [3, 3, 3, 3]  # and no job moves them on
    # The four partitions share a job while they are due together: 3 jobs at least.
    wait_for("3 level-2 jobs counted", lambda: total("l2_jobs") >= 3, timeout=5)
    assert (total("l1_jobs"), total("l2_dropped")) == (0, 0)
    assert read_records(again, "two", 4, 48 * 3 * 4) == {p: expected["two", p] for p in range(4)}


def test_ingest_files_of_large_entries_enter_level_one_without_a_copy(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    create(broker, "long", 2)
    expected = produce_flushes(broker, {"long": 2}, flushes=16)
    broker.stop()

    # Every entry of these files holds a batch of 3 records, over 64 bytes: the files
    # enter level 1 by their metadata, and level 2 (4 objects a job, both partitions
    # sharing it) merges them from there.
    again = start_broker(
        extra_args=[*COMPACT, "--compaction-promote-entry-bytes", "64"],
        data_dir=data_dir,
        port=broker.port,
    )
    wait_for("ingest files deleted", lambda: again.object_keys("ingest/") == [], timeout=60)
    wait_for(
        "level-2 jobs done",
        lambda: again.stats().get("compaction", {}).get("l2_jobs") == 4,
        timeout=30,
    )
    stats = again.stats()["compaction"]
    assert (stats["l1_promoted"], stats["l1_jobs"], stats["l2_dropped"], stats["failures"]) == (
        16,
        0,
        0,
        0,
    )
    # Only level 2 wrote: each input byte once (plus a header per object and chunk).
    assert stats["entries_replaced"] == 16 * 2
    assert objects_per_partition(again, "long", 2) == [4, 4]
    assert set(again.object_keys("compacted/")) == referenced_objects(again)
    assert queued_ingest_files(again) == 0
    assert read_records(again, "long", 2, 16 * 3 * 2) == {p: expected["long", p] for p in range(2)}
    for p in range(2):
        assert offsets(again, "long", p) == (0, 16 * 3)
