"""`bucketlog serve --agents N` keeps its agents running.

A dead agent is restarted on its own port while the others keep serving; with
--on-agent-exit stop, one dead agent stops them all; SIGTERM stops every agent within the
grace. The agents are real processes, found by their parent and command line in /proc.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.e2e.rawclient import ensure_topic, produce_raw
from tests.support.brokerproc import BrokerProcess, free_ports, pid_alive, wait_for_port

pytestmark = [pytest.mark.store_independent, pytest.mark.serial]

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 10.0) -> T:
    """Poll `check` until it returns something other than None or False."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def restarted_pid(broker: BrokerProcess, port: int, old_pid: int) -> int | None:
    pid = broker.agent_pids().get(port)
    return pid if pid is not None and pid != old_pid else None


def log_lines(broker: BrokerProcess, *words: str) -> list[str]:
    return [line for line in broker.log_text().splitlines() if all(w in line for w in words)]


def produce_and_consume_through(port: int, topic: str, count: int) -> None:
    """confluent-kafka bootstrapped on `port`, on the partition the agent at `port` leads."""
    ensure_topic(port, topic)
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
    md = producer.list_topics(topic, timeout=10)
    port_of = {b.id: b.port for b in md.brokers.values()}
    led = [p.id for p in md.topics[topic].partitions.values() if port_of[p.leader] == port]
    assert led, f"no partition of {topic} is led by the agent on {port}"
    errors = []
    for i in range(count):
        producer.produce(
            topic,
            value=b"v%d" % i,
            partition=led[0],
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(10) == 0
    assert errors == []
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "s", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, led[0], 0)])
    got = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [b"v%d" % i for i in range(count)]


def test_killed_middle_agent_is_restarted_on_its_port(start_broker):
    # Three partitions over three live agents: each agent leads exactly one.
    broker = start_broker(agents=3, extra_args=["--default-partitions", "3"])
    first, middle, last = broker.ports
    before = broker.agent_pids()
    assert sorted(before) == broker.ports

    killed_at = time.monotonic()
    os.kill(before[middle], signal.SIGKILL)
    new_pid = wait_for(
        "a new agent process on the middle port",
        lambda: restarted_pid(broker, middle, before[middle]),
    )
    wait_for_port(middle, timeout=10)
    print(f"restarted and listening {time.monotonic() - killed_at:.2f} s after SIGKILL")

    assert broker.proc.poll() is None
    after = broker.agent_pids()
    assert after == {first: before[first], middle: new_pid, last: before[last]}
    produce_and_consume_through(middle, "after-restart", 10)
    lines = log_lines(broker, f"pid {before[middle]}", "SIGKILL")
    assert len(lines) == 1 and f"port {middle}" in lines[0], lines

    # The restarted agent stops with the others, cleanly.
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(15) == 0
    assert not any(pid_alive(pid) for pid in after.values())


def test_the_others_keep_serving_while_the_first_agent_is_restarted(start_broker):
    broker = start_broker(agents=3)
    first, *others = broker.ports
    before = broker.agent_pids()

    os.kill(before[first], signal.SIGKILL)
    # Right after the kill (the restart waits a back-off, then the agent starts up), each
    # other agent answers a Metadata and a Produce round trip.
    offsets = [produce_raw(port, "outage", 0, [(None, b"from %d" % port)]) for port in others]
    assert offsets == [0, 1]

    new_pid = wait_for(
        "a new agent process on the first port",
        lambda: restarted_pid(broker, first, before[first]),
    )
    wait_for_port(first, timeout=10)
    assert broker.proc.poll() is None
    assert broker.agent_pids() == {first: new_pid, **{p: before[p] for p in others}}
    assert produce_raw(first, "outage", 0, [(None, b"after")]) == 2


def test_on_agent_exit_stop_stops_every_agent(start_broker):
    # Set the way a container would: in the environment.
    broker = start_broker(agents=3, env={"BUCKETLOG_ON_AGENT_EXIT": "stop"})
    pids = broker.agent_pids()
    middle = broker.ports[1]

    os.kill(pids[middle], signal.SIGKILL)
    assert broker.proc.wait(10) == 1  # not a clean stop: an agent died
    assert not any(pid_alive(pid) for pid in pids.values())
    lines = log_lines(broker, f"pid {pids[middle]}", "SIGKILL")
    assert len(lines) == 1 and f"port {middle}" in lines[0], lines


def test_agents_stop_when_the_supervisor_is_killed(start_broker):
    broker = start_broker(agents=2)
    pids = broker.agent_pids()
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(10)
    wait_for("every agent gone", lambda: not any(pid_alive(pid) for pid in pids.values()))


def test_sigterm_stops_every_agent_within_the_grace(start_broker):
    grace_s = 2.0
    broker = start_broker(agents=3, env={"BUCKETLOG_AGENT_STOP_GRACE_MS": str(int(grace_s * 1000))})
    pids = broker.agent_pids()
    stuck = pids[broker.ports[1]]
    os.kill(stuck, signal.SIGSTOP)  # it cannot act on SIGTERM, only die of SIGKILL
    try:
        sent_at = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        code = broker.proc.wait(grace_s + 8)
        took = time.monotonic() - sent_at
        print(f"supervisor exited {took:.2f} s after SIGTERM (grace {grace_s} s)")
        assert code == 1  # not a clean stop: one agent had to be killed
        assert grace_s <= took
        assert not any(pid_alive(pid) for pid in pids.values())
        lines = log_lines(broker, f"pid {stuck}", "SIGKILL")
        assert len(lines) == 1 and f"port {broker.ports[1]}" in lines[0], lines
    finally:
        if pid_alive(stuck):
            os.kill(stuck, signal.SIGKILL)


def test_an_agent_deregisters_when_sigterm_comes_again_while_it_stops(start_broker, tmp_path):
    # A terminal's Ctrl-C (or systemd's SIGTERM) reaches the supervisor and every agent,
    # and the supervisor forwards SIGTERM: an agent may get it again while it stops.
    # Two single agents on the same stores: one watches the other leave.
    data_dir = tmp_path / "shared"
    watcher = start_broker(data_dir=data_dir)
    leaving = start_broker(data_dir=data_dir, port=free_ports(1)[0])
    admin = AdminClient({"bootstrap.servers": watcher.bootstrap})
    ports = {b.port for b in admin.list_topics(timeout=10).brokers.values()}
    assert ports == {watcher.port, leaving.port}

    deadline = time.monotonic() + 10
    while leaving.proc.poll() is None and time.monotonic() < deadline:
        leaving.proc.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    # Killed by a later SIGTERM once its clean-up is over, or exited by itself.
    assert leaving.proc.wait(5) in (0, -signal.SIGTERM)
    # Deregistered: gone at once, not when its lease runs out (2.5 s).
    ports = {b.port for b in admin.list_topics(timeout=10).brokers.values()}
    assert ports == {watcher.port}
