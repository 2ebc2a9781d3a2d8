"""The Java producer in transactions: Apache Kafka's producer performance tool commits a
transaction every 200 ms; a read_committed reader sees every record exactly once."""

from __future__ import annotations

from tests.integration.support import (
    consume_all,
    create_topic,
    end_offsets,
    run_tool,
    unique_topic,
)


def test_java_transactional_producer_commits(shared_broker):
    bootstrap = shared_broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("java-tx"), partitions=3)
    records = 6000
    result = run_tool(
        "kafka-producer-perf-test",
        "--topic", topic,
        "--num-records", str(records),
        "--record-size", "100",
        "--throughput", "-1",
        "--transactional-id", f"{topic}-producer",
        "--transaction-duration-ms", "200",
        "--command-property", f"bootstrap.servers={bootstrap}",
        timeout=120,
    )  # fmt: skip
    assert f"{records} records sent" in result.stdout, result.stdout
    committed = consume_all(bootstrap, topic, isolation_level="read_committed")
    assert len(committed) == records
    assert all(len(r.value) == 100 for r in committed)
    # Each partition holds its data plus one COMMIT marker per transaction that touched it:
    # the end offsets run past the data, and the data offsets skip the markers.
    ends = end_offsets(bootstrap, topic)
    assert sum(ends.values()) > records
    uncommitted = consume_all(bootstrap, topic)
    assert sorted(r.offset for r in uncommitted) == sorted(r.offset for r in committed)
    assert len({(r.partition, r.offset) for r in committed}) == records  # no record twice
