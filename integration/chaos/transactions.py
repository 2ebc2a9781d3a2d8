"""Transactions with kills: random commit/abort transactions over several partitions and a
consume-transform-produce stage while agents, most often the one coordinating a
transactional id about to end its transaction, are killed with SIGKILL; then
read_committed and read_uncommitted read-backs are checked (`txn_checker.py`).

    .venv/bin/python -m integration.chaos.transactions --transactions 5000 --producers 8 \\
        --kills 1000 --interval-s 1 --report integration/chaos/results/transactions-5000.json

1. Starts `--agents` agents (`harness.py`), or uses `--bootstrap`, and creates the input
   topic and the transform's output topic, `--partitions` partitions each.
2. Runs `--producers` confluent-kafka transactional producers in threads, each with its
   own transactional.id, until `--transactions` transactions were run in all (or
   `--seconds` passed). Each transaction writes 1 to `--max-records` records to random
   partitions, then commits or aborts (`--abort-ratio`), right after producing or after
   a flush. A record's value names its producer, transaction and sequence number. Now
   and then (`--zombie-ratio`) a producer is replaced mid-transaction by a new instance
   of its transactional id: the old one must be fenced and its transaction aborted;
   and now and then (`--abandon-ratio`) a transaction is left open by a producer with a
   short `--abandon-timeout-ms`, for its coordinator to abort. The records of the first
   `--short-timeout-producers` time out after `--short-message-timeout-ms`: when a kill
   holds them up, their transaction must abort with an epoch bump (KIP-360).
3. Runs `--transformers` consume-transform-produce stages: each consumes the input
   with read_committed in one group, writes one output record per input record
   naming it, and commits the consumed offsets with send_offsets_to_transaction. One
   whose client call hangs (librdkafka#5511: send_offsets_to_transaction waits for
   good on a group coordinator dropped from Metadata) is given up, reported, and
   replaced by a new instance of its transactional id, which fences it.
4. Kills an agent every `--interval-s` until `--kills` kills or the transactions end:
   with probability `--coordinator-kills`, the agent coordinating (broker/placement.py,
   over the agents Metadata lists) a transactional id that is about to end a
   transaction or to initialise, up to `--kill-delay-ms` after it said so; else a
   random agent.
5. Clients follow Kafka's rules for errors: a retriable error (KafkaError.retriable())
   calls the API again; one that requires an abort (txn_requires_abort()) aborts and
   goes on; a fatal one (fatal()) replaces the producer. A fatal error Apache Kafka
   would not give is an anomaly: anything but the fencing of a replaced producer, and
   INVALID_TXN_STATE to an abort when the transactional id had no transaction open
   (Kafka's transaction version 1 answers so: the checker verifies that nothing of the
   transaction reached the log, or that it had committed).
6. Once the producers stopped: waits for every partition's last stable offset to reach
   its high watermark (abandoned transactions aborted), reads the input topic back with
   both isolation levels, lets the transformers catch up and stop, reads the output
   back and the group's committed offsets, and checks: each transaction whole or
   absent, committed ones whole, no aborted record visible, each producer's order,
   read_uncommitted holding every committed record, no transaction left open, and
   every input record below the committed offsets transformed exactly once.
7. Prints a summary, writes the JSON report (`--report`), and exits 0 if nothing was
   wrong, 1 on any anomaly, 2 if the run itself failed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import random
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repository root holds our packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from broker import placement
from integration.chaos import harness, txn_checker
from integration.chaos.txn_checker import Outcome, Read, Tag, Transaction
from tests.e2e.wire import WireClient
from tests.e2e.wire import request as wire_request

SCENARIO = "transactions"

# Every client's librdkafka log goes here, nowhere (refused connections to killed agents,
# fenced zombies: expected, and many); with --client-log, librdkafka writes to the
# process's stderr, sent to that file: as it happens, even from a client blocked in a call.
CLIENT_LOG = logging.getLogger("chaos.transactions.clients")
CLIENT_LOG.addHandler(logging.NullHandler())
CLIENT_LOG.propagate = False
_log_config: dict[str, Any] = {"logger": CLIENT_LOG}


def quiet() -> dict[str, Any]:
    """The logging part of every client's configuration."""
    return dict(_log_config)


def send_client_logs_to(path: str) -> None:
    """librdkafka logs to stderr when given no logger: make stderr the file."""
    log = open(path, "ab")  # noqa: SIM115 -- stays open as the process's stderr
    os.dup2(log.fileno(), sys.stderr.fileno())
    _log_config.clear()


API_TIMEOUT_S = 30.0  # one call of a transactional API
END_DEADLINE_S = 180.0  # calling it again after retriable errors, at most this long
HUNG_S = END_DEADLINE_S + 60  # a client thread not done by then is stuck in librdkafka
HUNG_CALL_S = API_TIMEOUT_S + 30  # a call with that timeout still running: stuck
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def classify(error: KafkaError) -> str:
    """How Kafka's clients are told to handle an error of a transactional API."""
    if error.fatal():
        return "fatal"
    if error.txn_requires_abort():
        return "abortable"
    if error.retriable():
        return "retriable"
    return "other"


class ClientFatal(Exception):
    """A producer instance can go no further: replace it."""

    def __init__(self, error: KafkaError, commit_asked: bool, aborting: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.commit_asked = commit_asked  # the transaction may have committed
        self.aborting = aborting

    @property
    def abort_refused(self) -> bool:
        """INVALID_TXN_STATE to an abort: what Kafka (transaction version 1) answers when
        the id has no transaction open, which the checker verifies (txn_checker)."""
        return self.aborting and self.error.code() == KafkaError.INVALID_TXN_STATE


class Tally:
    """The errors the clients saw, and the transactions they ran, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: Counter[str] = Counter()  # "kind name" -> count
        self.unexpected: list[str] = []  # errors Kafka would not give: anomalies
        self.transactions: dict[str, list[Transaction]] = {}  # topic -> transactions
        self.refused_aborts: dict[str, list[tuple[str, int]]] = {}  # topic -> (producer, txn)

    def error(self, who: str, kind: str, error: KafkaError, expected: bool = True) -> None:
        with self.lock:
            self.errors[f"{kind} {error.name()}"] += 1
            if not expected:
                self.unexpected.append(f"{who}: {kind} {error.name()}: {error.str()}")

    def anomaly(self, who: str, what: str) -> None:
        with self.lock:
            self.unexpected.append(f"{who}: {what}")

    def transaction(self, topic: str, txn: Transaction) -> None:
        with self.lock:
            self.transactions.setdefault(topic, []).append(txn)

    def fatal(self, who: str, topic: str, txn: int, fatal: ClientFatal) -> None:
        """A fatal error ending a transaction: unexpected, unless an abort refused (then
        the checker decides)."""
        if fatal.abort_refused:
            self.error(who, "fatal (abort refused)", fatal.error)
            with self.lock:
                self.refused_aborts.setdefault(topic, []).append((who, txn))
        else:
            self.error(who, "fatal", fatal.error, expected=False)


class Budget:
    """Transactions left to start, shared by the producers."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


@dataclass
class Settings:
    bootstrap: str
    topic: str
    out_topic: str
    partitions: int
    max_records: int
    value_bytes: int
    abort_ratio: float
    zombie_ratio: float
    abandon_ratio: float
    abandon_timeout_ms: int
    transaction_timeout_ms: int
    short_timeout_producers: int
    short_message_timeout_ms: int
    client_log_level: int
    client_debug: str


def client_config(settings: Settings) -> dict[str, Any]:
    """What every client of the run is configured with."""
    config = {
        "bootstrap.servers": settings.bootstrap,
        "log_level": settings.client_log_level,
        **quiet(),
    }
    if settings.client_debug:
        config["debug"] = settings.client_debug
    return config


def producer_config(settings: Settings, tid: str, timeout_ms: int) -> dict[str, Any]:
    return {
        **client_config(settings),
        "transactional.id": tid,
        "transaction.timeout.ms": timeout_ms,
        "linger.ms": 2,
        # Ride out the kills: reconnect within a second.
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 1000,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 1000,
        "client.id": f"chaos-{tid}",
    }


class Abandoned(Exception):
    """The thread's client was given up for hung: it must do nothing more."""


class TransactionalClient(threading.Thread):
    """What every transactional client here does: initialise a producer, end a
    transaction the way Kafka's clients are told to."""

    def __init__(
        self, name: str, tid: str, settings: Settings, tally: Tally, hints: queue.Queue[str]
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.client_name = name
        self.tid = tid
        self.settings = settings
        self.tally = tally
        self.hints = hints
        self.stopping = threading.Event()
        self.failure: str | None = None  # the thread itself failed: the run fails
        self.next_txn = 0
        self.delivery_failures: Counter[str] = Counter()
        self.extra_config: dict[str, Any] = {}  # on top of producer_config
        self.in_call: tuple[str, float] | None = None  # (API, since) while in a call
        self.given_up = threading.Event()  # given up for hung: do nothing more
        self.hung_in: str | None = None
        # The transaction in hand: (topic, number, its records so far); whether its commit
        # was asked.
        self.current: tuple[str, int, list[tuple[int, int]]] | None = None
        self.commit_asked = False
        # Producers dropped: kept, as destroying one blocks until its threads end.
        self.retired: list[Producer] = []

    @contextlib.contextmanager
    def calling(self, api: str) -> Iterator[None]:
        """Around a client call that may block: the run can see it hang."""
        self.in_call = (api, time.monotonic())
        try:
            yield
        finally:
            self.in_call = None
        if self.given_up.is_set():
            raise Abandoned()

    def hung(self, limit_s: float) -> bool:
        call = self.in_call
        return call is not None and time.monotonic() - call[1] > limit_s

    def give_up(self) -> None:
        """Give up this client, hung in a call: the transaction in hand is logged as it
        stands (the replacement's InitProducerId aborts it, unless its commit was asked)."""
        call = self.in_call
        self.hung_in = call[0] if call else "?"
        self.given_up.set()
        if self.current is not None:
            topic, txn, records = self.current
            outcome = Outcome.UNKNOWN if self.commit_asked else Outcome.ABORTED
            self.tally.transaction(
                topic, Transaction(self.client_name, txn, outcome, tuple(records))
            )

    def begin_txn(self, topic: str, txn: int) -> list[tuple[int, int]]:
        """Note a new transaction in hand; its records list, to fill."""
        records: list[tuple[int, int]] = []
        self.current, self.commit_asked = (topic, txn, records), False
        return records

    def end_txn(self, txn: Transaction, topic: str) -> None:
        """Log the transaction in hand, ended."""
        self.current = None
        self.tally.transaction(topic, txn)

    def retire(self, producer: Producer) -> None:
        """Drop a producer instance: its last log lines served, its queue purged."""
        with self.calling("purge"):
            with contextlib.suppress(KafkaException):  # its fatal error, raised again
                producer.poll(0)
            producer.purge()
        self.retired.append(producer)

    def hint(self, tid: str) -> None:
        """Tell the killer that `tid` is about to talk to its coordinator."""
        try:
            self.hints.put_nowait(tid)
        except queue.Full:
            pass

    def delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.delivery_failures[err.name()] += 1

    def init(self, tid: str, timeout_ms: int) -> Producer:
        """A producer of `tid` with its transactions initialised."""
        deadline = time.monotonic() + END_DEADLINE_S
        while True:
            with self.calling("Producer()"):
                producer = Producer(
                    {**producer_config(self.settings, tid, timeout_ms), **self.extra_config}
                )
            while True:
                try:
                    with self.calling("init_transactions"):
                        producer.init_transactions(API_TIMEOUT_S)
                    return producer
                except KafkaException as exc:
                    error = exc.args[0]
                    kind = classify(error)
                    retry = kind == "retriable" and time.monotonic() < deadline
                    self.tally.error(self.client_name, f"init {kind}", error, expected=retry)
                    if not retry:
                        break
            self.retire(producer)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tid}: no producer initialised in {END_DEADLINE_S:g} s")

    def end(self, producer: Producer, commit: bool) -> Outcome:
        """Commit (or abort) the open transaction: again on a retriable error, abort on
        one that requires it. Raises ClientFatal."""
        deadline = time.monotonic() + END_DEADLINE_S
        commit_asked = False
        while True:
            try:
                if commit:
                    commit_asked = self.commit_asked = True
                    with self.calling("commit_transaction"):
                        producer.commit_transaction(API_TIMEOUT_S)
                    return Outcome.COMMITTED
                with self.calling("abort_transaction"):
                    producer.abort_transaction(API_TIMEOUT_S)
                return Outcome.ABORTED
            except KafkaException as exc:
                error = exc.args[0]
                kind = classify(error)
                action = "commit" if commit else "abort"
                if kind == "retriable" and time.monotonic() < deadline:
                    self.tally.error(self.client_name, f"{action} {kind}", error)
                    continue
                if kind == "abortable":
                    self.tally.error(self.client_name, f"{action} {kind}", error)
                    commit = False
                    self.hint(self.tid)  # the abort may bump the epoch (KIP-360)
                    if time.monotonic() < deadline:
                        continue
                raise ClientFatal(error, commit_asked, aborting=not commit) from exc

    def begin(self, producer: Producer) -> bool:
        """Begin a transaction; False if the producer is in no state to (Kafka never puts
        it there: an unexpected error). Raises ClientFatal."""
        try:
            with self.calling("begin_transaction"):
                producer.begin_transaction()
            return True
        except KafkaException as exc:
            error = exc.args[0]
            kind = classify(error)
            if kind == "fatal":
                raise ClientFatal(error, False) from exc
            self.tally.error(self.client_name, f"begin {kind}", error, expected=False)
            return False

    def produce(self, producer: Producer, topic: str, tag: Tag, partition: int) -> bool:
        """Hand one record to the producer; False if the transaction must abort."""
        value = txn_checker.encode_value(tag, self.settings.value_bytes)
        while True:
            try:
                producer.produce(
                    topic, value=value, partition=partition, on_delivery=self.delivered
                )
                producer.poll(0)
                return True
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                error = exc.args[0]
                kind = classify(error)
                if kind == "fatal":
                    raise ClientFatal(error, False) from exc
                self.tally.error(self.client_name, f"produce {kind}", error)
                return False

    def run(self) -> None:
        try:
            self.work()
        except Abandoned:
            pass  # given up for hung: its replacement goes on
        except Exception as exc:  # the run fails with it
            self.failure = f"{type(exc).__name__}: {exc}"

    def work(self) -> None:
        raise NotImplementedError

    def replacement(self, name: str) -> TransactionalClient:
        """A new instance of this client's transactional id, named `name`."""
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()


class RandomTransactions(TransactionalClient):
    """Random transactions over the input topic's partitions until the budget is spent."""

    def __init__(
        self,
        name: str,
        tid: str,
        settings: Settings,
        tally: Tally,
        hints: queue.Queue[str],
        budget: Budget,
        seed: int,
    ) -> None:
        super().__init__(name, tid, settings, tally, hints)
        self.budget = budget
        self.rng = random.Random(seed)
        self.kinds: Counter[str] = Counter()
        self.left_open: list[Producer] = []  # producers of abandoned transactions
        self.producer: Producer | None = None

    def replacement(self, name: str) -> RandomTransactions:
        new = RandomTransactions(
            name,
            self.tid,
            self.settings,
            self.tally,
            self.hints,
            self.budget,
            self.rng.randrange(1 << 32),
        )
        new.extra_config = dict(self.extra_config)
        return new

    def work(self) -> None:
        self.producer = self.init(self.tid, self.settings.transaction_timeout_ms)
        while not self.stopping.is_set() and self.budget.take():
            roll = self.rng.random()
            if roll < self.settings.zombie_ratio:
                self.zombie()
            elif roll < self.settings.zombie_ratio + self.settings.abandon_ratio:
                self.abandon()
            else:
                commit = self.rng.random() >= self.settings.abort_ratio
                flush = self.rng.random() < 0.5
                self.normal(commit, flush)
        self.flush(self.producer)
        self.retire(self.producer)

    def flush(self, producer: Producer) -> None:
        with self.calling("flush"):
            producer.flush(API_TIMEOUT_S)

    def write(
        self, producer: Producer, name: str, records: list[tuple[int, int]], txn: int
    ) -> bool:
        """Begin a transaction and produce its records, each noted in `records` as
        (sequence, partition); whether it may still commit."""
        if not self.begin(producer):
            return False
        for seq in range(self.rng.randint(1, self.settings.max_records)):
            partition = self.rng.randrange(self.settings.partitions)
            if not self.produce(producer, self.settings.topic, Tag(name, txn, seq), partition):
                return False
            records.append((seq, partition))
        return True

    def normal(self, commit: bool, flush: bool) -> None:
        """A transaction committed or aborted, right after producing or after a flush."""
        assert self.producer is not None
        self.kinds[f"{'commit' if commit else 'abort'}{' after flush' if flush else ''}"] += 1
        txn, self.next_txn = self.next_txn, self.next_txn + 1
        topic = self.settings.topic
        records = self.begin_txn(topic, txn)
        try:
            may_commit = self.write(self.producer, self.client_name, records, txn)
            if flush:
                self.flush(self.producer)
            self.hint(self.tid)
            outcome = self.end(self.producer, commit and may_commit)
        except ClientFatal as fatal:
            self.tally.fatal(self.client_name, topic, txn, fatal)
            outcome = Outcome.UNKNOWN if fatal.commit_asked else Outcome.ABORTED
            self.retire(self.producer)
            self.hint(self.tid)
            self.producer = self.init(self.tid, self.settings.transaction_timeout_ms)
        self.end_txn(Transaction(self.client_name, txn, outcome, tuple(records)), topic)

    def zombie(self) -> None:
        """A new instance of the transactional id starts while the old one's transaction
        is open (its records written, or half the time still on their way): the old one
        is fenced, its transaction aborted."""
        assert self.producer is not None
        self.kinds["replaced mid-transaction"] += 1
        txn, self.next_txn = self.next_txn, self.next_txn + 1
        topic = self.settings.topic
        records = self.begin_txn(topic, txn)
        old = self.producer
        try:
            self.write(old, self.client_name, records, txn)
            if self.rng.random() < 0.5:
                self.flush(old)
        except ClientFatal as fatal:
            self.tally.error(self.client_name, "fatal", fatal.error, expected=False)
        self.hint(self.tid)
        self.producer = self.init(self.tid, self.settings.transaction_timeout_ms)
        outcome = Outcome.ABORTED
        try:
            self.end(old, commit=True)
            self.tally.anomaly(self.client_name, f"transaction {txn} committed after its fencing")
            outcome = Outcome.COMMITTED
        except ClientFatal as fatal:
            fenced = fatal.error.code() in FENCED
            self.tally.error(self.client_name, "fatal (replaced)", fatal.error, expected=fenced)
        self.retire(old)
        self.end_txn(Transaction(self.client_name, txn, outcome, tuple(records)), topic)

    def abandon(self) -> None:
        """A transaction left open (its producer gone quiet): the coordinator aborts it
        after the producer's transaction timeout."""
        self.kinds["abandoned"] += 1
        name = f"{self.client_name}.a{len(self.left_open)}"
        tid = f"{self.tid}.a{len(self.left_open)}"
        producer = self.init(tid, self.settings.abandon_timeout_ms)
        self.left_open.append(producer)
        records: list[tuple[int, int]] = []
        try:
            self.write(producer, name, records, 0)
            self.flush(producer)
        except ClientFatal as fatal:
            self.tally.error(name, "fatal", fatal.error, expected=False)
        # Never ended: logged as what its coordinator must make of it.
        self.tally.transaction(
            self.settings.topic, Transaction(name, 0, Outcome.ABORTED, tuple(records))
        )

    def close_abandoned(self) -> None:
        for producer in self.left_open:
            self.retire(producer)
        self.left_open.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.client_name,
            "transactional_id": self.tid,
            "transactions": self.next_txn,
            "kinds": dict(self.kinds),
            "delivery_failures": dict(self.delivery_failures),
            "hung_in": self.hung_in,
            "failure": self.failure,
        }


class Transformer(TransactionalClient):
    """Consume-transform-produce: reads the input with read_committed in a group, writes
    one output record per input record, commits the consumed offsets in the same
    transaction; after an abort, goes back to the group's committed offsets.

    librdkafka's send_offsets_to_transaction() can block for good when the group
    coordinator it cached was dropped from Metadata (an agent killed long enough):
    librdkafka#5511, #5456. The run then gives this instance up (`hung`) and starts
    another of the same transactional id and group, which fences it."""

    def __init__(
        self,
        name: str,
        tid: str,
        group: str,
        settings: Settings,
        tally: Tally,
        hints: queue.Queue[str],
    ) -> None:
        super().__init__(name, tid, settings, tally, hints)
        self.group = group
        self.consumer_errors: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.received = 0  # input records consumed, again after a rewind too
        self.assignments = 0  # rebalances that gave this instance partitions
        self.assigned: list[int] = []  # its partitions now

    def replacement(self, name: str) -> Transformer:
        return Transformer(name, self.tid, self.group, self.settings, self.tally, self.hints)

    def work(self) -> None:
        consumer = Consumer(
            {
                **client_config(self.settings),
                "group.id": self.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                # A hung instance leaves the group soon, its partitions go to the next.
                "max.poll.interval.ms": 20_000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 1000,
                "client.id": f"chaos-{self.tid}-consumer",
            }
        )
        consumer.subscribe([self.settings.topic], on_assign=self._assigned, on_revoke=self._revoked)
        producer = self.init(self.tid, self.settings.transaction_timeout_ms)
        while not self.stopping.is_set():  # given up for hung: Abandoned, clients left be
            messages = []
            for message in consumer.consume(20, 0.1):
                error = message.error()
                if error is None:
                    messages.append(message)
                else:
                    self.consumer_errors[error.name()] += 1
            self.received += len(messages)
            if messages:
                producer = self.transform(consumer, producer, messages)
        self.retire(producer)
        with self.calling("consumer close"):
            consumer.close()

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assignments += 1
        self.assigned = sorted(tp.partition for tp in partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = []

    def transform(self, consumer: Consumer, producer: Producer, messages: list[Any]) -> Producer:
        txn, self.next_txn = self.next_txn, self.next_txn + 1
        topic = self.settings.out_topic
        records = self.begin_txn(topic, txn)
        offsets: dict[int, int] = {}
        outcome = Outcome.ABORTED
        try:
            if not self.begin(producer):  # counted: start again with a new producer
                self.current = None
                self.retire(producer)
                self.rewind(consumer)
                return self.init(self.tid, self.settings.transaction_timeout_ms)
            may_commit = True
            for seq, message in enumerate(messages):
                partition, offset = message.partition(), message.offset()
                tag = Tag(self.client_name, txn, seq, (partition, offset))
                if not self.produce(producer, self.settings.out_topic, tag, partition):
                    may_commit = False
                    break
                records.append((seq, partition))
                offsets[partition] = max(offsets.get(partition, 0), offset + 1)
            if may_commit:
                may_commit = self.send_offsets(consumer, producer, offsets)
            self.hint(self.tid)
            outcome = self.end(producer, may_commit)
        except ClientFatal as fatal:
            self.tally.fatal(self.client_name, topic, txn, fatal)
            outcome = Outcome.UNKNOWN if fatal.commit_asked else Outcome.ABORTED
            self.retire(producer)
            producer = self.init(self.tid, self.settings.transaction_timeout_ms)
        self.outcomes[outcome.value] += 1
        self.end_txn(Transaction(self.client_name, txn, outcome, tuple(records)), topic)
        if outcome != Outcome.COMMITTED:
            self.rewind(consumer)
        return producer

    def send_offsets(self, consumer: Consumer, producer: Producer, offsets: dict[int, int]) -> bool:
        """Add the consumed offsets to the transaction; False if it must abort."""
        positions = [TopicPartition(self.settings.topic, p, o) for p, o in offsets.items()]
        deadline = time.monotonic() + END_DEADLINE_S
        while True:
            try:
                with self.calling("send_offsets_to_transaction"):
                    producer.send_offsets_to_transaction(
                        positions, consumer.consumer_group_metadata(), API_TIMEOUT_S
                    )
                return True
            except KafkaException as exc:
                error = exc.args[0]
                kind = classify(error)
                if kind == "fatal" or time.monotonic() > deadline:
                    raise ClientFatal(error, False) from exc
                self.tally.error(self.client_name, f"send_offsets {kind}", error)
                if kind != "retriable":
                    return False

    def rewind(self, consumer: Consumer) -> None:
        """Go back to the group's committed offsets: what the aborted transaction consumed
        is consumed again."""
        deadline = time.monotonic() + END_DEADLINE_S
        while True:
            try:
                with self.calling("committed"):
                    committed = consumer.committed(consumer.assignment(), timeout=10)
                for tp in committed:
                    offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                    consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                return
            except KafkaException as exc:
                self.consumer_errors[f"rewind {exc.args[0].name()}"] += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.client_name,
            "transactional_id": self.tid,
            "group": self.group,
            "transactions": self.next_txn,
            "outcomes": dict(self.outcomes),
            "delivery_failures": dict(self.delivery_failures),
            "consumer_errors": dict(self.consumer_errors),
            "received": self.received,
            "assignments": self.assignments,
            "assigned": self.assigned,
            "hung_in": self.hung_in,
            "failure": self.failure,
        }


class Pool:
    """The clients of one kind. One hung in a call (librdkafka#5511, or anything else) is
    given up and replaced by a new instance of its transactional id, under a new name for
    its records, which fences it."""

    def __init__(self, clients: Sequence[TransactionalClient]) -> None:
        self.live = list(clients)
        self.given_up: list[TransactionalClient] = []

    def start(self) -> None:
        for client in self.live:
            client.start()

    def alive(self) -> bool:
        return any(client.is_alive() for client in self.live)

    def replace_hung(self) -> int:
        """Give up the clients hung in a call and start their replacements; how many."""
        replaced = 0
        for i, client in enumerate(self.live):
            if client.is_alive() and client.hung(HUNG_CALL_S):
                self._give_up(client)
                base = client.client_name.split(".")[0]
                self.live[i] = client.replacement(f"{base}.r{len(self.given_up)}")
                self.live[i].start()
                replaced += 1
        return replaced

    def _give_up(self, client: TransactionalClient) -> None:
        client.give_up()
        self.given_up.append(client)

    def suspect_until(self) -> float | None:
        """When the longest call that already outlasted its own timeout counts as hung
        (`replace_hung`); None if no call did."""
        now = time.monotonic()
        starts = [
            call[1]
            for client in self.live
            if client.is_alive()
            and (call := client.in_call) is not None
            and now - call[1] > API_TIMEOUT_S
        ]
        return min(starts) + HUNG_CALL_S if starts else None

    def stop(self, kind: str) -> list[str]:
        """Stop them; the problems. A client hung in a call is given up (and reported
        as hung) rather than waited for; one that does not stop is reported with the
        line it is on."""
        problems = []
        for client in self.live:
            client.stop()
        for client in self.live:
            deadline = time.monotonic() + HUNG_S
            while client.is_alive() and time.monotonic() < deadline:
                if client.hung(HUNG_CALL_S):
                    self._give_up(client)
                    break
                client.join(0.5)
            if client.is_alive() and not client.given_up.is_set():
                problems.append(f"{kind} {client.client_name} did not stop: {where(client)}")
            if client.failure:
                problems.append(f"{kind} {client.client_name}: {client.failure}")
        self.live = [client for client in self.live if not client.given_up.is_set()]
        return problems

    def all(self) -> list[Any]:
        return [*self.given_up, *self.live]

    def hangs(self) -> list[str]:
        return [f"{client.client_name} in {client.hung_in}" for client in self.given_up]


# -- the agents, the topics, the read-backs -------------------------------------------------


@dataclass(frozen=True)
class AgentRef:
    node_id: int
    port: int


def live_agents(admin: AdminClient) -> list[AgentRef]:
    """The agents a Metadata answer lists (empty if none answered)."""
    try:
        brokers = admin.list_topics(timeout=2).brokers
    except KafkaException:
        return []
    return [AgentRef(b.id, b.port) for b in brokers.values()]


def create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **quiet()})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions) for name in names])
    for future in futures.values():
        future.result(30)


def _consumer(bootstrap: str, isolation: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            **quiet(),
            "group.id": f"chaos-txn-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            **extra,
        }
    )


def end_offsets(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0
) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark), by ListOffsets with each
    isolation level."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **quiet()})
    deadline = time.monotonic() + timeout_s
    ends: dict[IsolationLevel, dict[int, int]] = {}
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
        while True:
            try:
                futures = admin.list_offsets(wanted, isolation_level=isolation, request_timeout=10)
                ends[isolation] = {tp.partition: f.result().offset for tp, f in futures.items()}
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return {
        p: (ends[IsolationLevel.READ_COMMITTED][p], ends[IsolationLevel.READ_UNCOMMITTED][p])
        for p in range(partitions)
    }


def wait_settled(
    bootstrap: str, topic: str, partitions: int, timeout_s: float
) -> tuple[dict[int, tuple[int, int]], float]:
    """Wait for every partition's last stable offset to reach its high watermark (no
    transaction open); the last ends read and the seconds waited."""
    began = time.monotonic()
    while True:
        ends = end_offsets(bootstrap, topic, partitions)
        if all(stable == high for stable, high in ends.values()):
            return ends, time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            return ends, time.monotonic() - began
        time.sleep(0.25)


def read_topic(
    bootstrap: str, topic: str, partitions: int, isolation: str, timeout_s: float
) -> tuple[list[Read], bool]:
    """Every record the isolation level shows, from each partition's log start to its
    end: (records in each partition's order, whether every partition was read to its end
    within the timeout)."""
    consumer = _consumer(bootstrap, isolation)
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        done: set[int] = set()
        reads: list[Read] = []
        while len(done) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                partition, offset, err = msg.partition(), msg.offset(), msg.error()
                if partition is None:
                    continue  # an error of the client, not of a partition: it retries
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(partition)
                    continue
                if offset is not None:
                    reads.append(Read.from_value(partition, offset, msg.value()))
        return reads, len(done) == partitions
    finally:
        consumer.close()


def open_transactions(bootstrap: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    """What holds partitions open: the producers DescribeProducers names with a transaction
    open on them, with their transactional id's state (ListTransactions,
    DescribeTransactions). For the report, when a transaction stays open."""
    describe_producers, list_transactions, describe_transactions = 61, 66, 65
    address = bootstrap.split(",")[0]
    try:
        with WireClient(address, timeout=30) as client:
            answer = client.call(
                wire_request(
                    describe_producers,
                    0,
                    topics=[{"name": topic, "partition_indexes": list(range(partitions))}],
                )
            )
            open_on: list[dict[str, Any]] = [
                {
                    "partition": part.partition_index,
                    "producer_id": producer.producer_id,
                    "producer_epoch": producer.producer_epoch,
                    "first_offset": producer.current_txn_start_offset,
                }
                for answered in answer.topics
                for part in answered.partitions
                for producer in part.active_producers
                if producer.current_txn_start_offset >= 0
            ]
            listed = client.call(
                wire_request(list_transactions, 0, state_filters=[], producer_id_filters=[])
            )
            ids = {t.producer_id: t.transactional_id for t in listed.transaction_states}
            wanted = sorted({ids[o["producer_id"]] for o in open_on if o["producer_id"] in ids})
            states = {}
            if wanted:
                described = client.call(
                    wire_request(describe_transactions, 0, transactional_ids=wanted)
                )
                for state in described.transaction_states:
                    states[state.transactional_id] = {
                        "state": state.transaction_state,
                        "producer_epoch": state.producer_epoch,
                        "started_ms": state.transaction_start_time,
                        "partitions": {t.topic: list(t.partitions) for t in state.topics},
                    }
    except Exception as exc:  # a diagnosis only: say why it is missing
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    for entry in open_on:
        tid = ids.get(entry["producer_id"])
        entry["transactional_id"] = tid
        entry["transaction"] = states.get(tid) if tid else None
    return open_on


def where(thread: threading.Thread) -> str:
    """The innermost lines a thread is on (the client calls it is stuck in)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "?"
    stack = traceback.extract_stack(frame)[-3:]
    return " < ".join(
        f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(stack)
    )


def catch_up(
    transformers: Pool,
    bootstrap: str,
    group: str,
    topic: str,
    target: dict[int, int],
    args: argparse.Namespace,
) -> tuple[float | None, dict[int, int]]:
    """Seconds until the group committed past `target` (every input record), None if it
    did not within `--read-timeout-s`; and the group's committed offsets last read. A
    transformer in a call that already outlasted its own timeout is waited for until it
    counts as hung, and its replacement gets the whole `--read-timeout-s` again."""
    began = time.monotonic()
    deadline = began + args.read_timeout_s
    cap = began + 3 * args.read_timeout_s + HUNG_CALL_S
    while True:
        if transformers.replace_hung():
            deadline = time.monotonic() + args.read_timeout_s
        offsets = committed_offsets(bootstrap, group, topic, len(target))
        if all(offsets.get(p, 0) >= offset for p, offset in target.items()):
            return time.monotonic() - began, offsets
        suspect = transformers.suspect_until()
        if suspect is not None:
            deadline = max(deadline, suspect + 1)
        if time.monotonic() >= min(deadline, cap):
            return None, offsets
        time.sleep(0.5)


def group_state(bootstrap: str, group: str) -> str:
    """The group's state and members as its coordinator describes them, or why not."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **quiet()})
    try:
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    except KafkaException as exc:
        return f"not described ({exc.args[0].name()})"
    members = {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
               for m in described.members}  # fmt: skip
    return f"{described.state.name} with members {members}"


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **quiet(),
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: max(tp.offset, 0) for tp in tps}
    finally:
        consumer.close()


# -- the run ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transactions", description=__doc__.splitlines()[0].rstrip(",;")
    )
    harness.add_agent_arguments(parser)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--producers", type=int, default=4, help="random-transaction producers")
    parser.add_argument("--transformers", type=int, default=1, help="consume-transform-produce")
    parser.add_argument("--transactions", type=int, default=500, help="random transactions")
    parser.add_argument("--max-records", type=int, default=6, help="records per transaction")
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--abort-ratio", type=float, default=0.35)
    parser.add_argument("--zombie-ratio", type=float, default=0.02)
    parser.add_argument("--abandon-ratio", type=float, default=0.005)
    parser.add_argument("--abandon-timeout-ms", type=int, default=3000)
    parser.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    parser.add_argument(
        "--short-timeout-producers",
        type=int,
        default=1,
        help="producers whose records time out after --short-message-timeout-ms: their "
        "transactions then abort with an epoch bump (KIP-360)",
    )
    parser.add_argument("--short-message-timeout-ms", type=int, default=200)
    parser.add_argument("--kills", type=int, default=50, help="stop killing after this many")
    parser.add_argument("--interval-s", type=float, default=1.0, help="between two kills")
    parser.add_argument(
        "--coordinator-kills",
        type=float,
        default=0.75,
        help="share of kills aimed at a transactional id's coordinator",
    )
    parser.add_argument("--kill-delay-ms", type=float, default=20.0)
    parser.add_argument(
        "--seconds", type=float, default=600.0, help="stop the transactions after this long"
    )
    parser.add_argument("--settle-timeout-s", type=float, default=60.0)
    parser.add_argument("--read-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--client-log-level",
        type=int,
        default=2,
        help="librdkafka's log level for the clients (syslog levels)",
    )
    parser.add_argument(
        "--client-log", help="append the clients' librdkafka logs (the process's stderr) here"
    )
    parser.add_argument(
        "--client-debug", default="", help="librdkafka debug contexts (e.g. eos,protocol)"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--label", default="", help="a note kept in the report")
    return parser


class Killer:
    """Kills agents, most often the coordinator of a transactional id about to end a
    transaction, as soon as it said so (`hints`)."""

    def __init__(
        self,
        agents: harness.Agents,
        hints: queue.Queue[str],
        rng: random.Random,
        coordinator_share: float,
        delay_ms: float,
    ) -> None:
        self.agents = agents
        self.hints = hints
        self.rng = rng
        self.coordinator_share = coordinator_share
        self.delay_ms = delay_ms
        self.admin = AdminClient({"bootstrap.servers": agents.bootstrap, **quiet()})
        self.aimed = 0  # kills of the coordinator of an id about to use it
        self.random = 0
        self.not_aimed: Counter[str] = Counter()  # why an aimed kill fell back to a random one

    def kill(self, wait_s: float) -> harness.Kill | None:
        if self.rng.random() < self.coordinator_share:
            kill = self.kill_coordinator(wait_s)
            if kill is not None:
                self.aimed += 1
                return kill
        kill = self.agents.kill_one(self.rng)
        if kill is not None:
            self.random += 1
        return kill

    def kill_coordinator(self, wait_s: float) -> harness.Kill | None:
        """Kill the coordinator of the next transactional id to say it is about to end a
        transaction (or initialise) within `wait_s`, if that agent is up."""
        agents = live_agents(self.admin)
        if not agents:
            self.not_aimed["no metadata"] += 1
            return None
        while True:  # only a fresh hint is worth aiming at
            try:
                self.hints.get_nowait()
            except queue.Empty:
                break
        deadline = time.monotonic() + wait_s
        reason = "no transactional id about to end"
        while (left := deadline - time.monotonic()) > 0:
            try:
                tid = self.hints.get(timeout=left)
            except queue.Empty:
                break
            target = placement.coordinator_for(tid, agents)
            time.sleep(self.rng.uniform(0, self.delay_ms) / 1000)
            kill = self.agents.kill_port(target.port)
            if kill is not None:
                return kill
            reason = "its coordinator was down"
        self.not_aimed[reason] += 1
        return None


def run(args: argparse.Namespace, agents: harness.Agents) -> dict[str, Any]:
    """The scenario on agents already started; the report."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    topic, out_topic = f"chaos-txn-{run_id}", f"chaos-txn-out-{run_id}"
    create_topics(agents.bootstrap, [topic, out_topic], args.partitions)
    settings = Settings(
        bootstrap=agents.bootstrap,
        topic=topic,
        out_topic=out_topic,
        partitions=args.partitions,
        max_records=args.max_records,
        value_bytes=args.value_bytes,
        abort_ratio=args.abort_ratio,
        zombie_ratio=args.zombie_ratio,
        abandon_ratio=args.abandon_ratio,
        abandon_timeout_ms=args.abandon_timeout_ms,
        transaction_timeout_ms=args.transaction_timeout_ms,
        short_timeout_producers=args.short_timeout_producers,
        short_message_timeout_ms=args.short_message_timeout_ms,
        client_log_level=args.client_log_level,
        client_debug=args.client_debug,
    )
    if args.client_log:
        send_client_logs_to(args.client_log)
    tally = Tally()
    hints: queue.Queue[str] = queue.Queue(maxsize=64)
    budget = Budget(args.transactions)
    producers = Pool(
        [
            RandomTransactions(
                f"p{i}",
                f"chaos-txn-{run_id}-p{i}",
                settings,
                tally,
                hints,
                budget,
                rng.randrange(1 << 32),
            )
            for i in range(args.producers)
        ]
    )
    for producer in producers.live[: args.short_timeout_producers]:
        # Records that time out in flight make the transaction abort with an epoch bump.
        producer.extra_config["message.timeout.ms"] = args.short_message_timeout_ms
    group = f"chaos-txn-{run_id}-group"
    transformers = Pool(
        [
            Transformer(f"t{i}", f"chaos-txn-{run_id}-t{i}", group, settings, tally, hints)
            for i in range(args.transformers)
        ]
    )
    problems: list[str] = []
    transformers.start()
    producers.start()

    killer = Killer(agents, hints, rng, args.coordinator_kills, args.kill_delay_ms)
    began = time.monotonic()
    kills_wanted = args.kills if agents.can_kill else 0
    next_kill = began + args.interval_s
    stopped_by = "transactions"

    while producers.alive():
        producers.replace_hung()
        transformers.replace_hung()
        if time.monotonic() - began > args.seconds:
            stopped_by = "seconds"
            break
        if len(agents.kills) >= kills_wanted:
            time.sleep(0.05)
            continue
        pause = next_kill - time.monotonic()
        if pause > 0:
            time.sleep(min(pause, 0.05))
            continue
        # Producers wait while an agent restarts: give them time to come to an end.
        killer.kill(wait_s=max(args.interval_s, 2.0))
        next_kill = max(next_kill + args.interval_s, time.monotonic())
    problems += producers.stop("producer")
    phase_s = time.monotonic() - began
    if not agents.wait_all_up(60):
        problems.append("not every agent was up again within 60 s of the last kill")

    # Abandoned transactions abort after their timeout: then nothing may stay open.
    settle_timeout = args.settle_timeout_s + args.abandon_timeout_ms / 1000
    ends, settle_s = wait_settled(agents.bootstrap, topic, args.partitions, settle_timeout)
    committed_in, complete_c = read_topic(
        agents.bootstrap, topic, args.partitions, "read_committed", args.read_timeout_s
    )
    uncommitted_in, complete_u = read_topic(
        agents.bootstrap, topic, args.partitions, "read_uncommitted", args.read_timeout_s
    )
    if not (complete_c and complete_u):
        problems.append("the read-back of the input did not reach every partition's end")
    for producer in producers.all():
        producer.close_abandoned()

    # The transformers stop once their group committed past every input record.
    target: dict[int, int] = {p: 0 for p in range(args.partitions)}
    for read in committed_in:
        target[read.partition] = max(target[read.partition], read.offset + 1)
    catch_up_s = None
    if args.transformers:
        catch_up_s, reached = catch_up(transformers, agents.bootstrap, group, topic, target, args)
        if catch_up_s is None:
            problems.append(
                f"the transformers did not catch up in {args.read_timeout_s:g} s: the group "
                f"committed {reached} of {target}, is {group_state(agents.bootstrap, group)}"
            )
    problems += transformers.stop("transformer")
    # A hang librdkafka is known for (#5511, #5456) is reported; any other is a problem.
    problems += [
        f"client given up as hung in a call: {hang}"
        for hang in producers.hangs() + transformers.hangs()
        if not hang.endswith(" in send_offsets_to_transaction")
    ]

    result_in = txn_checker.check_topic(
        tally.transactions.get(topic, []),
        committed_in,
        uncommitted_in,
        ends,
        tally.refused_aborts.get(topic, []),
    )
    report_out: dict[str, Any] | None = None
    processing: dict[str, Any] | None = None
    anomalies: dict[str, Any] = {"input": result_in.anomalies()}
    if args.transformers:
        ends_out, _s = wait_settled(agents.bootstrap, out_topic, args.partitions, settle_timeout)
        committed_out, complete_co = read_topic(
            agents.bootstrap, out_topic, args.partitions, "read_committed", args.read_timeout_s
        )
        uncommitted_out, complete_uo = read_topic(
            agents.bootstrap, out_topic, args.partitions, "read_uncommitted", args.read_timeout_s
        )
        if not (complete_co and complete_uo):
            problems.append("the read-back of the output did not reach every partition's end")
        result_out = txn_checker.check_topic(
            tally.transactions.get(out_topic, []),
            committed_out,
            uncommitted_out,
            ends_out,
            tally.refused_aborts.get(out_topic, []),
        )
        offsets = committed_offsets(agents.bootstrap, group, topic, args.partitions)
        result_processing = txn_checker.check_processing(committed_in, committed_out, offsets)
        report_out = result_out.summary()
        processing = {**result_processing.summary(), "committed_offsets": offsets}
        anomalies["output"] = result_out.anomalies()
        anomalies["processing"] = result_processing.anomalies()
    anomalies["clients"] = {"unexpected_errors": len(tally.unexpected)}
    total = sum(n for kinds in anomalies.values() for n in kinds.values())

    ended = sum(sum(p.kinds.values()) for p in producers.all())
    kills = agents.kills
    return {
        "topics": {"input": topic, "output": out_topic},
        "seed": seed,
        "transactions": {
            "random": ended,
            "random_per_s": round(ended / phase_s, 1) if phase_s else None,
            "transformed": sum(t.next_txn for t in transformers.all()),
            "transformers_caught_up_s": None if catch_up_s is None else round(catch_up_s, 1),
            "phase_s": round(phase_s, 1),
            "stopped_by": stopped_by,
            "settle_s": round(settle_s, 1),
        },
        "kills": {
            "count": len(kills),
            "aimed_at_coordinator": killer.aimed,
            "random": killer.random,
            "not_aimed": dict(killer.not_aimed),
            "per_minute": round(len(kills) / phase_s * 60, 1) if phase_s else None,
            "down_s": harness.percentiles([k.down_s for k in kills if k.down_s is not None]),
            "notes": agents.notes,
            "fields": ["at_s", "agent", "pid", "down_s"],
            "list": [k.as_row() for k in kills],
        },
        "clients": {
            "producers": [p.describe() for p in producers.all()],
            "transformers": [t.describe() for t in transformers.all()],
            "given_up_as_hung": producers.hangs() + transformers.hangs(),
            "errors": dict(sorted(tally.errors.items())),
            "unexpected_errors": tally.unexpected[:50],
        },
        "check": {
            "anomalies": anomalies,
            "total_anomalies": total,
            "input": {
                **result_in.summary(),
                "open_at_end_held_by": (
                    open_transactions(agents.bootstrap, topic, args.partitions)
                    if result_in.open_at_end
                    else []
                ),
            },
            "output": report_out,
            "processing": processing,
        },
        "problems": problems,
        "ok": total == 0 and not problems,
        "exit_status": 2 if problems else (0 if total == 0 else 1),
    }


def print_summary(report: dict[str, Any], out: Any = sys.stdout) -> None:
    txns, kills, check = report["transactions"], report["kills"], report["check"]
    outcomes = check["input"]["transactions"]
    print(
        f"transactions: {txns['random']} random in {txns['phase_s']} s "
        f"({txns['random_per_s']}/s; {outcomes}), {txns['transformed']} transformed; "
        f"{kills['count']} kills ({kills['aimed_at_coordinator']} at a coordinator, "
        f"down p50 {kills['down_s']['p50']} s)",
        file=out,
    )
    for part, kinds in check["anomalies"].items():
        found = {k: v for k, v in kinds.items() if v}
        print(f"  {part}: {found or 'no anomaly'}", file=out)
    for line in report["clients"]["unexpected_errors"][:5]:
        print(f"  unexpected: {line}", file=out)
    refused = sum(
        (check.get(part) or {}).get("refused_aborts_explained", 0) for part in ("input", "output")
    )
    if refused:
        print(f"  aborts refused as Kafka's transaction version 1 does: {refused}", file=out)
    for line in report["clients"]["given_up_as_hung"]:
        print(f"  client given up as hung in a call: {line}", file=out)
    for part in ("input", "output"):
        summary = check.get(part)
        if not summary:
            continue
        for kind, examples in summary["examples"].items():
            if examples:
                print(f"  {part} {kind}: {examples[:3]}", file=out)
    for problem in report["problems"]:
        print(f"  problem: {problem}", file=out)
    print("  OK" if report["ok"] else "  FAILED", file=out)


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the scenario; `env`: extra environment of every agent started (tests)."""
    args = build_parser().parse_args(argv)
    faults_env = "BUCKETLOG_FAULT_POINTS"  # test-only (broker/faults.py): kept in the report
    started = harness.now_iso()
    wall = time.monotonic()
    machine = harness.machine()
    with harness.open_agents(args, env) as agents:
        body = run(args, agents)
        body["agent_logs"] = {
            **agents.log_errors(),
            "paths": [str(p) for p in agents.logs()] if args.keep_work_dir or args.work_dir else [],
        }
        config = {
            key: getattr(args, key)
            for key in (
                "partitions",
                "producers",
                "transformers",
                "transactions",
                "max_records",
                "abort_ratio",
                "zombie_ratio",
                "abandon_ratio",
                "abandon_timeout_ms",
                "short_timeout_producers",
                "short_message_timeout_ms",
                "kills",
                "interval_s",
                "coordinator_kills",
                "kill_delay_ms",
                "seconds",
            )
        }
        report = {
            "scenario": SCENARIO,
            "label": args.label,
            "started_at": started,
            "duration_s": None,
            "machine": {**machine, "loadavg_at_end": os.getloadavg()},
            "agents": {
                **agents.describe(),
                "args": args.agent_arg,
                "env": dict(env or {}),
                faults_env: (env or {}).get(faults_env, os.environ.get(faults_env)),
            },
            "config": config,
            **body,
        }
    report["duration_s"] = round(time.monotonic() - wall, 1)
    print_summary(report)
    if args.report:
        print(f"  report: {harness.write_report(args.report, report)}")
    return int(report["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
