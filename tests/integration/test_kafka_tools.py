"""Apache Kafka's own command-line tools (integration/bin/kafka-*, Kafka 4.3) against
bucketlog: the Java AdminClient, producer and consumer as Kafka users first meet them."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.integration.support import (
    FIND_COORDINATOR,
    NO_GROUPS,
    Rec,
    advertised_apis,
    assert_dense,
    consume_all,
    create_topic,
    end_offsets,
    missing_groups_or_transactions,
    produce,
    run_tool,
    unique_topic,
)

pytestmark = pytest.mark.slow

BASE_TS = 1_730_000_000_000
LIGHTNING = {"bucketlog.topic.type": "lightning"}


@pytest.fixture(scope="module")
def bootstrap(jars, shared_broker) -> str:
    return shared_broker.bootstrap


def port_of(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


def topics_tool(bootstrap: str, *args: str, check: bool = True):
    return run_tool("kafka-topics", "--bootstrap-server", bootstrap, *args, check=check)


def describe_partitions(bootstrap: str, topic: str) -> list[dict[str, str]]:
    """kafka-topics --describe, one dict per partition line."""
    out = topics_tool(bootstrap, "--describe", "--topic", topic).stdout
    rows = []
    for line in out.splitlines():
        if "\tPartition:" in line:
            rows.append(dict(re.findall(r"(\w+):\s*(\S*)", line)))
    return rows


def test_tools_version(jars):
    assert run_tool("kafka-topics", "--version").stdout.strip() == "4.3.1"


def test_topics_create_list_describe_alter_delete(bootstrap):
    topic = unique_topic("tools-topic")
    created = topics_tool(
        bootstrap,
        "--create",
        "--topic",
        topic,
        "--partitions",
        "3",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=3600000",
    )
    assert f"Created topic {topic}." in created.stdout
    assert topic in topics_tool(bootstrap, "--list").stdout.split()

    described = topics_tool(bootstrap, "--describe", "--topic", topic).stdout
    header = described.splitlines()[0]
    assert f"Topic: {topic}" in header and "PartitionCount: 3" in header
    assert "ReplicationFactor: 1" in header and "retention.ms=3600000" in header
    parts = describe_partitions(bootstrap, topic)
    assert [p["Partition"] for p in parts] == ["0", "1", "2"]
    assert all(p["Leader"] == p["Replicas"] == p["Isr"] for p in parts)

    # Creating it again fails, unless told it may exist.
    again = topics_tool(bootstrap, "--create", "--topic", topic, check=False)
    assert again.returncode != 0 and "already exists" in again.stdout + again.stderr
    topics_tool(bootstrap, "--create", "--topic", topic, "--if-not-exists")

    topics_tool(bootstrap, "--alter", "--topic", topic, "--partitions", "5")
    assert [p["Partition"] for p in describe_partitions(bootstrap, topic)] == [
        str(i) for i in range(5)
    ]
    fewer = topics_tool(bootstrap, "--alter", "--topic", topic, "--partitions", "2", check=False)
    assert fewer.returncode != 0

    topics_tool(bootstrap, "--delete", "--topic", topic)
    deadline = time.monotonic() + 30
    while topic in topics_tool(bootstrap, "--list").stdout.split():
        assert time.monotonic() < deadline, "deleted topic still listed"
        time.sleep(0.5)
    missing = topics_tool(bootstrap, "--describe", "--topic", topic, check=False)
    assert missing.returncode != 0 and "does not exist" in missing.stdout + missing.stderr


def test_console_producer_to_console_consumer(bootstrap):
    topic = create_topic(bootstrap, unique_topic("tools-console"), 1)
    lines = [
        ("k1", "hello"),
        ("k2", "a value with spaces"),
        ("ключ", "значение ✓"),
        ("k3", ""),
    ]
    run_tool(
        "kafka-console-producer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=|",
        "--reader-property",
        "parse.headers=true",
        stdin="".join(f"source:console,n:{i}\t{k}|{v}\n" for i, (k, v) in enumerate(lines)),
    )
    consumed = run_tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        # An explicit partition and offset: assign(), no consumer group.
        "--partition",
        "0",
        "--offset",
        "earliest",
        "--max-messages",
        str(len(lines)),
        "--timeout-ms",
        "30000",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "print.offset=true",
        "--formatter-property",
        "print.headers=true",
        "--formatter-property",
        "key.separator=|",
    ).stdout
    # The formatter puts key.separator between every printed field.
    assert consumed.splitlines() == [
        f"Offset:{i}|source:console,n:{i}|{k}|{v}" for i, (k, v) in enumerate(lines)
    ]
    # The same records, as kafka-python reads them.
    read = consume_all(bootstrap, topic)
    assert [(r.offset, r.key, r.value, r.headers) for r in read] == [
        (i, k.encode(), v.encode(), (("source", b"console"), ("n", str(i).encode())))
        for i, (k, v) in enumerate(lines)
    ]


def test_configs_describe_and_alter(bootstrap):
    topic = create_topic(bootstrap, unique_topic("tools-configs"), 1)

    def configs(*extra: str) -> str:
        return run_tool(
            "kafka-configs",
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--entity-type",
            "topics",
            "--entity-name",
            topic,
            *extra,
        ).stdout

    def alter(*args: str, check: bool = True):
        return run_tool(
            "kafka-configs",
            "--bootstrap-server",
            bootstrap,
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            topic,
            *args,
            check=check,
        )

    assert configs().splitlines() == [f"Dynamic configs for topic {topic} are:"]
    alter("--add-config", "retention.ms=86400000,cleanup.policy=compact")
    dynamic = configs()
    assert "retention.ms=86400000 sensitive=false" in dynamic
    assert "DYNAMIC_TOPIC_CONFIG:retention.ms=86400000" in dynamic
    assert "cleanup.policy=compact sensitive=false" in dynamic
    every = configs("--all")
    assert "max.message.bytes=" in every and "retention.ms=86400000" in every

    alter("--delete-config", "cleanup.policy")
    dynamic = configs()
    assert "cleanup.policy" not in dynamic and "retention.ms=86400000" in dynamic

    bad = alter("--add-config", "retention.ms=soon", check=False)
    assert bad.returncode != 0
    assert "retention.ms=86400000" in configs()

    brokers = run_tool(
        "kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "brokers"
    ).stdout
    assert "configs for broker" in brokers


def test_get_offsets(bootstrap):
    topic = create_topic(bootstrap, unique_topic("tools-offsets"), 2)
    # Partition 0: times 0, 100, ..., 900 after BASE_TS; partition 1: 4 records.
    produce(
        bootstrap,
        topic,
        [(0, BASE_TS + i * 100, None, b"x", ()) for i in range(10)]
        + [(1, BASE_TS + i * 1000, None, b"y", ()) for i in range(4)],
    )

    def offsets(*args: str) -> dict[str, int]:
        out = run_tool(
            "kafka-get-offsets", "--bootstrap-server", bootstrap, "--topic", topic, *args
        ).stdout
        return {line.rsplit(":", 2)[1]: int(line.rsplit(":", 1)[1]) for line in out.split()}

    assert offsets() == {"0": 10, "1": 4}  # latest
    assert offsets("--time", "-1") == {"0": 10, "1": 4}
    assert offsets("--time", "-2") == {"0": 0, "1": 0}  # earliest
    assert offsets("--time", "latest", "--partitions", "1") == {"1": 4}
    # By timestamp: the first offset whose time is at or after it.
    assert offsets("--time", str(BASE_TS + 250)) == {"0": 3, "1": 1}
    assert offsets("--time", str(BASE_TS + 300)) == {"0": 3, "1": 1}
    # Past every record: no offset, so nothing listed.
    assert offsets("--time", str(BASE_TS + 5000)) == {}
    # -3: the record with the largest timestamp.
    assert offsets("--time", "-3") == {"0": 9, "1": 3}


def test_delete_records(bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique_topic("tools-delete-records"), 2)
    produce(
        bootstrap,
        topic,
        [(p, BASE_TS + i, None, b"x", ()) for p in (0, 1) for i in range(6)],
    )
    offsets_file = tmp_path / "offsets.json"
    offsets_file.write_text(
        '{"version": 1, "partitions": ['
        f'{{"topic": "{topic}", "partition": 0, "offset": 4}}, '
        f'{{"topic": "{topic}", "partition": 1, "offset": -1}}]}}'
    )
    out = run_tool(
        "kafka-delete-records",
        "--bootstrap-server",
        bootstrap,
        "--offset-json-file",
        str(offsets_file),
    ).stdout
    assert f"partition: {topic}-0\tlow_watermark: 4" in out, out
    assert f"partition: {topic}-1\tlow_watermark: 6" in out, out
    earliest = run_tool(
        "kafka-get-offsets", "--bootstrap-server", bootstrap, "--topic", topic, "--time", "-2"
    ).stdout.split()
    assert sorted(earliest) == [f"{topic}:0:4", f"{topic}:1:6"]
    # Past the high watermark: the tool reports Kafka's error for the partition.
    offsets_file.write_text(
        f'{{"version": 1, "partitions": [{{"topic": "{topic}", "partition": 0, "offset": 99}}]}}'
    )
    failed = run_tool(
        "kafka-delete-records",
        "--bootstrap-server",
        bootstrap,
        "--offset-json-file",
        str(offsets_file),
        check=False,
    )
    assert "OffsetOutOfRangeException" in failed.stdout + failed.stderr, failed


def test_producer_and_consumer_perf_tools(bootstrap):
    topic = create_topic(bootstrap, unique_topic("tools-perf"), 3)
    records = 20_000
    out = run_tool(
        "kafka-producer-perf-test",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        "200",
        "--throughput",
        "-1",
        "--bootstrap-server",
        bootstrap,
        "--command-property",
        "acks=all",
        "linger.ms=5",
        timeout=180,
    ).stdout
    assert f"{records} records sent" in out.splitlines()[-1]
    assert sum(end_offsets(bootstrap, topic).values()) == records
    read = consume_all(bootstrap, topic)
    assert len(read) == records
    assert_dense(read)
    assert all(len(r.value) == 200 for r in read)

    if FIND_COORDINATOR not in advertised_apis(port_of(bootstrap)):
        pytest.skip(NO_GROUPS)  # the perf consumer subscribes as a group member
    out = run_tool(
        "kafka-consumer-perf-test",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--timeout",
        "60000",
        "--group",
        unique_topic("perf-group"),
        timeout=180,
    ).stdout
    header, values = out.strip().splitlines()[-2:]
    stats = dict(zip(header.split(", "), values.split(", "), strict=True))
    assert int(stats["data.consumed.in.nMsg"]) == records
    assert float(stats["data.consumed.in.MB"]) == pytest.approx(records * 200 / 2**20, rel=1e-3)


def group_table(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """kafka-consumer-groups --describe: (topic, partition) -> (current, log end, lag)."""
    out = run_tool(
        "kafka-consumer-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group
    ).stdout
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[0] == group:
            current = -1 if cols[3] == "-" else int(cols[3])
            lag = -1 if cols[5] == "-" else int(cols[5])
            rows[(cols[1], int(cols[2]))] = (current, int(cols[4]), lag)
    return rows


def test_consumer_groups_list_describe_reset(bootstrap):
    reason = missing_groups_or_transactions(port_of(bootstrap), transactions=False)
    if reason:
        pytest.skip(reason)
    topic = create_topic(bootstrap, unique_topic("tools-groups"), 2)
    produced: list[Rec] = produce(
        bootstrap,
        topic,
        [(i % 2, BASE_TS + i * 1000, f"k{i}".encode(), f"v{i}".encode(), ()) for i in range(10)],
    )
    group = unique_topic("tools-group")

    def consumer(max_messages: int) -> list[str]:
        return run_tool(
            "kafka-console-consumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--from-beginning",
            "--max-messages",
            str(max_messages),
            "--timeout-ms",
            "30000",
            "--command-property",
            "enable.auto.commit=true",
        ).stdout.splitlines()

    # A group member reads everything and commits as it leaves.
    assert sorted(consumer(10)) == sorted(r.value.decode() for r in produced)
    listed = run_tool("kafka-consumer-groups", "--bootstrap-server", bootstrap, "--list").stdout
    assert group in listed.split()
    assert group_table(bootstrap, group) == {(topic, 0): (5, 5, 0), (topic, 1): (5, 5, 0)}

    state = run_tool(
        "kafka-consumer-groups",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--group",
        group,
        "--state",
    ).stdout
    assert re.search(rf"^{re.escape(group)}\s.*\bEmpty\s+0\s*$", state, re.M), state

    def reset(*how: str, target: str = topic) -> str:
        return run_tool(
            "kafka-consumer-groups",
            "--bootstrap-server",
            bootstrap,
            "--reset-offsets",
            "--group",
            group,
            "--topic",
            target,
            *how,
            "--execute",
        ).stdout

    reset("--to-earliest")
    assert group_table(bootstrap, group) == {(topic, 0): (0, 5, 5), (topic, 1): (0, 5, 5)}
    reset("--to-offset", "3", target=f"{topic}:1")
    assert group_table(bootstrap, group)[(topic, 1)] == (3, 5, 2)
    reset("--shift-by", "1")
    assert group_table(bootstrap, group) == {(topic, 0): (1, 5, 4), (topic, 1): (4, 5, 1)}
    # By time: partition 0 holds records 0, 2, 4, 6, 8 (seconds after BASE_TS).
    when = time.strftime("%Y-%m-%dT%H:%M:%S.000", time.gmtime((BASE_TS + 4000) / 1000))
    reset("--to-datetime", when)
    assert group_table(bootstrap, group) == {(topic, 0): (2, 5, 3), (topic, 1): (2, 5, 3)}
    reset("--to-latest")
    assert group_table(bootstrap, group) == {(topic, 0): (5, 5, 0), (topic, 1): (5, 5, 0)}

    # The member resumes from the committed offsets: nothing left, until more arrives.
    produce(bootstrap, topic, [(0, BASE_TS + 99_000, None, b"late", ())])
    assert consumer(1) == ["late"]

    run_tool("kafka-consumer-groups", "--bootstrap-server", bootstrap, "--delete", "--group", group)
    listed = run_tool("kafka-consumer-groups", "--bootstrap-server", bootstrap, "--list").stdout
    assert group not in listed.split()


def test_transactions_list_and_describe(bootstrap):
    reason = missing_groups_or_transactions(port_of(bootstrap), transactions=True)
    if reason:
        pytest.skip(reason)
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, unique_topic("tools-txn"), 2)
    txn_id = unique_topic("tools-txn-id")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"in a transaction", partition=1)
    producer.flush(30)

    def transactions(*args: str) -> list[dict[str, str]]:
        out = run_tool("kafka-transactions", "--bootstrap-server", bootstrap, *args).stdout
        header, *rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        names = [h.strip() for h in header]
        return [dict(zip(names, (c.strip() for c in row), strict=False)) for row in rows]

    try:
        listed = {row["TransactionalId"]: row for row in transactions("list")}
        assert listed[txn_id]["TransactionState"] == "Ongoing"
        (described,) = transactions("describe", "--transactional-id", txn_id)
        assert described["TransactionState"] == "Ongoing"
        assert described["TopicPartitions"] == f"{topic}-1"
        assert described["ProducerId"] == listed[txn_id]["ProducerId"]
        producers = transactions("describe-producers", "--topic", topic, "--partition", "1")
        assert [p["ProducerId"] for p in producers] == [described["ProducerId"]]
        assert producers[0]["CurrentTransactionStartOffset"] == "0"
    finally:
        producer.commit_transaction(30)

    (described,) = transactions("describe", "--transactional-id", txn_id)
    assert described["TransactionState"] == "CompleteCommit"
    assert described.get("TopicPartitions", "") == ""


def test_the_java_producer_on_a_lightning_topic(bootstrap):
    # Answered before offsets exist (broker/journal.py): the Java producer, idempotent by
    # default, is told offset -1 for each record and nothing is lost, repeated or
    # reordered.
    topic = create_topic(bootstrap, unique_topic("tools-lightning"), 1, **LIGHTNING)
    out = run_tool(
        "kafka-verifiable-producer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--max-messages",
        "2000",
        "--acks",
        "-1",
    ).stdout
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    acked = [e for e in events if e["name"] == "producer_send_success"]
    assert len(acked) == 2000 and {e["offset"] for e in acked} == {-1}
    assert not [e for e in events if e["name"] == "producer_send_error"]
    read = consume_all(bootstrap, topic)
    assert [r.value for r in read] == [str(i).encode() for i in range(2000)]
    assert_dense(read)
