"""Consumer groups of the consumer protocol (KIP-848) with real clients: confluent-kafka
(librdkafka) with `group.protocol=consumer`, and raw requests for what must be refused.

* 3 members on 12 partitions, a 4th joining and one leaving while records arrive, commits
  after processing: every record processed exactly once; the members whose partitions did
  not move go on consuming while the 4th joins, where the classic protocol (eager) stops
  every member (both pauses are printed);
* kill -9 of the coordinating agent: the members keep their partitions, nothing twice;
* a static member restarted within the session timeout gets its partitions back;
* a regex subscription picks up a topic created later;
* wrong epochs, unknown members, assignors and regexes, and a classic group's id get
  Kafka's errors, and the agent keeps serving.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pytest
from kio.schema.errors import ErrorCode

from tests.e2e import wire
from tests.e2e.rawclient import ensure_topic
from tests.e2e.test_metrics import samples
from tests.support.brokerproc import free_ports
from tests.support.group_consumers import (
    BackgroundProducer,
    ConfluentConsumerProtocolRunner,
    ConfluentRunner,
    Tracker,
    wait_for,
)
from tests.support.groups import find_coordinator, join, join_member, wait_for_agents

pytestmark = pytest.mark.store_independent

PARTITIONS = 12
FAST = [
    "--default-partitions",
    str(PARTITIONS),
    "--group-initial-rebalance-delay-ms",
    "300",
    "--group-min-session-timeout-ms",
    "1000",
    "--group-consumer-heartbeat-interval-ms",
    "300",
    "--group-consumer-session-timeout-ms",
    "6000",
    "--flush-interval-ms",
    "10",
]
E = ErrorCode


def covered_by(tracker: Tracker, names: set[str], partitions: int = PARTITIONS) -> bool:
    owned = tracker.owned_by()
    return set(owned) == names and sum(len(p) for p in owned.values()) == partitions


def heartbeat(port: int, version: int = 1, **fields) -> object:
    data = {
        "group_id": "g",
        "member_id": "m",
        "member_epoch": 0,
        "rebalance_timeout": 5000,
        "subscribed_topic_names": ["t"],
        "topic_partitions": [],
        **fields,
    }
    with wire.WireClient(("127.0.0.1", port)) as client:
        return client.call(wire.request(68, version, **data))


@dataclass
class JoinOutcome:
    pause: float  # the longest time one of c1-c3 processed nothing while c4 joined
    usual_pause: float  # the same over the second before c4 started
    owned_before: dict[str, set[int]]  # c1-c3's partitions before c4 joined
    revoked: dict[str, set[int]]  # what c1-c3 gave up while c4 joined
    joined_with: set[int]  # what c4 got
    tracker: Tracker
    produced: list


def join_and_leave(broker, runner_class, group: str, topic: str) -> JoinOutcome:
    """Three members consume; a fourth joins; then one leaves; every record is awaited."""
    tracker = Tracker()
    producer = BackgroundProducer(broker.bootstrap, topic, PARTITIONS, rate=300)
    producer.start()
    first = ("c1", "c2", "c3")
    consumers = {
        name: runner_class(name, broker.bootstrap, group, topic, tracker, poll_delay=0.005)
        for name in first
    }
    try:
        wait_for(lambda: len(producer.acked) > 20, "the first records")
        for c in consumers.values():
            c.start()
        wait_for(lambda: covered_by(tracker, set(first)), "three members own all")
        time.sleep(1.0)
        owned_before = tracker.owned_by()
        began = time.monotonic()
        consumers["c4"] = runner_class(
            "c4", broker.bootstrap, group, topic, tracker, poll_delay=0.005
        )
        consumers["c4"].start()
        wait_for(lambda: covered_by(tracker, {*first, "c4"}), "c4 to get partitions")
        time.sleep(1.0)
        ended = time.monotonic()
        outcome = JoinOutcome(
            max(tracker.longest_pause(n, began, ended) for n in first),
            max(tracker.longest_pause(n, began - 1.0, began) for n in first),
            owned_before,
            {n: tracker.revoked_between(n, began, ended) for n in first},
            tracker.owned_by()["c4"],
            tracker,
            [],
        )
        consumers.pop("c1").stop()
        wait_for(lambda: covered_by(tracker, {"c2", "c3", "c4"}), "c1's partitions to move")
        time.sleep(0.5)
        outcome.produced = producer.finish()
        wait_for(lambda: len(tracker.values()) >= len(outcome.produced), "every record", 60)
        time.sleep(0.5)  # anything processed twice would show up now
    finally:
        producer.stopping.set()
        for c in consumers.values():
            c.stop()
    return outcome


class EagerClassicRunner(ConfluentRunner):
    def config(self) -> dict:
        return {**super().config(), "partition.assignment.strategy": "range"}


def test_members_join_and_leave_without_stopping_the_others(start_broker):
    broker = start_broker(extra_args=FAST)
    new = join_and_leave(broker, ConfluentConsumerProtocolRunner, "kip848", "orders-kip848")
    assert new.tracker.violations == []
    assert [f for f in new.tracker.commit_failures if "lost" in f] == []
    processed = Counter(new.tracker.values())
    assert set(processed) == set(new.produced)
    assert [v for v, n in processed.items() if n > 1] == []
    # Only what moves to c4 is given up: each first member keeps the rest all along.
    moved = new.joined_with
    for name, revoked in new.revoked.items():
        assert revoked <= moved, (name, revoked, moved)
        assert len(new.owned_before[name] - revoked) >= 2
    # The classic protocol with eager rebalancing: every member gives up everything.
    old = join_and_leave(broker, EagerClassicRunner, "classic", "orders-classic")
    assert old.tracker.violations == []
    assert all(old.revoked[n] == old.owned_before[n] for n in old.revoked), old.revoked
    print(
        f"longest pause of c1-c3 while c4 joins: consumer protocol {new.pause:.3f} s "
        f"(usual {new.usual_pause:.3f} s), classic eager {old.pause:.3f} s "
        f"(usual {old.usual_pause:.3f} s)"
    )


def test_members_keep_their_partitions_when_the_coordinating_agent_is_killed(start_broker):
    args = [*FAST, "--lease-ms", "1500"]
    first = start_broker(extra_args=args)
    second = start_broker(extra_args=args)  # same data dir: one cluster of two agents
    agents = {first.port: first, second.port: second}
    bootstrap = f"{first.bootstrap},{second.bootstrap}"
    topic, group = "failover-kip848", "failover-kip848"
    ensure_topic(first.port, topic)
    wait_for_agents([first.port, second.port])
    tracker = Tracker()
    producer = BackgroundProducer(bootstrap, topic, PARTITIONS, rate=200)
    producer.start()
    runners = [
        ConfluentConsumerProtocolRunner(f"c{i}", bootstrap, group, topic, tracker, poll_delay=0.02)
        for i in range(3)
    ]
    try:
        for r in runners:
            r.start()
        wait_for(lambda: covered_by(tracker, {"c0", "c1", "c2"}), "the group to form")
        wait_for(lambda: len(tracker.values()) > 300, "consumption to get going")
        owned_before = tracker.owned_by()
        coordinator_port = int(find_coordinator(first.port, group).port)
        survivor = next(p for p in agents if p != coordinator_port)
        processed_at_kill = len(tracker.values())
        killed_at = time.monotonic()
        agents[coordinator_port].kill9()
        wait_for(
            lambda: int(find_coordinator(survivor, group).port) == survivor,
            "the surviving agent to coordinate the group",
        )
        wait_for(
            lambda: len(tracker.values()) > processed_at_kill + 300, "consumption after the kill"
        )
        # A heartbeat reached the new coordinator: it loaded the group from the store.
        wait_for(lambda: described_state(survivor, group) == "Stable", "the group loaded", 20)
        assert tracker.owned_by() == owned_before
        # Nothing was revoked or lost: the members never noticed.
        now = time.monotonic()
        assert all(not tracker.revoked_between(n, killed_at, now) for n in ("c0", "c1", "c2"))
        assert [f for f in tracker.commit_failures if "lost" in f] == []
        produced = producer.finish()
        wait_for(lambda: set(tracker.values()) >= set(produced), "every record", timeout=60)
        time.sleep(0.5)
    finally:
        producer.stopping.set()
        for r in runners:
            r.stop()
    assert tracker.violations == []
    processed = Counter(tracker.values())
    assert [v for v, n in processed.items() if n > 1] == []


def described_state(port: int, group: str) -> str:
    with wire.WireClient(("127.0.0.1", port)) as client:
        answer = client.call(
            wire.request(69, 1, group_ids=[group], include_authorized_operations=False)
        )
    return answer.groups[0].group_state


def test_a_static_member_restarted_in_time_keeps_its_partitions(start_broker):
    broker = start_broker(extra_args=FAST)
    topic, group = "static-kip848", "static-kip848"
    ensure_topic(broker.port, topic)
    tracker = Tracker()

    def member(name: str, instance: str) -> ConfluentConsumerProtocolRunner:
        return ConfluentConsumerProtocolRunner(
            name, broker.bootstrap, group, topic, tracker, instance_id=instance, poll_delay=0.01
        )

    first, other = member("s1", "instance-1"), member("s2", "instance-2")
    first.start()
    other.start()
    try:
        wait_for(lambda: covered_by(tracker, {"s1", "s2"}), "two static members own all")
        before = tracker.owned_by()
        other_assignments = tracker.assignments["s2"]
        first.stop()
        again = member("s1-again", "instance-1")
        again.start()
        wait_for(lambda: "s1-again" in tracker.owned_by(), "the instance to come back")
        after = tracker.owned_by()
        assert after["s1-again"] == before["s1"]
        assert after["s2"] == before["s2"]
        assert tracker.assignments["s2"] == other_assignments  # s2 was never re-assigned
        again.stop()
    finally:
        other.stop()
        if first.is_alive():
            first.stop()


class RegexRunner(ConfluentConsumerProtocolRunner):
    def subscription(self) -> list[str]:
        return ["^regex-in-.*"]


def test_a_regex_subscription_picks_up_a_topic_created_later(start_broker):
    broker = start_broker(extra_args=[*FAST, "--default-partitions", "2"])
    ensure_topic(broker.port, "regex-in-a")
    ensure_topic(broker.port, "regex-other")
    from confluent_kafka import Producer

    tracker = Tracker()
    runner = RegexRunner("r", broker.bootstrap, "regex-group", "regex-in-a", tracker)
    runner.start()
    try:
        wait_for(lambda: sum(len(p) for p in tracker.owned_by().values()) == 2, "regex-in-a")
        ensure_topic(broker.port, "regex-in-b")
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce("regex-in-b", value=b"late")
        producer.produce("regex-other", value=b"unmatched")
        assert producer.flush(20) == 0
        wait_for(lambda: b"late" in tracker.values(), "a record of the new topic", timeout=40)
        assert b"unmatched" not in tracker.values()
    finally:
        runner.stop()


def test_bad_heartbeats_get_kafkas_errors_and_the_agent_serves_on(start_broker):
    metrics_port = free_ports(1)[0]
    broker = start_broker(extra_args=[*FAST, "--metrics-port", str(metrics_port)])
    port = broker.port
    ensure_topic(port, "t")
    joined = heartbeat(port)
    assert joined.error_code == E.none and joined.member_epoch > 0
    epoch = joined.member_epoch
    fenced = heartbeat(port, member_epoch=epoch + 5, topic_partitions=None)
    assert fenced.error_code == E.fenced_member_epoch
    unknown = heartbeat(port, member_id="nobody", member_epoch=1, topic_partitions=None)
    assert unknown.error_code == E.unknown_member_id
    assignor = heartbeat(port, member_id="other", server_assignor="sticky-please")
    assert assignor.error_code == E.unsupported_assignor
    regex = heartbeat(
        port, member_id="other", subscribed_topic_names=None, subscribed_topic_regex="(a"
    )
    assert regex.error_code == E.invalid_regular_expression
    lookaround = heartbeat(
        port, member_id="other", subscribed_topic_names=None, subscribed_topic_regex="(?=t)t"
    )
    assert lookaround.error_code == E.invalid_regular_expression
    member = join_member(port, "classic-group")  # a classic group with a member
    assert member.error_code == E.none
    classic = heartbeat(port, group_id="classic-group", member_id="other")
    assert classic.error_code == E.group_id_not_found
    assert classic.error_message == "Group classic-group is not a consumer group."
    assert join(port, "g").error_code == E.inconsistent_group_protocol
    described = described_state(port, "g")
    assert described == "Stable"
    again = heartbeat(port, member_epoch=epoch, topic_partitions=None)
    assert again.error_code == E.none and again.member_epoch == epoch
    # One group of each kind, one member each.
    got = samples(metrics_port)
    assert got["bucketlog_groups_coordinated", ()] == 2
    assert got["bucketlog_group_members", ()] == 2
