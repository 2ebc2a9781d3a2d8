"""ACLs enforced on a running broker, with real clients.

Until clients can authenticate every client is User:ANONYMOUS, so the module's broker
first runs with `--super-users User:ANONYMOUS` to create topics, records and ACLs, then
again on the same data without it: from then on User:ANONYMOUS has exactly what the ACLs
give it (the cluster's ALTER and DESCRIBE, to manage ACLs; READ on topics prefixed "ro-"
and on group "ro-group"; ALL on topics prefixed "mixed-" except READ on "mixed-secret";
WRITE on transactional id "txn-ok"; nothing on "hidden-x").
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from protocol.records import build_batch
from tests.e2e import wire
from tests.integration.support import INTEGRATION, run_tool
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

ME = "User:ANONYMOUS"
RECORDS = [f"r{i}".encode() for i in range(5)]
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ACLS = [
    AclBinding(ResourceType.BROKER, "kafka-cluster", LITERAL, ME, "*", AclOperation.ALTER, ALLOW),
    AclBinding(ResourceType.TOPIC, "ro-", PREFIXED, ME, "*", AclOperation.READ, ALLOW),
    AclBinding(ResourceType.GROUP, "ro-group", LITERAL, ME, "*", AclOperation.READ, ALLOW),
    AclBinding(ResourceType.TOPIC, "mixed-", PREFIXED, ME, "*", AclOperation.ALL, ALLOW),
    AclBinding(ResourceType.TOPIC, "mixed-secret", LITERAL, ME, "*", AclOperation.READ, DENY),
    AclBinding(
        ResourceType.TRANSACTIONAL_ID, "txn-ok", LITERAL, ME, "*", AclOperation.WRITE, ALLOW
    ),
]
TOPICS = ["ro-orders", "mixed-open", "mixed-secret", "hidden-x"]


def _result(futures: dict) -> list:
    return [f.result(30) for f in futures.values()]


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _produce(bootstrap: str, topic: str, values: list[bytes], **config: object) -> list:
    """Produce and flush; the delivery errors (None for each record delivered)."""
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10_000, **config})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    return errors


def _exactly(b: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        b.restype,
        b.name,
        b.resource_pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission_type,
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("acls") / "data"
    port = free_ports(1)[0]
    common = ["--authorizer", "--group-initial-rebalance-delay-ms", "0"]
    first = BrokerProcess(data_dir, port, extra_args=[*common, "--super-users", ME])
    first.start()
    try:
        admin = _admin(first.bootstrap)
        _result(admin.create_acls(ACLS))
        _result(admin.create_topics([NewTopic(t, 1, 1) for t in TOPICS], operation_timeout=30))
        # A super user passes every check, the DENY on mixed-secret too.
        assert _produce(first.bootstrap, "ro-orders", RECORDS) == [None] * len(RECORDS)
        assert _produce(first.bootstrap, "mixed-secret", RECORDS[:1]) == [None]
        with wire.WireClient(first.bootstrap) as client:
            read = wire.fetch(client, "mixed-secret", 0, 0)
            assert read.error_code == ErrorCode.none and read.records
    finally:
        first.stop()
    broker = BrokerProcess(data_dir, port, extra_args=common)
    broker.start()
    yield broker
    broker.stop()


def test_acl_apis_are_advertised(secured):
    with wire.WireClient(secured.bootstrap) as client:
        apis = wire.api_versions(client)
    assert {key: apis.get(key) for key in (29, 30, 31)} == {29: (1, 3), 30: (1, 3), 31: (1, 3)}


def test_read_on_a_prefix_and_its_group_consumes_but_cannot_produce(secured):
    consumer = Consumer(
        {
            "bootstrap.servers": secured.bootstrap,
            "group.id": "ro-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["ro-orders"])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(RECORDS) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
        assert got == RECORDS
        committed = consumer.commit(asynchronous=False)  # READ on the group and the topic
        assert [tp.error for tp in committed] == [None]
    finally:
        consumer.close()
    errors = _produce(secured.bootstrap, "ro-orders", [b"no"])
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # Another group is refused from its first request on.
    with wire.WireClient(secured.bootstrap) as client:
        answer = client.call(wire.request(10, 4, key_type=0, coordinator_keys=["other-group"]))
    assert answer.coordinators[0].error_code == ErrorCode.group_authorization_failed


def test_a_deny_overrides_an_allow(secured):
    with wire.WireClient(secured.bootstrap) as client:
        assert wire.fetch(client, "mixed-secret", 0, 0).error_code == (
            ErrorCode.topic_authorization_failed
        )
        assert wire.fetch(client, "mixed-open", 0, 0).error_code == ErrorCode.none
    # The DENY is for READ only: ALL still allows WRITE.
    assert _produce(secured.bootstrap, "mixed-secret", [b"w"]) == [None]


def test_no_acl_refuses_every_operation_and_metadata_hides_the_topic(secured):
    with wire.WireClient(secured.bootstrap) as client:
        listed = {t.name for t in wire.metadata(client, None).topics}
        assert listed == {"ro-orders", "mixed-open", "mixed-secret"}
        (named,) = wire.metadata(client, ["hidden-x"]).topics
        assert named.error_code == ErrorCode.topic_authorization_failed
        # Auto-creation needs CREATE: refused, and not created.
        (new,) = wire.metadata(client, ["hidden-new"]).topics
        assert new.error_code == ErrorCode.topic_authorization_failed
        offsets = wire.list_offsets(client, "hidden-x", {0: -1}, version=7)
        assert offsets[0].error_code == ErrorCode.topic_authorization_failed
        deleted = client.call(
            wire.request(20, 6, topics=[{"name": "hidden-x", "topic_id": None}], timeout=5000)
        )
        assert deleted.responses[0].error_code == ErrorCode.topic_authorization_failed
        created = client.call(
            wire.request(
                19,
                7,
                topics=[
                    {
                        "name": "hidden-new",
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "assignments": [],
                        "configs": [],
                    }
                ],
                timeout=5000,
                validate_only=False,
            )
        )
        assert created.topics[0].error_code == ErrorCode.topic_authorization_failed
    errors = _produce(secured.bootstrap, "hidden-x", [b"x"])
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # Denials are counted in the stats file and logged within the rate limit.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        denied = secured.stats().get("authorization", {}).get("denied", {})
        if denied.get("TOPIC", 0) >= 4:
            break
        time.sleep(0.2)
    assert denied.get("TOPIC", 0) >= 4
    assert "authorization denied: User:ANONYMOUS" in secured.log_text()
    assert "Traceback" not in secured.log_text()


def test_idempotent_producer_needs_idempotent_write_or_write_on_a_topic(secured):
    # WRITE on mixed-* is enough (Kafka 3.x+).
    assert _produce(secured.bootstrap, "mixed-open", [b"i"], **{"enable.idempotence": True}) == [
        None
    ]
    admin = _admin(secured.bootstrap)
    deny_all_writes = AclBinding(
        ResourceType.TOPIC, "*", LITERAL, ME, "*", AclOperation.WRITE, DENY
    )
    idempotent_write = AclBinding(
        ResourceType.BROKER, "kafka-cluster", LITERAL, ME, "*", AclOperation.IDEMPOTENT_WRITE, ALLOW
    )
    _result(admin.create_acls([deny_all_writes]))
    try:
        with wire.WireClient(secured.bootstrap) as client:
            refused = wire.init_producer_id(client)
            assert refused.error_code == ErrorCode.cluster_authorization_failed
            _result(admin.create_acls([idempotent_write]))
            granted = wire.init_producer_id(client)
            assert granted.error_code == ErrorCode.none and granted.producer_id >= 0
    finally:
        _result(admin.delete_acls([_exactly(deny_all_writes), _exactly(idempotent_write)]))


def test_transactional_producer_needs_write_on_its_transactional_id(secured):
    topic = "mixed-txn"
    producer = Producer({"bootstrap.servers": secured.bootstrap, "transactional.id": "txn-ok"})
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce(topic, b"in-txn")
    producer.commit_transaction(15)
    with wire.WireClient(secured.bootstrap) as client:
        offsets = wire.list_offsets(client, topic, {0: -1}, version=7)
    assert offsets[0].offset == 2  # the record and the commit marker
    refused = Producer({"bootstrap.servers": secured.bootstrap, "transactional.id": "txn-no"})
    with pytest.raises(KafkaException) as caught:
        refused.init_transactions(15)
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


KAFKA_JARS = INTEGRATION / ".cache" / "jars" / "kafka"


@pytest.mark.skipif(shutil.which("java") is None, reason="`java` is not on PATH")
def test_kafka_acls_adds_lists_and_removes(secured):
    if not any(KAFKA_JARS.glob("*.jar")):
        pytest.skip("Apache Kafka's jars are not in integration/.cache (make jars)")
    topic = f"tool-{uuid.uuid4().hex[:6]}"
    pattern = ["--topic", topic, "--resource-pattern-type", "prefixed"]
    server = ["--bootstrap-server", secured.bootstrap]
    run_tool(
        "kafka-acls",
        *server,
        "--add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "Describe",
        *pattern,
    )
    listed = run_tool("kafka-acls", *server, "--list", *pattern).stdout
    assert "User:alice" in listed and "READ" in listed and "DESCRIBE" in listed, listed
    flt = AclBindingFilter(
        ResourceType.TOPIC, topic, PREFIXED, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    admin = _admin(secured.bootstrap)
    stored = admin.describe_acls(flt).result(30)
    assert sorted((b.principal, b.operation) for b in stored) == [
        ("User:alice", AclOperation.READ),
        ("User:alice", AclOperation.DESCRIBE),
    ]
    run_tool("kafka-acls", *server, "--remove", "--force", *pattern)
    assert admin.describe_acls(flt).result(30) == []


def test_an_acl_added_through_one_agent_is_enforced_by_another_within_a_second(start_broker):
    broker = start_broker(agents=2, extra_args=["--authorizer", "--allow-everyone-if-no-acl-found"])
    first, second = broker.ports
    topic = "shared"
    with wire.WireClient(("127.0.0.1", second)) as client:
        (made,) = wire.metadata(client, [topic]).topics  # no ACL at all: open to all
        assert made.error_code == ErrorCode.none
        assert _offsets_error(client, topic) == ErrorCode.none
    with wire.WireClient(("127.0.0.1", first)) as client:
        answer = client.call(
            wire.request(
                30,
                3,
                creations=[
                    {
                        "resource_type": 2,
                        "resource_name": topic,
                        "resource_pattern_type": 3,
                        "principal": ME,
                        "host": "*",
                        "operation": 8,  # DESCRIBE
                        "permission_type": 2,  # DENY
                    }
                ],
            )
        )
        assert [r.error_code for r in answer.results] == [ErrorCode.none]
    created = time.monotonic()
    with wire.WireClient(("127.0.0.1", second)) as client:
        while _offsets_error(client, topic) == ErrorCode.none:
            assert time.monotonic() - created < 1.0, "not enforced by the other agent in 1 s"
            time.sleep(0.02)
        assert _offsets_error(client, topic) == ErrorCode.topic_authorization_failed


def _offsets_error(client: wire.WireClient, topic: str) -> ErrorCode:
    return wire.list_offsets(client, topic, {0: -1}, version=7)[0].error_code


GROUP_DENIED = ErrorCode.group_authorization_failed
TOPIC_DENIED = ErrorCode.topic_authorization_failed
TXN_DENIED = ErrorCode.transactional_id_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
_PROTOCOLS = [{"name": "range", "metadata": b""}]
_TXN = {"producer_id": 1, "producer_epoch": 0}
# (api key, version, request fields, where the answer's error is, the error): each API
# checks what Kafka checks ("other-group", "hidden-x", "txn-no" have no ACL; READ is all
# there is on "ro-group" and "ro-orders"). DescribeTransactions is left out: its answer
# carries Kafka's -1 start time, which the test client's decoder refuses.
EVERY_API = {
    "JoinGroup": (
        11,
        9,
        {
            "group_id": "other-group",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": _PROTOCOLS,
        },
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "SyncGroup": (
        14,
        5,
        {
            "group_id": "other-group",
            "generation_id": 1,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [],
        },
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "Heartbeat": (
        12,
        4,
        {"group_id": "other-group", "generation_id": 1, "member_id": "m"},
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "LeaveGroup": (
        13,
        5,
        {"group_id": "other-group", "members": [{"member_id": "m"}]},
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "DescribeGroups": (
        15,
        5,
        {"groups": ["other-group"], "include_authorized_operations": True},
        lambda a: a.groups[0].error_code,
        GROUP_DENIED,
    ),
    "DeleteGroups": (
        42,
        2,
        {"groups_names": ["ro-group"]},
        lambda a: a.results[0].error_code,
        GROUP_DENIED,
    ),
    "OffsetDelete": (
        47,
        0,
        {
            "group_id": "ro-group",
            "topics": [{"name": "ro-orders", "partitions": [{"partition_index": 0}]}],
        },
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "OffsetFetch group": (
        9,
        9,
        {"groups": [{"group_id": "other-group", "topics": None}], "require_stable": False},
        lambda a: a.groups[0].error_code,
        GROUP_DENIED,
    ),
    "OffsetFetch topic": (
        9,
        9,
        {
            "groups": [
                {"group_id": "ro-group", "topics": [{"name": "hidden-x", "partition_indexes": [0]}]}
            ],
            "require_stable": False,
        },
        lambda a: a.groups[0].topics[0].partitions[0].error_code,
        TOPIC_DENIED,
    ),
    "DescribeConfigs topic": (
        32,
        4,
        {
            "resources": [
                {"resource_type": 2, "resource_name": "hidden-x", "configuration_keys": None}
            ]
        },
        lambda a: a.results[0].error_code,
        TOPIC_DENIED,
    ),
    "DescribeConfigs broker": (
        32,
        4,
        {"resources": [{"resource_type": 4, "resource_name": "1", "configuration_keys": None}]},
        lambda a: a.results[0].error_code,
        CLUSTER_DENIED,
    ),
    "IncrementalAlterConfigs": (
        44,
        1,
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "ro-orders",
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}],
                }
            ],
            "validate_only": False,
        },
        lambda a: a.responses[0].error_code,
        TOPIC_DENIED,
    ),
    "AlterConfigs": (
        33,
        2,
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "ro-orders",
                    "configs": [{"name": "retention.ms", "value": "1"}],
                }
            ],
            "validate_only": False,
        },
        lambda a: a.responses[0].error_code,
        TOPIC_DENIED,
    ),
    "DeleteRecords": (
        21,
        2,
        {
            "topics": [{"name": "ro-orders", "partitions": [{"partition_index": 0, "offset": -1}]}],
            "timeout": 5000,
        },
        lambda a: a.topics[0].partitions[0].error_code,
        TOPIC_DENIED,
    ),
    "CreatePartitions": (
        37,
        3,
        {
            "topics": [{"name": "ro-orders", "count": 2, "assignments": None}],
            "timeout": 5000,
            "validate_only": False,
        },
        lambda a: a.results[0].error_code,
        TOPIC_DENIED,
    ),
    "AddPartitionsToTxn id": (
        24,
        3,
        {
            "v3_and_below_transactional_id": "txn-no",
            "v3_and_below_producer_id": 1,
            "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": "mixed-open", "partitions": [0]}],
        },
        lambda a: a.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
        TXN_DENIED,
    ),
    "AddPartitionsToTxn topic": (
        24,
        3,
        {
            "v3_and_below_transactional_id": "txn-ok",
            "v3_and_below_producer_id": 1,
            "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": "ro-orders", "partitions": [0]}],
        },
        lambda a: a.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
        TOPIC_DENIED,
    ),
    "AddOffsetsToTxn id": (
        25,
        3,
        {"transactional_id": "txn-no", "group_id": "ro-group", **_TXN},
        lambda a: a.error_code,
        TXN_DENIED,
    ),
    "AddOffsetsToTxn group": (
        25,
        3,
        {"transactional_id": "txn-ok", "group_id": "other-group", **_TXN},
        lambda a: a.error_code,
        GROUP_DENIED,
    ),
    "EndTxn": (
        26,
        3,
        {"transactional_id": "txn-no", "committed": True, **_TXN},
        lambda a: a.error_code,
        TXN_DENIED,
    ),
    "TxnOffsetCommit": (
        28,
        3,
        {
            "transactional_id": "txn-no",
            "group_id": "ro-group",
            **_TXN,
            "topics": [
                {
                    "name": "ro-orders",
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}
                    ],
                }
            ],
        },
        lambda a: a.topics[0].partitions[0].error_code,
        TXN_DENIED,
    ),
    "DescribeProducers": (
        61,
        0,
        {"topics": [{"name": "hidden-x", "partition_indexes": [0]}]},
        lambda a: a.topics[0].partitions[0].error_code,
        TOPIC_DENIED,
    ),
    "DescribeTopicPartitions": (
        75,
        0,
        {"topics": [{"name": "hidden-x"}], "response_partition_limit": 100, "cursor": None},
        lambda a: a.topics[0].error_code,
        TOPIC_DENIED,
    ),
    "OffsetForLeaderEpoch": (
        23,
        4,
        {"topics": [{"topic": "hidden-x", "partitions": [{"partition": 0, "leader_epoch": 0}]}]},
        lambda a: a.topics[0].partitions[0].error_code,
        TOPIC_DENIED,
    ),
    "DescribeClientQuotas": (
        48,
        1,
        {"components": [], "strict": False},
        lambda a: a.error_code,
        CLUSTER_DENIED,
    ),
}


@pytest.mark.parametrize("api", list(EVERY_API))
def test_every_api_checks_what_kafka_checks(secured, api):
    key, version, fields, error_of, expected = EVERY_API[api]
    with wire.WireClient(secured.bootstrap) as client:
        answer = client.call(wire.request(key, version, **fields))
    assert error_of(answer) == expected, answer


def test_authorized_operations_are_the_principals(secured):
    with wire.WireClient(secured.bootstrap) as client:
        cluster = client.call(
            wire.request(60, 1, include_cluster_authorized_operations=True, endpoint_type=1)
        )
        groups = client.call(
            wire.request(15, 5, groups=["ro-group"], include_authorized_operations=True)
        )
        (topic,) = client.call(
            wire.request(
                3,
                12,
                topics=[{"name": "ro-orders", "topic_id": None}],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=True,
            )
        ).topics
    # ALTER on the cluster implies DESCRIBE; READ on a group or topic implies DESCRIBE.
    assert cluster.cluster_authorized_operations == (1 << 7) | (1 << 8)
    assert groups.groups[0].authorized_operations == (1 << 3) | (1 << 8)
    assert topic.topic_authorized_operations == (1 << 3) | (1 << 8)


def test_a_transactional_produce_needs_write_on_its_transactional_id_first(secured):
    batch = build_batch(
        [(None, b"t", [], int(time.time() * 1000))],
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    with wire.WireClient(secured.bootstrap) as client:
        # ro-orders refuses WRITE too; Kafka answers the transactional id first.
        answers = wire.produce(client, {"ro-orders": {0: batch}}, transactional_id="txn-no")
    assert {k: a.error_code for k, a in answers.items()} == {("ro-orders", 0): TXN_DENIED}
