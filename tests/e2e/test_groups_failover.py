"""What survives: committed offsets across a restart, a group across the death of its
coordinating agent (kill -9), and a static member's place across its own restart."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer

from tests.e2e.rawclient import ensure_topic
from tests.support.group_consumers import (
    RUNNERS,
    BackgroundProducer,
    ConfluentRunner,
    KafkaPythonRunner,
    Tracker,
    wait_for,
)
from tests.support.groups import commit, fetch_offsets, find_coordinator, wait_for_agents

pytestmark = [pytest.mark.store_independent, pytest.mark.serial]

FAST = ["--group-initial-rebalance-delay-ms", "300", "--group-min-session-timeout-ms", "1000"]
MAX_POLL_RECORDS = 20  # what every runner asks for per poll


def produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, value=b"v%05d" % i, partition=i % partitions)
    assert producer.flush(30) == 0


def test_committed_offsets_survive_a_restart(start_broker):
    broker = start_broker(extra_args=[*FAST, "--default-partitions", "4"])
    port = broker.port
    ensure_topic(port, "kept")
    produce(broker.bootstrap, "kept", 200, 4)
    consumer = KafkaConsumer(
        "kept",
        bootstrap_servers=broker.bootstrap,
        group_id="survivor",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 200 and time.monotonic() < deadline:
        seen += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        consumer.commit()
    consumer.close()
    assert seen == 200
    assert commit(port, "by-hand", -1, "", {("kept", 1): 17}, metadata="note", leader_epoch=0) == {
        ("kept", 1): 0
    }
    broker.kill9()
    broker = start_broker(extra_args=[*FAST, "--default-partitions", "4"], port=port)
    for version in (1, 5, 7, 8, 9):
        error, offsets = fetch_offsets(port, "survivor", {"kept": [0, 1, 2, 3]}, version=version)
        assert error == 0
        assert {k: v[0] for k, v in offsets.items()} == {("kept", p): 50 for p in range(4)}
    _error, offsets = fetch_offsets(port, "by-hand", None)
    assert offsets == {("kept", 1): (17, 0, "note", 0)}
    # The group resumes from its committed offsets: only what is new is read.
    produce(broker.bootstrap, "kept", 20, 4, start=200)
    consumer = KafkaConsumer(
        "kept",
        bootstrap_servers=broker.bootstrap,
        group_id="survivor",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < 20 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            values += [r.value for r in records]
    time.sleep(0.5)
    for records in consumer.poll(timeout_ms=200).values():
        values += [r.value for r in records]
    consumer.close()
    assert sorted(values) == [b"v%05d" % i for i in range(200, 220)]


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_coordinator_failover_when_its_agent_is_killed(start_broker, client):
    partitions = 12
    args = [*FAST, "--lease-ms", "1500", "--default-partitions", str(partitions)]
    first = start_broker(extra_args=args)
    second = start_broker(extra_args=args)  # same data dir: one cluster of two agents
    agents = {first.port: first, second.port: second}
    bootstrap = f"{first.bootstrap},{second.bootstrap}"
    topic, group = f"failover-{client}", f"failover-{client}"
    ensure_topic(first.port, topic)
    wait_for_agents([first.port, second.port])
    tracker = Tracker()
    producer = BackgroundProducer(bootstrap, topic, partitions, rate=200)
    producer.start()
    runners = [
        RUNNERS[client](f"c{i}", bootstrap, group, topic, tracker, poll_delay=0.02)
        for i in range(3)
    ]
    try:
        for r in runners:
            r.start()
        wait_for(
            lambda: (
                sum(len(p) for p in tracker.owned_by().values()) == partitions
                and len(tracker.owned_by()) == 3
            ),
            "the group to form",
        )
        wait_for(lambda: len(tracker.values()) > 300, "consumption to get going")
        coordinator_port = int(find_coordinator(first.port, group).port)
        survivor = next(p for p in agents if p != coordinator_port)
        processed_at_kill = len(tracker.values())
        agents[coordinator_port].kill9()
        wait_for(
            lambda: int(find_coordinator(survivor, group).port) == survivor,
            "the surviving agent to coordinate the group",
        )
        # The group goes on: offsets are committed through the new coordinator.
        wait_for(
            lambda: len(tracker.values()) > processed_at_kill + 300, "consumption after the kill"
        )
        produced = producer.finish()
        wait_for(lambda: set(tracker.values()) >= set(produced), "every record", timeout=60)
        _error, committed = fetch_offsets(survivor, group, None)
        assert sum(o for o, _e, _m, _x in committed.values()) > 0
    finally:
        producer.stopping.set()
        for r in runners:
            r.stop()
    processed = Counter(tracker.values())
    assert set(processed) >= set(produced)  # nothing lost
    duplicates = sum(n - 1 for n in processed.values())
    # Only what was processed but not yet committed when the coordinator died (at most
    # one poll per consumer) may be processed again.
    assert duplicates <= MAX_POLL_RECORDS * len(runners), duplicates
    assert tracker.violations == []


@pytest.mark.parametrize("runner", [KafkaPythonRunner, ConfluentRunner])
def test_static_member_restart_gets_its_partitions_back_without_a_rebalance(start_broker, runner):
    broker = start_broker(extra_args=[*FAST, "--default-partitions", "6"])
    topic, group = f"static-{runner.__name__}", f"static-{runner.__name__}"
    ensure_topic(broker.port, topic)
    tracker = Tracker()
    members = {
        name: runner(name, broker.bootstrap, group, topic, tracker, instance_id=f"instance-{name}",
                     session_ms=10_000, leave_on_close=False)
        for name in ("s1", "s2", "s3")
    }  # fmt: skip
    try:
        for m in members.values():
            m.start()
        wait_for(
            lambda: (
                len(tracker.owned_by()) == 3
                and sum(len(p) for p in tracker.owned_by().values()) == 6
            ),
            "the static group to form",
        )
        time.sleep(1.0)  # let any follow-up rebalance settle
        before = dict(tracker.assignments)
        owned_before = tracker.owned_by()
        members.pop("s2").stop()  # a static member does not leave on close
        restarted = runner("s2", broker.bootstrap, group, topic, tracker,
                           instance_id="instance-s2", session_ms=10_000, leave_on_close=False)  # fmt: skip
        members["s2"] = restarted
        restarted.start()
        wait_for(lambda: tracker.owned_by().get("s2") == owned_before["s2"], "s2's partitions back")
        time.sleep(1.0)
        # The others were not rebalanced: no new assignment reached them.
        assert {n: tracker.assignments[n] for n in ("s1", "s3")} == {
            n: before[n] for n in ("s1", "s3")
        }
        assert tracker.owned_by() == owned_before
    finally:
        for m in members.values():
            m.stop()
    assert tracker.violations == []
