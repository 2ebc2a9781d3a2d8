"""Admin APIs against a real `bucketlog serve`, driven by real clients.

confluent-kafka (librdkafka) speaks the older versions (CreateTopics v4, DeleteTopics v4,
CreatePartitions v2, DescribeConfigs v1, AlterConfigs v2) and does DescribeCluster and
DescribeTopics through Metadata; kafka-python speaks the newest (CreateTopics v7,
DeleteTopics v6 by topic id, DescribeConfigs v4, DescribeCluster v2,
DescribeTopicPartitions). Error codes are compared as Kafka's numbers.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.protocol.admin.cluster import DescribeClusterRequest
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
)
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest
from kio.schema.errors import ErrorCode

OK = 0
TOPIC = ResourceType.TOPIC
BROKER = ResourceType.BROKER


# -- helpers ------------------------------------------------------------------------------


def admin(broker: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def kp_admin(broker: Any) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)


def outcomes(futures: dict[Any, Any]) -> dict[str, int]:
    """Error code per topic (or config resource name) of a confluent admin call; 0 = OK."""
    result = {}
    for key, future in futures.items():
        name = key.name if isinstance(key, ConfigResource) else key
        try:
            future.result(timeout=20)
            result[name] = OK
        except KafkaException as exc:
            result[name] = exc.args[0].code()
    return result


def error_message(futures: dict[Any, Any], key: Any) -> str:
    with pytest.raises(KafkaException) as info:
        futures[key].result(timeout=20)
    return info.value.args[0].str()


def partition_counts(client: AdminClient) -> dict[str, int]:
    return {name: len(t.partitions) for name, t in client.list_topics(timeout=10).topics.items()}


def topic_configs(client: AdminClient, topic: str) -> dict[str, Any]:
    (future,) = client.describe_configs([ConfigResource(TOPIC, topic)]).values()
    return future.result(timeout=20)


def explicit_configs(client: AdminClient, topic: str) -> dict[str, str]:
    return {
        name: entry.value
        for name, entry in topic_configs(client, topic).items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def incremental(topic: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> ConfigResource:
    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops]
    return ConfigResource(TOPIC, topic, incremental_configs=entries)


def raw(client: KafkaAdminClient, request: Any, node_id: int | None = None) -> Any:
    """One request at an exact version through kafka-python's own connection manager."""

    async def send() -> Any:
        return await client._manager.send(request, node_id=node_id)

    return client._manager.run(send)


# -- CreateTopics -------------------------------------------------------------------------


def test_create_topics_answers_each_topic_with_kafkas_error(broker):
    client = admin(broker)
    node_id = next(iter(client.describe_cluster().result(timeout=20).nodes)).id
    futures = client.create_topics(
        [
            NewTopic("orders", 3, 1, config={"cleanup.policy": "compact", "retention.ms": "1000"}),
            NewTopic("defaults"),  # num_partitions and replication_factor -1
            NewTopic("bad/name", 1, 1),
            NewTopic("replicated", 1, 3),
            NewTopic("unknown-config", 1, 1, config={"no.such.config": "1"}),
            NewTopic("not-an-int", 1, 1, config={"max.message.bytes": "big"}),
            NewTopic("bad-policy", 1, 1, config={"cleanup.policy": "shred"}),
            NewTopic("too-low", 1, 1, config={"min.insync.replicas": "0"}),
            NewTopic("assigned", 2, replica_assignment=[[node_id], [node_id]]),
            NewTopic("assigned-elsewhere", 1, replica_assignment=[[node_id + 7]]),
        ]
    )
    assert outcomes(futures) == {
        "orders": OK,
        "defaults": OK,
        "bad/name": KafkaError.TOPIC_EXCEPTION,
        "replicated": KafkaError.INVALID_REPLICATION_FACTOR,
        "unknown-config": KafkaError.INVALID_CONFIG,
        "not-an-int": KafkaError.INVALID_CONFIG,
        "bad-policy": KafkaError.INVALID_CONFIG,
        "too-low": KafkaError.INVALID_CONFIG,
        "assigned": OK,
        "assigned-elsewhere": KafkaError.INVALID_REPLICA_ASSIGNMENT,
    }
    counts = partition_counts(client)
    assert counts == {"orders": 3, "defaults": 1, "assigned": 2}
    assert explicit_configs(client, "orders") == {
        "cleanup.policy": "compact",
        "retention.ms": "1000",
    }

    futures = client.create_topics(
        [NewTopic("not-an-int", 1, 1, config={"max.message.bytes": "big"})]
    )
    assert (
        error_message(futures, "not-an-int")
        == "Invalid value big for configuration max.message.bytes: Not a number of type INT"
    )
    futures = client.create_topics([NewTopic("orders", 1, 1)])
    assert outcomes(futures) == {"orders": KafkaError.TOPIC_ALREADY_EXISTS}
    assert error_message(client.create_topics([NewTopic("orders", 1, 1)]), "orders") == (
        "Topic 'orders' already exists."
    )
    # '.' and '_' collide in metric names: Kafka refuses the second spelling.
    assert outcomes(client.create_topics([NewTopic("my.topic", 1, 1)])) == {"my.topic": OK}
    assert outcomes(client.create_topics([NewTopic("my_topic", 1, 1)])) == {
        "my_topic": KafkaError.TOPIC_EXCEPTION
    }


def test_create_topics_validate_only_creates_nothing(broker):
    client = admin(broker)
    futures = client.create_topics(
        [NewTopic("checked", 4, 1), NewTopic("checked-bad", 1, 1, config={"retention.ms": "x"})],
        validate_only=True,
    )
    assert outcomes(futures) == {"checked": OK, "checked-bad": KafkaError.INVALID_CONFIG}
    assert "checked" not in partition_counts(client)
    assert outcomes(client.create_topics([NewTopic("checked", 4, 1)])) == {"checked": OK}
    assert partition_counts(client)["checked"] == 4


def test_create_topics_v7_reports_id_partitions_and_configs(broker):
    client = kp_admin(broker)
    try:
        result = client.create_topics(
            {
                "full": {"num_partitions": 2, "configs": {"retention.ms": " 5000 "}},
                "zero": {"num_partitions": 0, "replication_factor": 1},
                "factor-zero": {"num_partitions": 1, "replication_factor": 0},
                "both": {"num_partitions": 2, "assignments": {0: [1]}},
            },
            raise_errors=False,
        )
        by_name = {t["name"]: t for t in result["topics"]}
        full = by_name["full"]
        assert full["error_code"] == OK
        assert full["num_partitions"] == 2
        assert full["replication_factor"] == 1
        assert full["configs"]["retention.ms"]["value"] == "5000"  # stored canonical
        assert full["configs"]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert full["configs"]["cleanup.policy"]["value"] == "delete"
        assert full["configs"]["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
        assert by_name["zero"]["error_code"] == KafkaError.INVALID_PARTITIONS
        assert by_name["factor-zero"]["error_code"] == KafkaError.INVALID_REPLICATION_FACTOR
        assert by_name["both"]["error_code"] == KafkaError.INVALID_REQUEST

        described = client.describe_topic_partitions(["full"])["topics"][0]
        assert str(described["topic_id"]) == str(full["topic_id"])

        # The same name twice in one request: INVALID_REQUEST, answered once.
        twice = [KpNewTopic("twice", 1, 1), KpNewTopic("twice", 2, 1)]
        result = client.create_topics(twice, raise_errors=False)
        assert [(t["name"], t["error_code"]) for t in result["topics"]] == [
            ("twice", KafkaError.INVALID_REQUEST)
        ]
    finally:
        client.close()


# -- DeleteTopics -------------------------------------------------------------------------


def test_delete_topics_by_name_and_by_id(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic(name, 2, 1) for name in ("d1", "d2", "d3")]))
    assert outcomes(client.delete_topics(["d1", "never-was"])) == {
        "d1": OK,
        "never-was": KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    assert "d1" not in partition_counts(client)

    kp = kp_admin(broker)
    try:
        topic_id = kp.describe_topic_partitions(["d2"])["topics"][0]["topic_id"]
        result = kp.delete_topics(
            [uuid.UUID(str(topic_id)), uuid.uuid4(), "d3"], raise_errors=False
        )
        codes = {(t["name"], t["error_code"]) for t in result["topics"]}
        assert ("d2", OK) in codes
        assert ("d3", OK) in codes
        assert (None, KafkaError.UNKNOWN_TOPIC_ID) in codes
    finally:
        kp.close()
    assert not {"d2", "d3"} & set(partition_counts(client))

    # A topic created again under the same name is a new topic with a new id.
    outcomes(client.create_topics([NewTopic("d1", 1, 1)]))
    assert partition_counts(client)["d1"] == 1


# -- CreatePartitions ---------------------------------------------------------------------


def test_create_partitions_only_increases(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("grow", 2, 1)]))
    assert outcomes(client.create_partitions([NewPartitions("grow", 5)], validate_only=True)) == {
        "grow": OK
    }
    assert partition_counts(client)["grow"] == 2
    assert outcomes(
        client.create_partitions([NewPartitions("grow", 5), NewPartitions("missing", 3)])
    ) == {"grow": OK, "missing": KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert partition_counts(client)["grow"] == 5
    assert outcomes(client.create_partitions([NewPartitions("grow", 5)])) == {
        "grow": KafkaError.INVALID_PARTITIONS
    }
    assert error_message(client.create_partitions([NewPartitions("grow", 3)]), "grow") == (
        "The topic grow currently has 5 partition(s); 3 would not be an increase."
    )
    assert outcomes(
        client.create_partitions([NewPartitions("grow", 7, replica_assignment=[[1]])])
    ) == {"grow": KafkaError.INVALID_REPLICA_ASSIGNMENT}

    # The new partitions take records at once: the producer's next Metadata sees them.
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    delivered: list[Any] = []
    producer.produce(
        "grow", b"to the last one", partition=4, on_delivery=lambda e, m: delivered.append((e, m))
    )
    assert producer.flush(20) == 0
    ((err, msg),) = delivered
    assert err is None and msg.partition() == 4 and msg.offset() == 0

    kp = kp_admin(broker)
    try:
        response = kp.create_partitions({"grow": KpNewPartitions(6)}, raise_errors=False)
        assert [r.error_code for r in response.results] == [OK]
    finally:
        kp.close()
    assert partition_counts(client)["grow"] == 6


# -- DescribeConfigs ----------------------------------------------------------------------


def test_describe_topic_configs_sources_and_synonyms(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("cfg", 1, 1, config={"retention.ms": "86400000"})]))
    futures = client.describe_configs(
        [ConfigResource(TOPIC, "cfg"), ConfigResource(TOPIC, "absent")], request_timeout=20
    )
    assert outcomes(futures)["absent"] == KafkaError.UNKNOWN_TOPIC_OR_PART
    configs = topic_configs(client, "cfg")
    assert {"cleanup.policy", "max.message.bytes", "retention.ms", "segment.bytes"} <= set(configs)
    retention = configs["retention.ms"]
    assert (retention.value, retention.source, retention.is_read_only) == (
        "86400000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        False,
    )
    policy = configs["cleanup.policy"]
    assert (policy.value, policy.source) == ("delete", ConfigSource.DEFAULT_CONFIG.value)
    assert configs["max.message.bytes"].value == "1048588"

    kp = kp_admin(broker)
    try:
        described = kp.describe_configs([KpConfigResource("TOPIC", "cfg")], include_synonyms=True)
        described = described["topic"]["cfg"]
        assert list(described) == ["retention.ms"]  # kafka-python's default: modified only
        assert described["retention.ms"]["config_type"] == "LONG"
        assert described["retention.ms"]["synonyms"] == [
            {"name": "retention.ms", "value": "86400000", "source": "DYNAMIC_TOPIC_CONFIG"},
            {"name": "log.retention.hours", "value": "168", "source": "DEFAULT_CONFIG"},
        ]
        some = kp.describe_configs(
            [KpConfigResource("TOPIC", "cfg", configs={"cleanup.policy": None})],
            config_filter="all",
        )["topic"]["cfg"]
        assert list(some) == ["cleanup.policy"]
        assert some["cleanup.policy"]["config_type"] == "LIST"
        # v3+ documentation, only when asked for
        for include in (False, True):
            request = DescribeConfigsRequest(
                resources=[(2, "cfg", ["segment.ms"])],
                include_synonyms=False,
                include_documentation=include,
                min_version=4,
                max_version=4,
            )
            (result,) = raw(kp, request).results
            (entry,) = result.configs
            assert entry.value == "604800000"
            assert (entry.documentation is not None) == include
    finally:
        kp.close()


def test_describe_broker_configs(broker):
    client = admin(broker)
    node_id = next(iter(client.describe_cluster().result(timeout=20).nodes)).id
    (future,) = client.describe_configs([ConfigResource(BROKER, str(node_id))]).values()
    configs = future.result(timeout=20)
    assert configs["node.id"].value == str(node_id)
    assert configs["listeners"].value == f"PLAINTEXT://{broker.bootstrap}"
    assert configs["log.retention.ms"].value == "604800000"
    assert all(entry.is_read_only for entry in configs.values())

    kp = kp_admin(broker)
    try:
        # Another broker's id, and the empty name of the cluster-wide dynamic defaults.
        request = DescribeConfigsRequest(
            resources=[(4, str(node_id + 100), None), (4, "", None)],
            include_synonyms=False,
            min_version=1,
            max_version=1,
        )
        other, defaults = raw(kp, request).results
        assert other.error_code == KafkaError.INVALID_REQUEST
        assert (defaults.error_code, list(defaults.configs)) == (OK, [])
    finally:
        kp.close()


# -- AlterConfigs and IncrementalAlterConfigs ---------------------------------------------


def test_incremental_alter_configs(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("inc", 1, 1, config={"retention.ms": "1000"})]))
    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    APPEND, SUBTRACT = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT

    change = incremental(
        "inc", ("segment.ms", "3600000", SET), ("cleanup.policy", "compact", APPEND)
    )
    assert outcomes(client.incremental_alter_configs([change])) == {"inc": OK}
    assert explicit_configs(client, "inc") == {
        "retention.ms": "1000",
        "segment.ms": "3600000",
        "cleanup.policy": "delete,compact",
    }
    change = incremental(
        "inc", ("retention.ms", None, DELETE), ("cleanup.policy", "delete", SUBTRACT)
    )
    assert outcomes(client.incremental_alter_configs([change])) == {"inc": OK}
    assert explicit_configs(client, "inc") == {"segment.ms": "3600000", "cleanup.policy": "compact"}
    assert topic_configs(client, "inc")["retention.ms"].value == "604800000"

    refused = {
        "append to a long": incremental("inc", ("retention.ms", "5", APPEND)),
        "not a long": incremental("inc", ("retention.ms", "soon", SET)),
        "below -1": incremental("inc", ("retention.ms", "-5", SET)),
        "unknown name": incremental("inc", ("retention.minutes", "5", SET)),
        "bad policy": incremental("inc", ("cleanup.policy", "archive", APPEND)),
        "bad boolean": incremental("inc", ("unclean.leader.election.enable", "yes", SET)),
    }
    for why, resource in refused.items():
        assert outcomes(client.incremental_alter_configs([resource])) == {
            "inc": KafkaError.INVALID_CONFIG
        }, why
    futures = client.incremental_alter_configs([incremental("inc", ("retention.ms", "5", APPEND))])
    assert error_message(futures, next(iter(futures))) == (
        "Can't APPEND to key retention.ms because its type is not LIST."
    )
    assert explicit_configs(client, "inc") == {"segment.ms": "3600000", "cleanup.policy": "compact"}

    futures = client.incremental_alter_configs(
        [incremental("inc", ("retention.ms", "42", SET))], validate_only=True
    )
    assert outcomes(futures) == {"inc": OK}
    assert "retention.ms" not in explicit_configs(client, "inc")

    futures = client.incremental_alter_configs([incremental("gone", ("retention.ms", "42", SET))])
    assert outcomes(futures) == {"gone": KafkaError.UNKNOWN_TOPIC_OR_PART}

    node_id = next(iter(client.describe_cluster().result(timeout=20).nodes)).id
    broker_change = ConfigResource(
        BROKER,
        str(node_id),
        incremental_configs=[ConfigEntry("log.retention.ms", "1000", incremental_operation=SET)],
    )
    futures = client.incremental_alter_configs([broker_change])
    assert outcomes(futures) == {str(node_id): KafkaError.INVALID_REQUEST}


def test_alter_configs_replaces_the_whole_set(broker):
    client = admin(broker)
    outcomes(
        client.create_topics(
            [NewTopic("legacy", 1, 1, config={"retention.ms": "1000", "segment.ms": "60000"})]
        )
    )
    futures = client.alter_configs(
        [ConfigResource(TOPIC, "legacy", set_config={"retention.bytes": "4096"})]
    )
    assert outcomes(futures) == {"legacy": OK}
    assert explicit_configs(client, "legacy") == {"retention.bytes": "4096"}

    futures = client.alter_configs(
        [ConfigResource(TOPIC, "legacy", set_config={"retention.bytes": "lots"})]
    )
    assert outcomes(futures) == {"legacy": KafkaError.INVALID_CONFIG}
    futures = client.alter_configs(
        [ConfigResource(TOPIC, "legacy", set_config={"compression.type": "zstd"})],
        validate_only=True,
    )
    assert outcomes(futures) == {"legacy": OK}
    assert explicit_configs(client, "legacy") == {"retention.bytes": "4096"}

    kp = kp_admin(broker)
    try:
        result = kp.alter_configs(
            [KpConfigResource("TOPIC", "legacy", configs={"compression.type": "lz4"})],
            incremental=False,
        )
        assert result == {"topic": {"legacy": "OK"}}
        # kafka-python's legacy path resends the other modified keys so they survive.
        assert explicit_configs(client, "legacy") == {
            "retention.bytes": "4096",
            "compression.type": "lz4",
        }
    finally:
        kp.close()


def test_produce_sees_a_lowered_max_message_bytes(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("small", 1, 1)]))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    delivered: list[Any] = []
    producer.produce("small", b"x" * 2000, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(20) == 0
    assert delivered == [None]

    change = incremental("small", ("max.message.bytes", "1000", AlterConfigOpType.SET))
    assert outcomes(client.incremental_alter_configs([change])) == {"small": OK}
    producer.produce("small", b"x" * 2000, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(20) == 0
    assert delivered[1] is not None and delivered[1].code() == KafkaError.MSG_SIZE_TOO_LARGE


# -- DescribeCluster, DescribeTopicPartitions, OffsetForLeaderEpoch -----------------------


def test_describe_cluster(broker):
    kp = kp_admin(broker)
    try:
        cluster = kp.describe_cluster()  # DescribeCluster v2
        (node,) = cluster["brokers"]
        assert (node["host"], node["port"], node["is_fenced"]) == ("127.0.0.1", broker.port, False)
        assert cluster["controller_id"] == node["broker_id"]
        assert cluster["cluster_id"]
        assert "DESCRIBE" in cluster["authorized_operations"]
        for version in (0, 1):
            response = raw(
                kp,
                DescribeClusterRequest(
                    include_cluster_authorized_operations=False,
                    min_version=version,
                    max_version=version,
                ),
            )
            assert response.error_code == OK
            assert [b.broker_id for b in response.brokers] == [node["broker_id"]]
            assert response.cluster_id == cluster["cluster_id"]
        # Controllers are not described by a broker (KIP-919).
        response = raw(
            kp,
            DescribeClusterRequest(
                include_cluster_authorized_operations=False,
                endpoint_type=2,
                min_version=1,
                max_version=1,
            ),
        )
        assert response.error_code == 114  # MISMATCHED_ENDPOINT_TYPE
    finally:
        kp.close()
    client = admin(broker)
    described = client.describe_cluster().result(timeout=20)
    assert [n.id for n in described.nodes] == [node["broker_id"]]


def test_describe_topic_partitions_pages_with_a_cursor(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("pa", 3, 1), NewTopic("pb", 4, 1)]))
    kp = kp_admin(broker)
    try:
        page = kp.describe_topic_partitions(["pb", "pa", "pz"], response_partition_limit=2)
        assert [
            (t["name"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]
        ] == [("pa", [0, 1])]
        assert page["next_cursor"] == {"topic_name": "pa", "partition_index": 2}
        seen = []
        cursor = None
        for _ in range(10):
            page = kp.describe_topic_partitions(
                ["pa", "pb", "pz"], response_partition_limit=2, cursor=cursor
            )
            for t in page["topics"]:
                seen.append(
                    (t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]])
                )
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [
            ("pa", OK, [0, 1]),
            ("pa", OK, [2]),
            ("pb", OK, [0]),
            ("pb", OK, [1, 2]),
            ("pb", OK, [3]),
            ("pz", KafkaError.UNKNOWN_TOPIC_OR_PART, []),
        ]
        full = kp.describe_topic_partitions(["pb"])["topics"][0]
        leaders = {p["leader_id"] for p in full["partitions"]}
        assert all(p["replica_nodes"] == [p["leader_id"]] for p in full["partitions"])
        assert all(p["leader_epoch"] == 0 for p in full["partitions"])
        assert len(leaders) == 1
    finally:
        kp.close()


def test_offset_for_leader_epoch(broker):
    client = admin(broker)
    outcomes(client.create_topics([NewTopic("epochs", 2, 1)]))
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        producer.produce("epochs", b"%d" % i, partition=1)
    assert producer.flush(20) == 0

    topic, part = (
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic,
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition,
    )
    asks = [
        # (partition, current_leader_epoch, leader_epoch) -> (error, epoch, end offset)
        ((1, -1, 0), (OK, 0, 5)),
        ((0, 0, 0), (OK, 0, 0)),
        ((1, -1, 3), (OK, -1, -1)),  # an epoch newer than any: unknown, like Kafka's cache
        ((1, -1, -1), (OK, -1, -1)),
        ((1, 2, 0), (KafkaError.UNKNOWN_LEADER_EPOCH, -1, -1)),
        ((1, -5, 0), (KafkaError.FENCED_LEADER_EPOCH, -1, -1)),
        ((7, -1, 0), (KafkaError.UNKNOWN_TOPIC_OR_PART, -1, -1)),
    ]
    kp = kp_admin(broker)
    try:
        for version in (2, 3, 4):
            request = OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=[
                    topic(
                        topic="epochs",
                        partitions=[
                            part(partition=p, current_leader_epoch=c, leader_epoch=e)
                            for (p, c, e), _ in asks
                        ],
                    ),
                    topic(
                        topic="no-such-topic",
                        partitions=[part(partition=0, current_leader_epoch=-1, leader_epoch=0)],
                    ),
                ],
                min_version=version,
                max_version=version,
            )
            first, missing = raw(kp, request).topics
            got = [(p.error_code, p.leader_epoch, p.end_offset) for p in first.partitions]
            assert got == [want for _, want in asks], version
            assert [p.error_code for p in missing.partitions] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    finally:
        kp.close()

    # librdkafka validates a position that carries a leader epoch with OffsetForLeaderEpoch
    # before it fetches; with one epoch forever, the check passes and the records come.
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "epochs-check",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("epochs", 1, 2, leader_epoch=0)])
        values = []
        deadline = time.monotonic() + 20
        while len(values) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                values.append(msg.value())
        assert values == [b"2", b"3", b"4"]
    finally:
        consumer.close()


# -- every advertised version ------------------------------------------------------------


def test_every_advertised_version_of_the_topic_and_config_apis(broker):
    """One request per version, pinned, so no version's field set is left untried."""
    kp = kp_admin(broker)

    def pinned(cls: type, version: int, **fields: Any) -> Any:
        return raw(kp, cls(**fields, min_version=version, max_version=version))

    try:
        for v in range(2, 8):
            topics = [(f"v{v}", 2, 1, [], [("retention.ms", "1000")])]
            for expected in (OK, KafkaError.TOPIC_ALREADY_EXISTS):
                (result,) = pinned(
                    CreateTopicsRequest, v, topics=topics, timeout_ms=10000, validate_only=False
                ).topics
                assert (result.name, result.error_code) == (f"v{v}", expected), v
            if v >= 5:
                assert (result.num_partitions, result.replication_factor) == (-1, -1)
        for v in range(0, 4):
            topics = [(f"v{v + 2}", 3, None), ("v-none", 3, None)]
            results = pinned(
                CreatePartitionsRequest, v, topics=topics, timeout_ms=10000, validate_only=False
            ).results
            assert [(r.name, r.error_code) for r in results] == [
                (f"v{v + 2}", OK),
                ("v-none", KafkaError.UNKNOWN_TOPIC_OR_PART),
            ], v
        for v in range(0, 3):
            resources = [(2, f"v{v + 2}", [("retention.ms", "2000")])]
            (result,) = pinned(
                AlterConfigsRequest, v, resources=resources, validate_only=False
            ).responses
            assert result.error_code == OK, v
        for v in range(0, 2):
            resources = [(2, f"v{v + 2}", [("cleanup.policy", 2, "compact")])]  # APPEND
            (result,) = pinned(
                IncrementalAlterConfigsRequest, v, resources=resources, validate_only=False
            ).responses
            assert result.error_code == OK, v
        for v in range(1, 5):
            (result,) = pinned(
                DescribeConfigsRequest,
                v,
                resources=[(2, "v2", ["retention.ms", "cleanup.policy"])],
                include_synonyms=True,
                include_documentation=True,
            ).results
            values = {c.name: (c.value, c.config_source) for c in result.configs}
            assert values == {
                "retention.ms": ("2000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
                "cleanup.policy": ("delete,compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
            }, v
        for v in range(1, 6):
            names = [f"v{v + 1}", "v-none"]
            responses = pinned(
                DeleteTopicsRequest, v, topic_names=names, timeout_ms=10000
            ).responses
            assert [(r.name, r.error_code) for r in responses] == [
                (f"v{v + 1}", OK),
                ("v-none", KafkaError.UNKNOWN_TOPIC_OR_PART),
            ], v
        (result,) = pinned(
            DeleteTopicsRequest, 6, topics=[("v7", None)], timeout_ms=10000
        ).responses
        assert (result.name, result.error_code) == ("v7", OK)
    finally:
        kp.close()
    assert not any(name.startswith("v") for name in partition_counts(admin(broker)))


# -- two agents ---------------------------------------------------------------------------


def test_two_agents_replication_factor_and_broker_configs(start_broker):
    cluster = start_broker(agents=2)
    client = admin(cluster)
    deadline = time.monotonic() + 20
    while len(client.describe_cluster().result(timeout=20).nodes) < 2:
        assert time.monotonic() < deadline, "the second agent never registered"
        time.sleep(0.2)
    assert outcomes(client.create_topics([NewTopic("two", 4, 2), NewTopic("three", 1, 3)])) == {
        "two": OK,
        "three": KafkaError.INVALID_REPLICATION_FACTOR,
    }
    # Each broker resource is answered by that broker (the client routes it there).
    node_ids = sorted(n.id for n in client.describe_cluster().result(timeout=20).nodes)
    ports = []
    for node_id in node_ids:  # librdkafka takes one BROKER resource per call
        (future,) = client.describe_configs([ConfigResource(BROKER, str(node_id))]).values()
        configs = future.result(timeout=20)
        assert configs["node.id"].value == str(node_id)
        ports.append(int(configs["listeners"].value.rsplit(":", 1)[1]))
    assert sorted(ports) == cluster.ports

    # A change made through one agent is seen through the other.
    change = incremental("two", ("retention.ms", "777", AlterConfigOpType.SET))
    assert outcomes(client.incremental_alter_configs([change])) == {"two": OK}
    for port in cluster.ports:
        other = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        assert explicit_configs(other, "two") == {"retention.ms": "777"}


def test_auto_created_topic_may_not_collide_by_dot_and_underscore(broker):
    client = admin(broker)
    for future in client.create_topics([NewTopic("collide.name", 1)]).values():
        future.result(10)
    md = raw_metadata_topic(broker, "collide_name")
    assert md.error_code == ErrorCode.invalid_topic_exception
    assert "collide_name" not in partition_counts(client)


def test_metadata_reports_authorized_operations_when_asked(broker):
    client = admin(broker)
    for future in client.create_topics([NewTopic("ops-topic", 1)]).values():
        future.result(10)
    described = client.describe_topics(
        TopicCollection(["ops-topic"]), include_authorized_operations=True
    )
    ops = described["ops-topic"].result(10).authorized_operations
    assert {op.name for op in ops} == {
        "READ",
        "WRITE",
        "CREATE",
        "DELETE",
        "ALTER",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }
    cluster = client.describe_cluster(include_authorized_operations=True).result(10)
    assert "IDEMPOTENT_WRITE" in {op.name for op in cluster.authorized_operations}


def raw_metadata_topic(broker: Any, name: str) -> Any:
    from kio.index import load_request_schema

    from broker.entities import build
    from tests.e2e.rawclient import roundtrip

    request = build(
        load_request_schema(3, 12),
        {
            "topics": [{"name": name, "topic_id": None}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    return roundtrip(broker.port, request).topics[0]
