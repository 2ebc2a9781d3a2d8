"""Consumer-group APIs with raw requests against a real broker: every version we
advertise, and the exact error codes of the error paths."""

from __future__ import annotations

import time

import pytest

from tests.e2e.rawclient import ensure_topic, roundtrip
from tests.support.groups import (
    DELETE,
    DESCRIBE,
    LEAVE,
    LIST,
    OFFSET_DELETE,
    Background,
    assignment,
    commit,
    fetch_offsets,
    find_coordinator,
    group_coordinated_by,
    heartbeat,
    join,
    join_member,
    request,
    subscription,
    sync,
    wait_for_agents,
    wait_until,
)

pytestmark = pytest.mark.store_independent

NONE, NOT_COORDINATOR, ILLEGAL_GENERATION, INCONSISTENT_PROTOCOL = 0, 16, 22, 23
INVALID_GROUP_ID, UNKNOWN_MEMBER, INVALID_SESSION_TIMEOUT, REBALANCING = 24, 25, 26, 27
NON_EMPTY_GROUP, GROUP_NOT_FOUND, MEMBER_ID_REQUIRED, FENCED_INSTANCE = 68, 69, 79, 82
UNKNOWN_TOPIC, SUBSCRIBED, INVALID_REQUEST, TOO_LARGE, UNSTABLE = 3, 86, 42, 12, 88

FAST = ["--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "500"]


@pytest.fixture
def port(start_broker) -> int:
    broker = start_broker(extra_args=[*FAST, "--default-partitions", "4"])
    ensure_topic(broker.port, "t")
    return broker.port


def stable_member(port: int, group: str, **kw) -> tuple[str, int]:
    joined = join_member(port, group, **kw)
    assert joined.error_code == NONE, joined
    answer = sync(port, group, joined.generation_id, joined.member_id,
                  {joined.member_id: assignment("t", [0, 1, 2, 3])})  # fmt: skip
    assert answer.error_code == NONE
    return joined.member_id, joined.generation_id


def test_find_coordinator_every_version(port):
    for version in range(7):
        answer = find_coordinator(port, "grp", version=version)
        if version < 4:
            assert (answer.error_code, answer.port) == (NONE, port)
        else:
            (c,) = answer.coordinators
            assert (c.key, c.error_code, c.port) == ("grp", NONE, port)
    batched = roundtrip(port, request(10, 4, key_type=0, coordinator_keys=["a", "b", "c"]))
    assert [c.key for c in batched.coordinators] == ["a", "b", "c"]
    txn = find_coordinator(port, "tx", version=3, key_type=1)
    assert (txn.error_code, txn.port) == (NONE, port)
    share = find_coordinator(port, "sh", version=6, key_type=2).coordinators[0]
    assert (share.error_code, share.node_id) == (INVALID_REQUEST, -1)


def test_join_sync_heartbeat_commit_and_their_error_codes(port):
    first = join(port, "g1")
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id
    joined = join(port, "g1", first.member_id)
    assert (joined.error_code, joined.generation_id, joined.leader) == (NONE, 1, first.member_id)
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    assert [m.member_id for m in joined.members] == [first.member_id]
    me = first.member_id
    assert heartbeat(port, "g1", 1, me) == NONE  # CompletingRebalance: heartbeats are fine
    assert heartbeat(port, "g1", 2, me) == ILLEGAL_GENERATION
    assert heartbeat(port, "g1", 1, "stranger") == UNKNOWN_MEMBER
    assert sync(port, "g1", 2, me).error_code == ILLEGAL_GENERATION
    assert sync(port, "g1", 1, "stranger").error_code == UNKNOWN_MEMBER
    assert sync(port, "g1", 1, me, protocol_name="roundrobin").error_code == INCONSISTENT_PROTOCOL
    assert sync(port, "g1", 1, me, protocol_type=None).error_code == INCONSISTENT_PROTOCOL
    synced = sync(port, "g1", 1, me, {me: assignment("t", [0, 1])})
    assert (synced.error_code, synced.assignment) == (NONE, assignment("t", [0, 1]))
    assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")
    assert commit(port, "g1", 2, me, {("t", 0): 5}) == {("t", 0): ILLEGAL_GENERATION}
    assert commit(port, "g1", 1, "stranger", {("t", 0): 5}) == {("t", 0): UNKNOWN_MEMBER}
    assert commit(port, "g1", 1, me, {("t", 0): 5, ("t", 9): 1, ("nope", 0): 1}) == {
        ("t", 0): NONE,
        ("t", 9): UNKNOWN_TOPIC,
        ("nope", 0): UNKNOWN_TOPIC,
    }
    assert commit(port, "g1", 1, me, {("t", 1): 5}, metadata="x" * 4097) == {("t", 1): TOO_LARGE}
    assert commit(port, "absent", 3, "m", {("t", 0): 1}, version=8) == {
        ("t", 0): ILLEGAL_GENERATION
    }
    assert commit(port, "absent", 3, "m", {("t", 0): 1}, version=9) == {("t", 0): GROUP_NOT_FOUND}
    # Request checks.
    assert join(port, "").error_code == INVALID_GROUP_ID
    assert join(port, "g1", session_ms=100).error_code == INVALID_SESSION_TIMEOUT
    assert join(port, "g1", "stranger").error_code == UNKNOWN_MEMBER
    assert join(port, "g1", protocol_type="connect").error_code == INCONSISTENT_PROTOCOL
    # JoinGroup v0-v3 need no second round for the member id.
    old = join(port, "g-old", version=3)
    assert (old.error_code, old.generation_id) == (NONE, 1) and old.member_id


def test_commit_during_a_rebalance(port):
    a, gen = stable_member(port, "g2")
    b_join = Background(join_member, port, "g2")
    wait_until(lambda: heartbeat(port, "g2", gen, a) == REBALANCING)
    # PreparingRebalance: what was processed in generation 1 may still be committed ...
    assert commit(port, "g2", gen, a, {("t", 0): 10}) == {("t", 0): NONE}
    assert sync(port, "g2", gen, a).error_code == REBALANCING
    a_join = Background(join, port, "g2", a)
    ja, jb = a_join.get(), b_join.get()
    assert ja.generation_id == jb.generation_id == 2 and ja.leader == a
    # ... but once the new generation is handed out and not yet synced: REBALANCE_IN_PROGRESS.
    assert commit(port, "g2", 2, a, {("t", 0): 11}) == {("t", 0): REBALANCING}
    b_sync = Background(sync, port, "g2", 2, jb.member_id)
    leader_sync = sync(
        port, "g2", 2, a, {a: assignment("t", [0, 1]), jb.member_id: assignment("t", [2, 3])}
    )
    assert leader_sync.assignment == assignment("t", [0, 1])
    assert b_sync.get().assignment == assignment("t", [2, 3])
    assert commit(port, "g2", 2, a, {("t", 0): 11}) == {("t", 0): NONE}
    assert fetch_offsets(port, "g2", {"t": [0]})[1][("t", 0)][0] == 11


def test_heartbeat_after_the_session_timeout(port):
    member, gen = stable_member(port, "g3", session_ms=600)
    assert heartbeat(port, "g3", gen, member) == NONE
    time.sleep(1.3)
    assert heartbeat(port, "g3", gen, member) == UNKNOWN_MEMBER
    assert commit(port, "g3", gen, member, {("t", 0): 1}) == {("t", 0): UNKNOWN_MEMBER}
    # The group is Empty again: a simple commit works now.
    assert commit(port, "g3", -1, "", {("t", 0): 1}) == {("t", 0): NONE}


def test_static_member_fencing(port):
    first, gen = stable_member(port, "g4", instance="inst-1")
    again = join(port, "g4", instance="inst-1")
    assert again.error_code == NONE and again.member_id != first
    assert again.generation_id == gen
    answer = roundtrip(
        port,
        request(
            12, 4, group_id="g4", generation_id=gen, member_id=first, group_instance_id="inst-1"
        ),
    )
    assert answer.error_code == FENCED_INSTANCE


def test_offset_commit_and_fetch_every_version(port):
    for version in range(2, 10):
        group = f"simple-{version}"
        assert commit(port, group, -1, "", {("t", 1): 40 + version}, version=version,
                      metadata=f"m{version}", leader_epoch=0) == {("t", 1): NONE}  # fmt: skip
    for version in range(1, 10):
        group = f"simple-{max(version, 2)}"
        error, got = fetch_offsets(port, group, {"t": [1, 2]}, version=version)
        offset, epoch, metadata, part_error = got[("t", 1)]
        assert (error, part_error, offset, metadata) == (
            NONE,
            NONE,
            40 + max(version, 2),
            f"m{max(version, 2)}",
        )
        assert epoch == (0 if version >= 5 and max(version, 2) >= 6 else -1)
        assert got[("t", 2)][0] == -1
        if version >= 2:
            error, every = fetch_offsets(port, group, None, version=version)
            assert list(every) == [("t", 1)]


def test_offset_fetch_of_several_groups(port):
    commit(port, "ga", -1, "", {("t", 0): 1})
    commit(port, "gb", -1, "", {("t", 0): 2})
    answer = roundtrip(
        port,
        request(
            9, 8,
            groups=[{"group_id": "ga", "topics": None}, {"group_id": "gb", "topics": [{"name": "t", "partition_indexes": [0]}]}],
            require_stable=False,
        ),
    )  # fmt: skip
    assert [(g.group_id, g.topics[0].partitions[0].committed_offset) for g in answer.groups] == [
        ("ga", 1),
        ("gb", 2),
    ]


def test_leave_group_versions(port):
    member, _gen = stable_member(port, "g5")
    assert (
        roundtrip(port, request(LEAVE, 0, group_id="g5", member_id="nobody")).error_code
        == UNKNOWN_MEMBER
    )
    assert roundtrip(port, request(LEAVE, 2, group_id="g5", member_id=member)).error_code == NONE
    a, _ = stable_member(port, "g6", instance="i-a")
    answer = roundtrip(
        port,
        request(LEAVE, 5, group_id="g6", members=[
            {"member_id": "", "group_instance_id": "i-a", "reason": "admin"},
            {"member_id": "ghost", "group_instance_id": None, "reason": None},
        ]),
    )  # fmt: skip
    assert answer.error_code == NONE
    assert [(m.member_id, m.group_instance_id, m.error_code) for m in answer.members] == [
        ("", "i-a", NONE),
        ("ghost", None, UNKNOWN_MEMBER),
    ]
    described = roundtrip(
        port, request(DESCRIBE, 5, groups=["g6"], include_authorized_operations=False)
    )
    assert described.groups[0].group_state == "Empty"


def test_list_describe_delete_and_offset_delete(port):
    member, _gen = stable_member(port, "busy")
    commit(port, "busy", 1, member, {("t", 0): 3, ("t", 1): 4})
    commit(port, "idle", -1, "", {("t", 0): 7})
    for version in range(6):
        listed = roundtrip(port, request(LIST, version, states_filter=[], types_filter=[])).groups
        assert {g.group_id for g in listed} >= {"busy", "idle"}
        if version >= 4:
            only_stable = roundtrip(
                port, request(LIST, version, states_filter=["stable"], types_filter=[])
            )
            assert [(g.group_id, g.group_state) for g in only_stable.groups] == [("busy", "Stable")]
        if version >= 5:
            none = roundtrip(
                port, request(LIST, version, states_filter=[], types_filter=["consumer"])
            )
            assert none.groups == ()
    for version in range(6):
        d = roundtrip(port, request(DESCRIBE, version, groups=["busy", "idle", "ghost"],
                                    include_authorized_operations=True)).groups  # fmt: skip
        assert [(g.group_id, g.group_state, g.protocol_type, g.protocol_data) for g in d] == [
            ("busy", "Stable", "consumer", "range"),
            ("idle", "Empty", "", ""),
            ("ghost", "Dead", "", ""),
        ]
        (m,) = d[0].members
        assert (m.member_id, m.client_id, m.client_host) == (member, "rawclient", "/127.0.0.1")
        assert m.member_metadata == subscription("t")
        assert m.member_assignment == assignment("t", [0, 1, 2, 3])
        if version >= 3:
            assert d[0].authorized_operations == 3400
    # The subscribed topic's offsets stay; the group with members is not deleted.
    od = roundtrip(port, request(OFFSET_DELETE, 0, group_id="busy", topics=[
        {"name": "t", "partitions": [{"partition_index": 0}]},
        {"name": "nope", "partitions": [{"partition_index": 0}]},
    ]))  # fmt: skip
    assert od.error_code == NONE
    assert [(t.name, t.partitions[0].error_code) for t in od.topics] == [
        ("t", SUBSCRIBED),
        ("nope", UNKNOWN_TOPIC),
    ]
    ghost = roundtrip(port, request(OFFSET_DELETE, 0, group_id="ghost", topics=[]))
    assert ghost.error_code == GROUP_NOT_FOUND
    od = roundtrip(port, request(OFFSET_DELETE, 0, group_id="idle", topics=[
        {"name": "t", "partitions": [{"partition_index": 0}]}]))  # fmt: skip
    assert (od.error_code, od.topics[0].partitions[0].error_code) == (NONE, NONE)
    assert fetch_offsets(port, "idle", None)[1] == {}
    deleted = roundtrip(port, request(DELETE, 2, groups_names=["busy", "idle", "ghost"])).results
    assert [(r.group_id, r.error_code) for r in deleted] == [
        ("busy", NON_EMPTY_GROUP),
        ("idle", NONE),
        ("ghost", GROUP_NOT_FOUND),
    ]


def test_not_coordinator_on_the_other_agent(start_broker):
    broker = start_broker(agents=2, extra_args=FAST)
    a, b = broker.ports
    ensure_topic(a, "t")
    wait_for_agents(broker.ports)
    group = group_coordinated_by(broker.ports, b, "ng")
    assert find_coordinator(a, group).port == b
    assert join(a, group).error_code == NOT_COORDINATOR
    assert heartbeat(a, group, 1, "m") == NOT_COORDINATOR
    assert commit(a, group, -1, "", {("t", 0): 1}) == {("t", 0): NOT_COORDINATOR}
    assert fetch_offsets(a, group, {"t": [0]}, version=7)[0] == NOT_COORDINATOR
    assert fetch_offsets(a, group, {"t": [0]}, version=1)[1][("t", 0)][3] == NOT_COORDINATOR
    member, _gen = stable_member(b, group)
    assert member


def test_each_agent_lists_the_groups_it_coordinates(start_broker):
    broker = start_broker(agents=2, extra_args=FAST)
    a, b = broker.ports
    ensure_topic(a, "t")
    wait_for_agents(broker.ports)
    groups = [f"listed-{i}" for i in range(8)]
    for group in groups:
        port = int(find_coordinator(a, group).port)
        assert commit(port, group, -1, "", {("t", 0): 1}) == {("t", 0): NONE}
    listed = {
        port: [g.group_id for g in roundtrip(port, request(LIST, 4, states_filter=[])).groups]
        for port in (a, b)
    }
    assert sorted(listed[a] + listed[b]) == groups
    for port, names in listed.items():
        assert all(int(find_coordinator(port, g).port) == port for g in names)


def test_offsets_of_an_empty_group_expire(start_broker):
    broker = start_broker(
        extra_args=[
            *FAST,
            "--offsets-retention-minutes",
            "0.02",  # 1.2 s
            "--offsets-retention-check-interval-ms",
            "200",
        ]
    )
    ensure_topic(broker.port, "t")
    member, gen = stable_member(broker.port, "fleeting")
    assert commit(broker.port, "fleeting", gen, member, {("t", 0): 3}) == {("t", 0): NONE}
    time.sleep(1.5)
    # A group with members keeps its offsets however old they are ...
    assert fetch_offsets(broker.port, "fleeting", None)[1] != {}
    roundtrip(broker.port, request(LEAVE, 0, group_id="fleeting", member_id=member))
    # ... and loses them, and itself, once it has been empty for the retention time.
    wait_until(lambda: fetch_offsets(broker.port, "fleeting", None)[1] == {}, timeout=10)
    described = roundtrip(broker.port, request(DESCRIBE, 5, groups=["fleeting"],
                                               include_authorized_operations=False))  # fmt: skip
    assert described.groups[0].group_state == "Dead"


def test_offsets_sent_to_a_transaction_are_unstable_until_it_commits(port):
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "tx-g"})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "txg"})
    try:
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition("t", 2, 40)], consumer.consumer_group_metadata(), 30
        )
        error, got = fetch_offsets(port, "txg", {"t": [2]}, version=7, require_stable=True)
        assert (error, got[("t", 2)]) == (NONE, (-1, -1, "", UNSTABLE))
        # Without require_stable: the last committed offset (none yet), no error.
        assert fetch_offsets(port, "txg", {"t": [2]}, version=7)[1][("t", 2)] == (-1, -1, "", NONE)
        producer.commit_transaction(30)
        assert fetch_offsets(port, "txg", {"t": [2]}, version=9)[1][("t", 2)][:2] == (40, -1)
    finally:
        consumer.close()
