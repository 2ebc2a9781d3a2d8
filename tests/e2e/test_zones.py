"""Zone-aware routing end to end: three agents on the same stores, in zones a, b and c.

A client whose client.id says `bucketlog_az=b` is given only zone b's agent, as broker,
as every partition's leader and as the coordinator of its group and transactional id;
its produces, transactions, group and fetches all go there (the requests-by-zone counter
of every agent says so). Once zone b's agent is killed with SIGKILL, the same client is
sent to the agents of a and c and goes on, nothing lost. A client naming a zone without
an agent, or none, gets every agent. A lightning topic keeps one leader for every client.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.wire import WireClient, request
from tests.support.brokerproc import free_ports
from tests.support.groups import wait_for_agents, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

ZONES = ("a", "b", "c")
PARTITIONS = 6
ZONED = "zonetest,bucketlog_az=b"
# The others see the killed agent gone as soon as its port refuses their probes (every
# 0.25 s), its lease left to run out later; a lease of 4 s keeps a live agent listed
# through the slow renewals of a loaded 2-core machine.
AGENT_ARGS = ["--lease-ms", "4000", "--lease-renew-ms", "500"]
AGENT_ARGS += ["--group-initial-rebalance-delay-ms", "0"]
# Requests a client sends to partition leaders and to its coordinators, never merely to
# find them: all of zone b's client must reach zone b's agent while it lives.
ROUTED_APIS = {
    "Produce", "Fetch", "ListOffsets", "JoinGroup", "SyncGroup", "Heartbeat",
    "OffsetCommit", "OffsetFetch", "LeaveGroup", "AddPartitionsToTxn", "AddOffsetsToTxn",
    "EndTxn", "TxnOffsetCommit",
}  # fmt: skip


def metadata(port: int, client_id: str, topics: list[str]) -> Any:
    with WireClient(("127.0.0.1", port), client_id=client_id) as client:
        return client.call(
            request(
                3,
                9,
                topics=[{"name": t} for t in topics],
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )


def routing(port: int, client_id: str, topic: str) -> tuple[set[int], list[int]]:
    """(the node ids of the brokers listed, each partition's leader) as told to client_id."""
    answer = metadata(port, client_id, [topic])
    (entry,) = answer.topics
    assert entry.error_code == 0
    partitions = sorted(entry.partitions, key=lambda p: p.partition_index)
    return {b.node_id for b in answer.brokers}, [p.leader_id for p in partitions]


def coordinator(port: int, client_id: str, key: str, key_type: int) -> int:
    with WireClient(("127.0.0.1", port), client_id=client_id) as client:
        answer = client.call(request(10, 4, key_type=key_type, coordinator_keys=[key]))
    (found,) = answer.coordinators
    assert found.error_code == 0, found
    return int(found.node_id)


def by_zone(metrics_port: int) -> Counter[tuple[str, str, str]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    counted: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "bucketlog_requests_by_zone_total":
                counted[s.labels["agent_zone"], s.labels["client_zone"], s.labels["api"]] += int(
                    s.value
                )
    return counted


def key_not_coordinated_by(port: int, node: int, key_type: int, prefix: str) -> str:
    """A key whose coordinator without a home (asked by a client naming no zone, which
    gives it none) is not `node`: so that only its home zone can send it there."""
    for _ in range(100):
        key = f"{prefix}-{uuid.uuid4().hex[:6]}"
        if coordinator(port, "unzoned", key, key_type) != node:
            return key
    raise AssertionError("every key hashes to one agent")


def produce(producer: Producer, topic: str, values: list[bytes], partitions: int) -> list[Any]:
    acked: list[Any] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.value())
        else:
            errors.append(str(err))

    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert sorted(acked) == sorted(values)
    return acked


def consume_until(consumer: Consumer, wanted: set[bytes], got: set[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not wanted <= got and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.add(msg.value())
    assert wanted <= got, f"{len(wanted - got)} of {len(wanted)} records not consumed"
    consumer.commit(asynchronous=False)


def test_a_zoned_client_stays_in_its_zone_and_falls_back_when_it_is_gone(start_broker) -> None:
    ports = free_ports(6)
    kafka_ports = dict(zip(ZONES, ports[:3], strict=True))
    metrics_ports = dict(zip(ZONES, ports[3:], strict=True))
    agents = {
        zone: start_broker(
            port=kafka_ports[zone],
            extra_args=[*AGENT_ARGS, "--zone", zone, "--metrics-port", str(metrics_ports[zone])],
        )
        for zone in ZONES
    }
    a, b, c = (kafka_ports[z] for z in ZONES)
    wait_for_agents([a, b, c])
    bootstrap = ",".join(f"127.0.0.1:{p}" for p in (a, b, c))
    topic, lightning = f"zoned-{uuid.uuid4().hex[:6]}", f"zoned-lt-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [
            NewTopic(topic, PARTITIONS),
            NewTopic(lightning, PARTITIONS, config={"bucketlog.topic.type": "lightning"}),
        ]
    )
    for future in created.values():
        future.result(30)

    answer = metadata(a, "unzoned", [])
    node = {b.rack: b.node_id for b in answer.brokers}
    assert set(node) == set(ZONES)

    # -- routing, asked of agent a by a client of zone b -----------------------------------
    everyone = set(node.values())
    brokers, leaders = routing(a, ZONED, topic)
    assert brokers == {node["b"]}
    assert leaders == [node["b"]] * PARTITIONS
    unzoned_brokers, unzoned_leaders = routing(a, "unzoned", topic)
    assert unzoned_brokers == everyone
    assert set(unzoned_leaders) == everyone  # 6 partitions over 3 agents
    # Bad input: a zone without an agent, or an empty one, is as no zone at all.
    for client_id in ("app,bucketlog_az=nowhere", "bucketlog_az="):
        assert routing(c, client_id, topic) == (everyone, unzoned_leaders)
    # A lightning partition has one leader for everyone: listed as a broker too.
    global_leaders = routing(a, "unzoned", lightning)[1]
    brokers, leaders = routing(a, ZONED, lightning)
    assert leaders == global_leaders
    assert brokers == {node["b"], *global_leaders}

    # -- coordinators: the first zoned client to ask gives the key its home -------------------
    group = key_not_coordinated_by(a, node["b"], 0, "zoned-group")
    tid = key_not_coordinated_by(a, node["b"], 1, "zoned-txn")
    assert coordinator(c, ZONED, group, 0) == node["b"]
    assert coordinator(c, ZONED, tid, 1) == node["b"]
    for port, client_id in ((a, "unzoned"), (b, "app,bucketlog_az=a"), (c, "bucketlog_az=c")):
        assert coordinator(port, client_id, group, 0) == node["b"]
        assert coordinator(port, client_id, tid, 1) == node["b"]

    # -- the data path of zone b's client ---------------------------------------------------
    common = {"bootstrap.servers": bootstrap, "client.id": ZONED}
    producer = Producer({**common, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    txn_producer = Producer({**common, "transactional.id": tid, "linger.ms": 5})
    consumer = Consumer(
        {
            **common,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
        }
    )
    try:
        first = [f"v{i}".encode() for i in range(300)]
        produce(producer, topic, first, PARTITIONS)
        txn_producer.init_transactions(30)
        txn_producer.begin_transaction()
        first_txn = [f"t{i}".encode() for i in range(20)]
        produce(txn_producer, topic, first_txn, PARTITIONS)
        txn_producer.commit_transaction(30)
        consumer.subscribe([topic])
        got: set[bytes] = set()
        consume_until(consumer, set(first + first_txn), got, 30)

        counted = {z: by_zone(metrics_ports[z]) for z in ZONES}
        for api in ("Produce", "Fetch", "JoinGroup", "OffsetCommit", "EndTxn"):
            assert counted["b"]["b", "b", api] > 0, (api, counted["b"])
        for zone in ("a", "c"):
            strays = {k: v for k, v in counted[zone].items() if k[1] == "b" and k[2] in ROUTED_APIS}
            assert not strays, strays
        # The lightning topic's produces go to its leaders, in zone or not, and are taken.
        produce(producer, lightning, [f"l{i}".encode() for i in range(30)], PARTITIONS)

        # -- zone b's agent dies -------------------------------------------------------------
        agents["b"].kill9()
        survivors = {node["a"], node["c"]}

        def routed_to_survivors() -> bool:
            return all(routing(port, ZONED, topic)[0] == survivors for port in (a, c))

        wait_until(routed_to_survivors, timeout=15)
        dropped_at = time.monotonic()
        brokers, leaders = routing(c, ZONED, topic)
        assert brokers == survivors
        assert set(leaders) == survivors and Counter(leaders)[node["a"]] == PARTITIONS // 2
        assert routing(a, ZONED, topic) == (brokers, leaders)
        for key, key_type in ((group, 0), (tid, 1)):
            moved = coordinator(a, ZONED, key, key_type)
            assert moved in survivors
            assert coordinator(c, "unzoned", key, key_type) == moved

        second = [f"w{i}".encode() for i in range(300)]
        produce(producer, topic, second, PARTITIONS)
        txn_producer.begin_transaction()
        second_txn = [f"u{i}".encode() for i in range(20)]
        produce(txn_producer, topic, second_txn, PARTITIONS)
        txn_producer.commit_transaction(30)
        consume_until(consumer, set(second + second_txn), got, 45)
        print(
            f"after zone b's agent dropped out: all consumed in {time.monotonic() - dropped_at:.1f} s"
        )
    finally:
        consumer.close()
        txn_producer.flush(5)
        producer.flush(5)

    # Everything acknowledged is in the log, once (idempotent and transactional producers).
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "zones-reader", "enable.auto.commit": False,
         "isolation.level": "read_committed"}
    )  # fmt: skip
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        expected = first + first_txn + second + second_txn
        seen: Counter[bytes] = Counter()
        deadline = time.monotonic() + 30
        while sum(seen.values()) < len(expected) and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and msg.error() is None:
                seen[msg.value()] += 1
        assert seen == Counter(expected)
    finally:
        reader.close()
