"""Transactions across the death of the agent coordinating them (issue #17, defect 1).

Two agents share the stores; a test-only fault point kills an agent right after the
metadata commit of an InitProducerId or EndTxn, before it answers: the client asks again,
the other agent (or the restarted one) answers. Apache Kafka's coordinator, reloading the
transaction state on a new broker, answers such a retry with what the first attempt did:
the completed outcome of an EndTxn, the bumped epoch of an InitProducerId (KIP-360: an
expected epoch equal to the last epoch is a retry) — never a fatal error.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from broker import faults
from broker.placement import coordinator_for
from broker.transactions import (
    ADD_PARTITIONS_AFTER_COMMIT,
    ADD_PARTITIONS_BEFORE_COMMIT,
    END_AFTER_COMMIT,
    INIT_AFTER_COMMIT,
)
from protocol.records import build_batch
from tests.e2e.rawclient import ensure_topic
from tests.e2e.wire import ConnectionClosed, WireClient, request
from tests.support.brokerproc import BrokerProcess, free_ports, wait_for_port

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 0, 22, 24, 26


@dataclass
class Agents:
    """Two agents of one broker; `faulty` has a fault point armed until it fires, then is
    started again without it (as the chaos harness restarts a killed agent)."""

    faulty: BrokerProcess
    healthy: BrokerProcess
    died: threading.Event

    @property
    def bootstrap(self) -> str:
        return f"{self.faulty.bootstrap},{self.healthy.bootstrap}"

    def coordinated_id(self, prefix: str) -> str:
        """A transactional id the faulty agent coordinates (broker.placement)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        brokers = admin.list_topics(timeout=10).brokers.values()
        live = [SimpleNamespace(node_id=b.id, port=b.port) for b in brokers]
        assert len(live) == 2, live
        for i in range(1000):
            tid = f"{prefix}-{uuid.uuid4().hex[:6]}-{i}"
            if coordinator_for(tid, live).port == self.faulty.port:
                return tid
        raise AssertionError("no transactional id lands on the faulty agent")


@pytest.fixture
def faulty_agents(tmp_path) -> Iterator[Callable[[str], Agents]]:
    started: list[BrokerProcess] = []
    watchers: list[threading.Thread] = []
    ending = threading.Event()  # the test is over: a restart under way may be stopped

    def start(point: str) -> Agents:
        first, second = free_ports(2)
        faulty = BrokerProcess(tmp_path / "data", first, env={faults.ENV: point})
        healthy = BrokerProcess(tmp_path / "data", second)
        started.extend([faulty.start(), healthy.start()])
        died = threading.Event()

        def restart_without_the_fault() -> None:
            assert faulty.proc is not None
            if faulty.proc.wait() != -signal.SIGKILL:
                return  # stopped at the end of the test
            died.set()
            faulty.env = {}
            try:
                faulty.start()
            except RuntimeError:
                if not ending.is_set():
                    raise

        watcher = threading.Thread(target=restart_without_the_fault, daemon=True)
        watcher.start()
        watchers.append(watcher)
        return Agents(faulty, healthy, died)

    yield start
    ending.set()
    for broker in started:
        broker.stop()
    for watcher in watchers:
        watcher.join(30)
    for broker in started:  # one a watcher started again meanwhile
        broker.stop()


def init_producer_id(client: WireClient, tid: str, pid: int = -1, epoch: int = -1) -> tuple:
    """(error, producer id, epoch) of InitProducerId v4 naming (pid, epoch)."""
    answer = client.call(init_request(tid, pid, epoch))
    return answer.error_code, answer.producer_id, answer.producer_epoch


def init_request(tid: str, pid: int, epoch: int):
    return request(
        INIT_PRODUCER_ID,
        4,
        transactional_id=tid,
        transaction_timeout=60_000,
        producer_id=pid,
        producer_epoch=epoch,
    )


def end_txn(tid: str, pid: int, epoch: int, commit: bool):
    return request(
        END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit
    )


def open_transaction(client: WireClient, tid: str, pid: int, epoch: int, topic: str) -> None:
    """AddPartitionsToTxn for partition 0, then one transactional record there."""
    added = client.call(
        request(
            ADD_PARTITIONS_TO_TXN,
            3,
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[{"name": topic, "partitions": [0]}],
        )
    )
    (result,) = added.results_by_topic_v3_and_below[0].results_by_partition
    assert result.partition_error_code == ErrorCode.none
    batch = build_batch(
        [(None, b"in-the-transaction", [], int(time.time() * 1000))],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional=True,
    )
    produced = client.call(
        request(
            PRODUCE,
            9,
            transactional_id=tid,
            acks=-1,
            timeout=30_000,
            topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
        )
    )
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none


def answer_lost(client: WireClient, entity) -> None:
    """Send a request whose agent dies (the fault point) before answering."""
    correlation_id = client.send(entity)
    with pytest.raises(ConnectionClosed):
        client.receive(correlation_id, timeout=30)


def read_values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Partition 0's values up to its end for the isolation level."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return values
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    raise TimeoutError(f"{topic}: no end of partition 0 in 30 s")


def end_offset(bootstrap: str, topic: str, isolation: str) -> int:
    """Partition 0's end for the isolation level: its last stable offset, or its high
    watermark."""
    deadline = time.monotonic() + 30
    while True:  # a new consumer each time: its metadata may name a dead agent leader
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": isolation}
        )
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            consumer.close()


def test_an_epoch_bump_retried_after_its_agent_died_gets_the_bumped_epoch(start_broker):
    """KIP-360: a producer recovering from an abortable error bumps its epoch with
    InitProducerId naming its (id, epoch). If the bump committed but the answer was lost,
    the retry must get the bumped epoch, not PRODUCER_FENCED (fatal for the client)."""
    broker = start_broker(agents=2, env={faults.ENV: f"{INIT_AFTER_COMMIT}@2"})
    first, second = broker.ports
    tid = f"bump-{uuid.uuid4().hex[:8]}"
    with WireClient(f"127.0.0.1:{first}") as client:
        code, pid, epoch = init_producer_id(client, tid)
        assert (code, epoch) == (ErrorCode.none, 0)
        answer_lost(client, init_request(tid, pid, 0))  # committed: epoch 1
    with WireClient(f"127.0.0.1:{second}") as client:
        assert init_producer_id(client, tid, pid, 0) == (ErrorCode.none, pid, 1)
    wait_for_port(first)  # restarted by the supervisor; its fault point counts afresh
    with WireClient(f"127.0.0.1:{first}") as client:
        assert init_producer_id(client, tid, pid, 1) == (ErrorCode.none, pid, 2)
        # Only the epoch just bumped from is a retry; an older one is fenced.
        assert init_producer_id(client, tid, pid, 0)[0] == ErrorCode.producer_fenced
        # A new instance of the id (no expected epoch) fences the producer (epoch 3; this
        # agent dies too before answering) ...
        answer_lost(client, init_request(tid, -1, -1))
    with WireClient(f"127.0.0.1:{second}") as client:
        # ... which then can no longer pass for a retry of its last bump.
        assert init_producer_id(client, tid, pid, 2)[0] == ErrorCode.producer_fenced


def test_an_end_txn_retried_after_its_agent_died_gets_the_completed_outcome(start_broker):
    broker = start_broker(agents=2, env={faults.ENV: f"{END_AFTER_COMMIT}@1"})
    first, second = broker.ports
    topic, tid = f"end-retried-{uuid.uuid4().hex[:6]}", f"end-{uuid.uuid4().hex[:8]}"
    ensure_topic(first, topic)
    with WireClient(f"127.0.0.1:{first}") as client:
        code, pid, epoch = init_producer_id(client, tid)
        assert code == ErrorCode.none
        open_transaction(client, tid, pid, epoch, topic)
        answer_lost(client, end_txn(tid, pid, epoch, commit=True))
    with WireClient(f"127.0.0.1:{second}") as client:
        assert client.call(end_txn(tid, pid, epoch, commit=True)).error_code == ErrorCode.none
        # As Kafka: the other outcome of a completed transaction is not a retry.
        answer = client.call(end_txn(tid, pid, epoch, commit=False))
        assert answer.error_code == ErrorCode.invalid_txn_state
    assert read_values(f"127.0.0.1:{second}", topic, "read_committed") == [b"in-the-transaction"]


def test_a_new_instance_whose_abort_of_the_open_transaction_died_midway_starts(start_broker):
    """InitProducerId while the previous instance's transaction is open aborts it first;
    the agent doing so dies right after the abort's commit, the new instance asks another
    agent: it gets an epoch that fences the old instance, and the transaction stays
    aborted (nothing of it visible to read_committed, the partition not held open)."""
    broker = start_broker(agents=2, env={faults.ENV: f"{END_AFTER_COMMIT}@1"})
    first, second = broker.ports
    topic, tid = f"reinit-{uuid.uuid4().hex[:6]}", f"reinit-{uuid.uuid4().hex[:8]}"
    ensure_topic(first, topic)
    with WireClient(f"127.0.0.1:{first}") as old:
        code, pid, epoch = init_producer_id(old, tid)
        assert code == ErrorCode.none
        open_transaction(old, tid, pid, epoch, topic)
        with WireClient(f"127.0.0.1:{second}") as dying:
            answer_lost(dying, init_request(tid, -1, -1))  # aborted, then died
        code, new_pid, new_epoch = init_producer_id(old, tid)
        assert (code, new_pid) == (ErrorCode.none, pid) and new_epoch > epoch
        fenced = old.call(end_txn(tid, pid, epoch, commit=True))
        assert fenced.error_code == ErrorCode.producer_fenced
    bootstrap = f"127.0.0.1:{first}"
    assert read_values(bootstrap, topic, "read_uncommitted") == [b"in-the-transaction"]
    assert read_values(bootstrap, topic, "read_committed") == []
    # The record and its abort marker: nothing left open.
    assert end_offset(bootstrap, topic, "read_committed") == 2
    assert end_offset(bootstrap, topic, "read_uncommitted") == 2


def test_a_producer_rides_out_its_coordinators_death_during_an_epoch_bump(faulty_agents):
    """confluent-kafka with a 1 ms message timeout: its records time out in flight, the
    transaction must abort and the epoch be bumped (KIP-360); the coordinator dies right
    after committing the bump and the client asks again. Apache Kafka answers the retry
    with the bumped epoch; the producer aborts and goes on, with no fatal error."""
    agents = faulty_agents(f"{INIT_AFTER_COMMIT}@2")  # the first InitProducerId passes
    topic = f"bump-client-{uuid.uuid4().hex[:6]}"
    ensure_topic(agents.healthy.port, topic)
    producer = Producer(
        {
            "bootstrap.servers": agents.bootstrap,
            "transactional.id": agents.coordinated_id("bump-client"),
            "message.timeout.ms": 1,
            "linger.ms": 0,
            "log_level": 0,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.flush(10)
    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction(30)
    assert failed.value.args[0].txn_requires_abort(), failed.value.args[0]
    producer.abort_transaction(60)  # fatal (PRODUCER_FENCED) when the retry is not known
    assert agents.died.is_set(), "the coordinator did not die bumping the epoch"
    producer.begin_transaction()
    producer.abort_transaction(30)


def test_an_abort_of_a_transaction_that_registered_nothing_is_answered_without_error(
    start_broker,
):
    """librdkafka sends EndTxn(abort) when an AddPartitionsToTxn of the transaction failed
    on the way (it cannot know whether the coordinator got it). If it did not, the id has
    no transaction open: Kafka's transaction version 1 answers INVALID_TXN_STATE, fatal
    for the client (librdkafka#4849); version 2 answers an abort in that state without
    error, as here. Only right after InitProducerId: after a commit, an abort may be the
    committed transaction's (its client gave up waiting) and must not be told otherwise."""
    broker = start_broker()
    topic, tid = f"abort-nothing-{uuid.uuid4().hex[:6]}", f"nothing-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.port, topic)
    with WireClient(broker.bootstrap) as client:
        code, pid, epoch = init_producer_id(client, tid)
        assert code == ErrorCode.none
        assert client.call(end_txn(tid, pid, epoch, commit=False)).error_code == ErrorCode.none
        assert (
            client.call(end_txn(tid, pid, epoch, commit=True)).error_code
            == ErrorCode.invalid_txn_state
        )
        open_transaction(client, tid, pid, epoch, topic)
        assert client.call(end_txn(tid, pid, epoch, commit=True)).error_code == ErrorCode.none
        assert (
            client.call(end_txn(tid, pid, epoch, commit=False)).error_code
            == ErrorCode.invalid_txn_state
        )


def test_a_producer_aborts_after_its_add_partitions_died_with_the_coordinator(faulty_agents):
    """The coordinator dies on receiving the first AddPartitionsToTxn, before acting on
    it; the application aborts the transaction (librdkafka then sends EndTxn(abort), not
    knowing whether the partitions were added): no fatal error, and the producer goes on
    to commit its next transaction."""
    agents = faulty_agents(f"{ADD_PARTITIONS_BEFORE_COMMIT}@1")
    topic = f"lost-add-{uuid.uuid4().hex[:6]}"
    ensure_topic(agents.healthy.port, topic)
    producer = Producer(
        {
            "bootstrap.servers": agents.bootstrap,
            "transactional.id": agents.coordinated_id("lost-add"),
            "log_level": 0,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    deadline = time.monotonic() + 30
    while not agents.died.is_set():
        assert time.monotonic() < deadline, "the coordinator did not die on AddPartitionsToTxn"
        producer.poll(0.05)
    producer.abort_transaction(60)  # fatal (INVALID_TXN_STATE) if the abort is refused
    producer.begin_transaction()
    producer.produce(topic, value=b"committed", partition=0)
    producer.commit_transaction(60)
    assert read_values(agents.healthy.bootstrap, topic, "read_committed") == [b"committed"]


def test_a_producer_rides_out_a_lost_answer_to_add_partitions(faulty_agents):
    """The coordinator dies right after adding the partitions, before answering: the
    client asks again, the partitions are already there, the transaction commits."""
    agents = faulty_agents(f"{ADD_PARTITIONS_AFTER_COMMIT}@1")
    topic = f"add-retried-{uuid.uuid4().hex[:6]}"
    ensure_topic(agents.healthy.port, topic)
    producer = Producer(
        {
            "bootstrap.servers": agents.bootstrap,
            "transactional.id": agents.coordinated_id("add-retried"),
            "log_level": 0,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.commit_transaction(60)
    assert agents.died.is_set(), "the coordinator did not die adding the partitions"
    assert read_values(agents.healthy.bootstrap, topic, "read_committed") == [b"0", b"1", b"2"]


def test_a_transaction_outliving_its_timeout_is_aborted_by_the_next_coordinator(tmp_path):
    """The agent coordinating a transactional id dies (for good) while the id's transaction
    is open; once its lease is out, the other agent coordinates the id and aborts the
    transaction at its timeout, fencing its producer: nothing of it is visible, and the
    partition is not held open."""
    first, second = free_ports(2)
    agents = Agents(
        BrokerProcess(tmp_path / "data", first).start(),
        BrokerProcess(tmp_path / "data", second).start(),
        threading.Event(),
    )
    try:
        topic = f"timed-out-{uuid.uuid4().hex[:6]}"
        ensure_topic(second, topic)
        tid = agents.coordinated_id("timed-out")
        with WireClient(agents.healthy.bootstrap) as client:
            answer = client.call(
                request(
                    INIT_PRODUCER_ID,
                    4,
                    transactional_id=tid,
                    transaction_timeout=1500,
                    producer_id=-1,
                    producer_epoch=-1,
                )
            )
            pid, epoch = answer.producer_id, answer.producer_epoch
            open_transaction(client, tid, pid, epoch, topic)
            agents.faulty.kill9()  # before the timeout: the survivor must abort it
            bootstrap = agents.healthy.bootstrap
            deadline = time.monotonic() + 30
            while end_offset(bootstrap, topic, "read_committed") < 2:
                assert time.monotonic() < deadline, "the transaction stayed open"
                time.sleep(0.2)
            assert end_offset(bootstrap, topic, "read_uncommitted") == 2  # record, marker
            assert read_values(bootstrap, topic, "read_committed") == []
            fenced = client.call(end_txn(tid, pid, epoch, commit=True))
            assert fenced.error_code == ErrorCode.producer_fenced
    finally:
        agents.healthy.stop()
