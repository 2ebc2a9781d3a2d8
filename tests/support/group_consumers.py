"""Real consumers in one group, each in its own thread, reporting to a shared `Tracker`.

Every runner subscribes with a rebalance listener, processes what it polls (records it in
the tracker), commits the processed offsets synchronously after every poll and commits
again for partitions it is about to give up -- "commits after processing", so that with
a correct coordinator every record is processed exactly once across the group.

Runners: kafka-python and aiokafka (eager rebalancing, range assignor by default) and
confluent-kafka (librdkafka; cooperative-sticky unless told otherwise).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tracker:
    """Who owns which partition, what was processed, and what went wrong."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    owners: dict[int, str] = field(default_factory=dict)
    processed: list[tuple[str, int, int, bytes]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    # Failed commits: the runner keeps the offsets and commits them again later.
    commit_failures: list[str] = field(default_factory=list)
    assignments: dict[str, int] = field(default_factory=dict)  # assignments received
    processed_at: list[tuple[str, float]] = field(default_factory=list)  # (name, monotonic)
    revocations: list[tuple[str, int, float]] = field(default_factory=list)  # (name, p, when)

    def assigned(self, name: str, partitions: list[int]) -> None:
        with self.lock:
            self.assignments[name] = self.assignments.get(name, 0) + 1
            for p in partitions:
                owner = self.owners.get(p)
                if owner is not None and owner != name:
                    self.violations.append(f"{name} got partition {p} still owned by {owner}")
                self.owners[p] = name

    def revoked(self, name: str, partitions: list[int]) -> None:
        with self.lock:
            now = time.monotonic()
            self.revocations.extend((name, p, now) for p in partitions)
            for p in partitions:
                if self.owners.get(p) == name:
                    del self.owners[p]

    def record(self, name: str, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            if self.owners.get(partition) != name:
                self.violations.append(f"{name} processed partition {partition} it does not own")
            self.processed.append((name, partition, offset, value))
            self.processed_at.append((name, time.monotonic()))

    def revoked_between(self, name: str, start: float, end: float) -> set[int]:
        with self.lock:
            return {p for n, p, t in self.revocations if n == name and start <= t <= end}

    def longest_pause(self, name: str, start: float, end: float) -> float:
        """The longest time within [start, end] in which `name` processed nothing."""
        with self.lock:
            times = [t for n, t in self.processed_at if n == name and start <= t <= end]
        edges = [start, *times, end]
        return max(b - a for a, b in zip(edges, edges[1:], strict=False))

    def owned_by(self) -> dict[str, set[int]]:
        with self.lock:
            out: dict[str, set[int]] = {}
            for p, name in self.owners.items():
                out.setdefault(name, set()).add(p)
            return out

    def values(self) -> list[bytes]:
        with self.lock:
            return [v for _n, _p, _o, v in self.processed]


class Runner(threading.Thread):
    """One consumer; `stop()` makes it commit, give up its partitions and close."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        group: str,
        topic: str,
        tracker: Tracker,
        *,
        session_ms: int = 6000,
        instance_id: str | None = None,
        leave_on_close: bool = True,
        poll_delay: float = 0.0,
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.tracker = tracker
        self.session_ms = session_ms
        self.instance_id = instance_id
        self.leave_on_close = leave_on_close
        self.poll_delay = poll_delay
        self.settings = settings or {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.next_offsets: dict[int, int] = {}  # processed, not yet committed

    def stop(self, timeout: float = 30) -> None:
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        try:
            self.consume()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def consume(self) -> None:
        raise NotImplementedError


class KafkaPythonRunner(Runner):
    def consume(self) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        from kafka.structs import OffsetAndMetadata

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.name,
            group_instance_id=self.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_ms,
            heartbeat_interval_ms=300,
            max_poll_records=20,
            **self.settings,
        )
        runner = self

        def commit(partitions: list[int] | None = None) -> None:
            todo = {
                p: o
                for p, o in runner.next_offsets.items()
                if partitions is None or p in partitions
            }
            if not todo:
                return
            try:
                consumer.commit(
                    {
                        TopicPartition(runner.topic, p): OffsetAndMetadata(o, "", -1)
                        for p, o in todo.items()
                    }
                )
                for p in todo:
                    runner.next_offsets.pop(p, None)
            except Exception as exc:
                runner.tracker.commit_failures.append(f"{runner.name}: {exc!r}")

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
                parts = [tp.partition for tp in revoked]
                commit(parts)
                runner.tracker.revoked(runner.name, parts)

            def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
                runner.tracker.assigned(runner.name, [tp.partition for tp in assigned])

        consumer.subscribe([self.topic], listener=Listener())
        try:
            while not self.stopping.is_set():
                for tp, records in consumer.poll(timeout_ms=100).items():
                    for r in records:
                        self.tracker.record(self.name, tp.partition, r.offset, r.value)
                        self.next_offsets[tp.partition] = r.offset + 1
                commit()
                time.sleep(self.poll_delay)
            commit()
            self.tracker.revoked(self.name, [tp.partition for tp in consumer.assignment()])
        finally:
            if self.leave_on_close:
                consumer.close()
            else:
                consumer.close(autocommit=False)


class ConfluentRunner(Runner):
    def config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": self.name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": self.session_ms,
            "heartbeat.interval.ms": 300,
            "partition.assignment.strategy": "cooperative-sticky",
            "topic.metadata.refresh.interval.ms": 1000,
            "reconnect.backoff.max.ms": 500,
            **self.settings,
        }

    def subscription(self) -> list[str]:
        return [self.topic]

    def consume(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        config = self.config()
        if self.instance_id is not None:
            config["group.instance.id"] = self.instance_id
        consumer = Consumer(config)
        runner = self

        def commit(partitions: list[int] | None = None) -> None:
            todo = {
                p: o
                for p, o in runner.next_offsets.items()
                if partitions is None or p in partitions
            }
            if not todo:
                return
            try:
                consumer.commit(
                    offsets=[TopicPartition(runner.topic, p, o) for p, o in todo.items()],
                    asynchronous=False,
                )
                for p in todo:
                    runner.next_offsets.pop(p, None)
            except KafkaException as exc:
                runner.tracker.commit_failures.append(f"{runner.name}: {exc!r}")

        # The client (incrementally, for cooperative-sticky) assigns and unassigns itself
        # after these callbacks.
        def on_assign(c: Any, partitions: list[Any]) -> None:
            runner.tracker.assigned(runner.name, [tp.partition for tp in partitions])

        def on_revoke(c: Any, partitions: list[Any]) -> None:
            parts = [tp.partition for tp in partitions]
            commit(parts)
            runner.tracker.revoked(runner.name, parts)

        def on_lost(c: Any, partitions: list[Any]) -> None:
            runner.tracker.commit_failures.append(f"{runner.name}: lost {partitions}")
            runner.tracker.revoked(runner.name, [tp.partition for tp in partitions])

        consumer.subscribe(
            self.subscription(), on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost
        )
        try:
            while not self.stopping.is_set():
                for msg in consumer.consume(num_messages=20, timeout=0.1):
                    if msg.error() is not None:
                        continue
                    self.tracker.record(self.name, msg.partition(), msg.offset(), msg.value())
                    self.next_offsets[msg.partition()] = msg.offset() + 1
                commit()
                time.sleep(self.poll_delay)
            commit()
            self.tracker.revoked(self.name, [tp.partition for tp in consumer.assignment()])
        finally:
            consumer.close()


class ConfluentConsumerProtocolRunner(ConfluentRunner):
    """confluent-kafka with `group.protocol=consumer` (KIP-848): the coordinator assigns;
    the session and heartbeat settings are the broker's."""

    def config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": self.name,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
            "reconnect.backoff.max.ms": 500,
            **self.settings,
        }


class AiokafkaRunner(Runner):
    def consume(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.abc import ConsumerRebalanceListener
        from aiokafka.structs import OffsetAndMetadata

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.name,
            group_instance_id=self.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_ms,
            heartbeat_interval_ms=300,
            max_poll_records=20,
            **self.settings,
        )
        runner = self

        async def commit(partitions: list[int] | None = None) -> None:
            todo = {
                p: o
                for p, o in runner.next_offsets.items()
                if partitions is None or p in partitions
            }
            if not todo:
                return
            try:
                await consumer.commit(
                    {
                        TopicPartition(runner.topic, p): OffsetAndMetadata(o, "")
                        for p, o in todo.items()
                    }
                )
                for p in todo:
                    runner.next_offsets.pop(p, None)
            except Exception as exc:
                runner.tracker.commit_failures.append(f"{runner.name}: {exc!r}")

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
                parts = [tp.partition for tp in revoked]
                await commit(parts)
                runner.tracker.revoked(runner.name, parts)

            async def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
                runner.tracker.assigned(runner.name, [tp.partition for tp in assigned])

        await consumer.start()
        consumer.subscribe([self.topic], listener=Listener())
        try:
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=100, max_records=20)
                for tp, records in batches.items():
                    for r in records:
                        self.tracker.record(self.name, tp.partition, r.offset, r.value)
                        self.next_offsets[tp.partition] = r.offset + 1
                await commit()
                await asyncio.sleep(self.poll_delay)
            await commit()
            self.tracker.revoked(self.name, [tp.partition for tp in consumer.assignment()])
        finally:
            await consumer.stop()


RUNNERS: dict[str, type[Runner]] = {
    "kafka-python": KafkaPythonRunner,
    "confluent-kafka": ConfluentRunner,
    "aiokafka": AiokafkaRunner,
}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class BackgroundProducer(threading.Thread):
    """Produces numbered records round-robin over the partitions until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float = 200.0) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.stopping = threading.Event()
        self.acked: list[bytes] = []
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Producer

        # Idempotent: a produce retried after an agent's kill -9 (its commit landed, its
        # answer lost) is not written twice, so a value seen twice is the consumers' doing.
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "acks": "all",
                "enable.idempotence": True,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked.append(msg.value())

        i = 0
        start = time.monotonic()
        while not self.stopping.is_set():
            producer.produce(self.topic, value=b"r%06d" % i, partition=i % self.partitions,
                             on_delivery=delivered)  # fmt: skip
            i += 1
            producer.poll(0)
            lag = i / self.rate - (time.monotonic() - start)
            if lag > 0:
                time.sleep(lag)
        producer.flush(30)

    def finish(self) -> list[bytes]:
        self.stopping.set()
        self.join(60)
        assert not self.errors, self.errors[:5]
        return list(self.acked)
