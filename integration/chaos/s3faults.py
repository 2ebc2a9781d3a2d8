"""Object-store faults: the agents' S3 store behind a proxy that fails a share of the
requests, while producers write with acks=all and a consumer reads; then the faults
stop, recovery is timed, everything is read back and checked.

    .venv/bin/python -m integration.chaos.s3faults --fault-rate 0.2 --seconds 600 \\
        --report integration/chaos/results/s3-faults.json

1. Starts a moto S3 server (tests/storage/moto_support.py) and, in front of it, the
   fault proxy (`FaultProxy`, 127.0.0.1). Each request the proxy receives fails with
   probability `--fault-rate`, the kind drawn evenly from `--faults`:
   - slowdown: 503 with S3's SlowDown error body, not forwarded;
   - internal: 500 InternalError, not forwarded;
   - drop-before: the connection reset before the request is forwarded;
   - drop-after: forwarded (it took effect: an object stored) and then the
     connection reset, so the client never hears the answer;
   - latency: forwarded after 0.05 to `--max-latency-s` more.
2. Starts `--agents` agents on the S3 store at the proxy's address (`harness.py`) and a
   topic of `--partitions` partitions.
3. Runs the kill loop's producers (killloop.ChaosProducer: every other one idempotent,
   acks=all, clients retrying for minutes), one more producer that never retries (the
   probe: every error the broker answers reaches its delivery reports, counted by code),
   and a consumer reading every partition, for `--seconds`.
4. Stops the faults and times recovery: a new producer's record acknowledged and read
   back by a new consumer, within `--recovery-timeout-s`. Produces `--settle-s` more.
5. Stops the producers, reads every partition back and checks it (checker.check: lost,
   duplicated by an idempotent producer, offsets not dense, order).

Measured on 2 cores shared with other work (load 7 to 9), 2 agents, the defaults
(4 producers at 50 records a second, the probe at 20, 8 partitions, 100 ms flushes,
16 KiB caches), `--seconds 600 --fault-rate 0.2`: 14,355 of 71,206 S3 requests failed
(20.2%: 2,800 to 2,900 of each kind; GET 57,819, PUT 7,377, DELETE 5,673, HEAD 337),
131,973 records acknowledged and every one read back where acknowledged, none lost,
duplicated or out of order; no error reached a client, not even the probe; produce and
consume worked 0.18 s after the faults stopped; 625 s in all.

What reaches clients. botocore retries every one of these faults (storage/s3.py), so at
20% no produce fails: the clients see nothing. Only when its retries give up (most
requests failing) does an upload fail, and its batches are answered KAFKA_STORAGE_ERROR
(broker/ingest.py), which clients retry. A producer without idempotence may then write
a batch after a later one, though it keeps one request in flight: librdkafka builds its
next request (holding the partition's next batch) while the one before is unanswered,
and sends it once that one has failed; the failed batch goes back to its queue and
follows (seen in its debug log: two "Produce MessageSet" lines for one partition before
the "Disk error" of the first). The checker counts that as out of order; seen in 3 of 5
runs at 80 to 95% faults, never at 20%. An idempotent producer's order held in every run.

Exit status 0 if nothing was wrong; 1 on an anomaly of the checker, an error that is
not retriable at a client, or no recovery; 2 if the run itself failed (nothing
acknowledged, a read-back that did not finish, a producer's fatal error).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import random
import socket
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a file: the repository root holds our packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from integration.chaos import checker, harness, killloop
from integration.chaos.checker import Ack

SCENARIO = "s3-faults"
FAULT_KINDS = ("slowdown", "internal", "drop-before", "drop-after", "latency")

# Errors librdkafka makes itself (negative codes) that a client retries or rides out:
# a connection lost or refused, a request or message that timed out, a request to an
# agent that left the Metadata answer (its lease ran out while the metadata store was
# down, as a Kafka broker is fenced when it cannot reach the controller) failed when
# librdkafka let go of that broker.
CLIENT_RETRIABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._PARTITION_EOF,
    }
)


def retriable(err: KafkaError) -> bool:
    """Whether a client may retry what failed with `err` (Kafka's own rule for broker
    codes: kio's ErrorCode knows it)."""
    code = err.code()
    if code < 0:
        return code in CLIENT_RETRIABLE
    try:
        return bool(ErrorCode(code).retriable)
    except ValueError:
        return False


def _s3_error(status: int, code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId>"
        "</Error>"
    ).encode()


_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection"})


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of one upstream S3 endpoint that fails a
    share of the requests (`fault_rate`, settable while it runs) in one of `kinds`.

    Request and response bodies are read whole and forwarded with a Content-Length.
    Counts every request and every fault by kind."""

    def __init__(
        self,
        upstream: str,
        fault_rate: float,
        kinds: Sequence[str] = FAULT_KINDS,
        max_latency_s: float = 0.5,
        seed: int | None = None,
    ) -> None:
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds must be among {FAULT_KINDS}, not {sorted(unknown)}")
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.fault_rate = fault_rate
        self.kinds = tuple(kinds)
        self.max_latency_s = max_latency_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # by method
        self.faults: Counter[str] = Counter()  # by kind
        self.upstream_errors = 0  # the upstream itself failed (not a fault of ours)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _draw(self) -> str | None:
        with self._lock:
            if self._rng.random() >= self.fault_rate:
                return None
            return self._rng.choice(self.kinds)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        kind = self._draw()
        with self._lock:
            self.requests[handler.command] += 1
            if kind is not None:
                self.faults[kind] += 1
        if kind == "slowdown":
            _answer(handler, 503, _s3_error(503, "SlowDown", "Please reduce your request rate."))
            return
        if kind == "internal":
            _answer(
                handler, 500, _s3_error(500, "InternalError", "We encountered an internal error.")
            )
            return
        if kind == "drop-before":
            _reset(handler)
            return
        if kind == "latency":
            with self._lock:
                pause = self._rng.uniform(0.05, self.max_latency_s)
            time.sleep(pause)
        try:
            status, reason, headers, answer = self._forward(handler, body)
        except OSError:
            with self._lock:
                self.upstream_errors += 1
            _reset(handler)
            return
        if kind == "drop-after":
            _reset(handler)
            return
        handler.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                handler.send_header(name, value)
        if handler.command == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
            handler.send_header("Content-Length", length)
            handler.end_headers()
        else:
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)

    def _forward(
        self, handler: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            headers = {
                k: v
                for k, v in handler.headers.items()
                if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"
            }
            if body or handler.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            answer = response.read()
            return response.status, response.reason, response.getheaders(), answer
        finally:
            upstream.close()

    def describe(self) -> dict[str, Any]:
        with self._lock:
            total = sum(self.requests.values())
            faults = sum(self.faults.values())
            return {
                "url": self.url,
                "kinds": list(self.kinds),
                "requests": total,
                "requests_by_method": dict(self.requests),
                "faults": faults,
                "faults_by_kind": dict(self.faults),
                "measured_fault_rate": round(faults / total, 4) if total else None,
                "upstream_errors": self.upstream_errors,
            }


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _answer(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/xml")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a reset (no answer, no orderly close)."""
    handler.close_connection = True
    with contextlib.suppress(OSError):
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Tail(threading.Thread):
    """A consumer that reads the last `window` records of every partition over and over
    while the faults last, so that fetches read objects older than the agents' cache;
    counts the records and the errors it is told of, by name."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, window: int = 2000) -> None:
        super().__init__(name="tail", daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"chaos-tail-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "log_level": 2,
            }
        )
        self.topic = topic
        self.partitions = partitions
        self.window = window
        self.stopping = threading.Event()
        self.records = 0
        self.passes = 0
        self.errors: Counter[str] = Counter()
        self.not_retriable: Counter[str] = Counter()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self._one_pass()
        except Exception as exc:  # counted: the run fails on it
            self.not_retriable[f"{type(exc).__name__}: {exc}"] += 1
        finally:
            self.consumer.close()

    def _one_pass(self) -> None:
        ends: dict[int, int] = {}
        for partition in range(self.partitions):
            try:
                _start, ends[partition] = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=5, cached=False
                )
            except Exception as exc:  # noqa: BLE001 - a KafkaException: counted, tried again
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                self._count(err) if err is not None else self.errors.update([repr(exc)])
                return
        self.consumer.assign(
            [TopicPartition(self.topic, p, max(0, end - self.window)) for p, end in ends.items()]
        )
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 30
        while len(done) < self.partitions and not self.stopping.is_set():
            if time.monotonic() > deadline:
                self.errors["pass not finished in 30 s"] += 1
                break
            for msg in self.consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is None:
                    self.records += 1
                    if (msg.offset() or 0) >= ends[msg.partition() or 0] - 1:
                        done.add(msg.partition() or 0)
                elif err.code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition() or 0)
                else:
                    self._count(err)
        self.passes += 1

    def _count(self, err: KafkaError) -> None:
        self.errors[err.name()] += 1
        if not retriable(err):
            self.not_retriable[err.name()] += 1

    def stop(self) -> None:
        self.stopping.set()

    def describe(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "records": self.records,
            "errors": dict(self.errors),
            "not_retriable": dict(self.not_retriable),
        }


def wait_for_every_agent(bootstrap: str, count: int, timeout_s: float = 30.0) -> bool:
    """Until each agent names `count` brokers in its metadata. Leaders are spread over
    the agents each one sees live: a partition created before an agent saw the others
    changes leader once it does, and a client then has requests for it in flight to two
    agents at once (librdkafka's max.in.flight is per connection), which may reorder a
    producer without idempotence."""
    deadline = time.monotonic() + timeout_s
    for address in bootstrap.split(","):
        while True:
            try:
                # A new client each time: its first request goes to `address`.
                admin = AdminClient({"bootstrap.servers": address, "log_level": 2})
                metadata = admin.list_topics(timeout=2)
                seen = metadata.orig_broker_name.split("/")[0] == address
                if seen and len(metadata.brokers) >= count:
                    break
            except Exception:  # noqa: BLE001 - a KafkaException: asked again
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return True


def recover(bootstrap: str, topic: str, timeout_s: float) -> tuple[float | None, Ack | None]:
    """Seconds until a new producer's record is acknowledged and a new consumer reads
    it at its offset (None: not within timeout_s); the acknowledgement."""
    began = time.monotonic()
    deadline = began + timeout_s
    acked: list[Ack] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked.append(Ack("recovery", 0, msg.partition(), msg.offset()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000),
            "log_level": 2,
        }
    )
    producer.produce(
        topic, value=checker.encode_value("recovery", 0), partition=0, on_delivery=delivered
    )
    producer.flush(timeout_s)
    if not acked:
        return None, None
    ack = acked[0]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-recovery-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, ack.partition, ack.offset)])
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            if checker.decode_value(msg.value()) == ("recovery", 0):
                return time.monotonic() - began, ack
    finally:
        consumer.close()
    return None, ack


@contextlib.contextmanager
def s3_behind_proxy(
    fault_rate: float, kinds: Sequence[str], max_latency_s: float, seed: int
) -> Iterator[tuple[FaultProxy, dict[str, str]]]:
    """A moto server with the test bucket, the proxy in front of it, and the
    environment an agent needs to reach it."""
    import boto3

    from tests.storage.moto_support import TEST_BUCKET, TEST_CREDENTIALS, moto_server

    env = {
        **TEST_CREDENTIALS,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    with moto_server() as upstream:
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=upstream,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=TEST_BUCKET)
        client.close()
        proxy = FaultProxy(upstream, fault_rate, kinds, max_latency_s, seed).start()
        try:
            yield proxy, env
        finally:
            proxy.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s3faults", description=__doc__.splitlines()[0].rstrip(",")
    )
    harness.add_agent_arguments(parser, agents=2)
    parser.add_argument("--fault-rate", type=float, default=0.2, help="share of S3 requests failed")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"the kinds drawn from, comma-separated (of {','.join(FAULT_KINDS)})",
    )
    parser.add_argument("--max-latency-s", type=float, default=0.5)
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=16384,
        help="each agent's cache of recent objects: small, so that fetches read S3",
    )
    parser.add_argument("--flush-interval-ms", type=int, default=100, help="of each agent")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the faults last")
    parser.add_argument("--seed", type=int, default=None, help="of the faults drawn")
    add_workload_arguments(parser)
    return parser


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What `run_with_faults` reads: the clients, recovery, read-back, report."""
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--producers", type=int, default=4, help="producers; every other one idempotent"
    )
    parser.add_argument("--rate", type=float, default=50.0, help="records a second per producer")
    parser.add_argument("--probe-rate", type=float, default=20.0, help="of the probe producer")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--recovery-timeout-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=2.0, help="producing after recovery")
    parser.add_argument("--flush-timeout-s", type=float, default=60.0)
    parser.add_argument("--read-timeout-s", type=float, default=120.0)
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--label", default="", help="a note kept in the report")


def _producer(
    args: argparse.Namespace, bootstrap: str, topic: str, name: str, idem: bool, rate: float
) -> killloop.ChaosProducer:
    return killloop.ChaosProducer(
        name,
        idem,
        bootstrap,
        topic,
        args.partitions,
        rate,
        args.value_bytes,
        args.flush_timeout_s,
        2,
    )


def run(args: argparse.Namespace, agents: harness.Agents, proxy: FaultProxy) -> dict[str, Any]:
    """The scenario on agents already started on the proxied store; the report."""
    proxy.fault_rate = 0.0  # the topic is created, and each client started, without faults

    def fault_phase(stopped: Callable[[], bool]) -> dict[str, Any]:
        proxy.fault_rate = args.fault_rate
        began = time.monotonic()
        while time.monotonic() - began < args.seconds and not stopped():
            time.sleep(0.1)
        proxy.fault_rate = 0.0
        seen = proxy.describe()
        seen["summary"] = (
            f"{seen['faults']} of {seen['requests']} S3 requests failed "
            f"({seen['measured_fault_rate']}) {seen['faults_by_kind']}"
        )
        return seen

    return run_with_faults(args, agents, SCENARIO, fault_phase)


def run_with_faults(
    args: argparse.Namespace,
    agents: harness.Agents,
    scenario: str,
    fault_phase: Callable[[Callable[[], bool]], dict[str, Any]],
) -> dict[str, Any]:
    """Producers, the probe and the consumer on a new topic; `fault_phase(stopped)` once
    every producer has an acknowledgement (it returns when its faults are over, or soon
    after `stopped()`: a producer failed, with what it did); then recovery, read-back and
    check. The report's body."""
    topic = f"chaos-{scenario}-{uuid.uuid4().hex[:8]}"
    problems: list[str] = []
    if not wait_for_every_agent(agents.bootstrap, args.agents):
        problems.append(f"not every agent saw {args.agents} agents live within 30 s")
    killloop.create_topic(agents.bootstrap, topic, args.partitions)
    producers = [
        _producer(
            args,
            agents.bootstrap,
            topic,
            f"{'idem' if i % 2 == 0 else 'plain'}{i}",
            i % 2 == 0,
            args.rate,
        )
        for i in range(args.producers)
    ]
    # The probe never retries: each error the broker answers is in its delivery reports.
    probe = _producer(args, agents.bootstrap, topic, "probe", False, args.probe_rate)
    probe.config["retries"] = 0
    everyone = [*producers, probe]
    for producer in everyone:
        producer.start()
    tail = Tail(agents.bootstrap, topic, args.partitions)
    tail.start()
    warm_deadline = time.monotonic() + 60
    while not all(p.acks for p in everyone) and time.monotonic() < warm_deadline:
        time.sleep(0.05)
    if not all(p.acks for p in everyone):
        problems.append("a producer had no acknowledgement within 60 s of its start")
    acks_before = sum(len(p.acks) for p in everyone)
    failed_before = Counter(probe.failed)

    began = time.monotonic()
    faults_seen = fault_phase(lambda: any(p.fatal for p in everyone))
    fault_phase_s = time.monotonic() - began
    acks_during = sum(len(p.acks) for p in everyone) - acks_before

    recovery_s, recovery_ack = recover(agents.bootstrap, topic, args.recovery_timeout_s)
    failed_at_recovery = Counter(probe.failed)
    time.sleep(args.settle_s)
    for producer in everyone:
        producer.stop()
    for producer in everyone:
        producer.join()
    tail.stop()
    tail.join()
    for producer in everyone:
        if producer.fatal:
            problems.append(f"producer {producer.producer_name}: fatal error {producer.fatal}")

    # Errors that reached a client, by name: the probe's (every one the broker answered)
    # and any the retrying producers gave up on.
    client_errors: Counter[str] = Counter()
    for producer in everyone:
        client_errors.update(producer.failed)
    not_retriable = {
        name: n
        for name, n in client_errors.items()
        if not retriable(KafkaError(getattr(KafkaError, name, KafkaError.UNKNOWN)))
    }
    not_retriable.update(tail.not_retriable)
    after_recovery = Counter(probe.failed)
    after_recovery.subtract(failed_at_recovery)

    read_began = time.monotonic()
    records, ranges, complete = killloop.read_back(
        agents.bootstrap, topic, args.partitions, args.read_timeout_s
    )
    read_s = time.monotonic() - read_began
    if not complete:
        problems.append(f"the read-back did not reach every partition's end in {read_s:.0f} s")
    acks = [ack for producer in everyone for ack in producer.acks]
    if recovery_ack is not None:
        acks.append(recovery_ack)
    if not acks:
        problems.append("nothing was acknowledged")
    result = checker.check(acks, records, ranges, {p.producer_name: p.idempotent for p in everyone})
    anomalies = dict(not_retriable)
    failed_after = {k: n for k, n in after_recovery.items() if n}
    ok = result.ok and not problems and not not_retriable and recovery_s is not None
    return {
        "topic": topic,
        "faults": {
            **faults_seen,
            "fault_phase_s": round(fault_phase_s, 1),
            "acknowledged_during": acks_during,
        },
        "recovery_s": None if recovery_s is None else round(recovery_s, 2),
        "producers": [p.describe() for p in everyone],
        "client_errors": {
            "by_name": dict(client_errors),
            "probe_before_faults": dict(failed_before),
            "probe_after_recovery": failed_after,
            "consumer": tail.describe(),
            "not_retriable": anomalies,
        },
        "read_back": {
            "records": len(records),
            "seconds": round(read_s, 1),
            "complete": complete,
            "end_offsets": {str(p): list(r) for p, r in sorted(ranges.items())},
        },
        "check": result.summary(),
        "problems": problems,
        "ok": ok,
        "exit_status": 2 if problems else (0 if ok else 1),
    }


def print_summary(report: dict[str, Any], out: Any = sys.stdout) -> None:
    faults, check, errors = report["faults"], report["check"], report["client_errors"]
    acked = sum(p["acknowledged"] for p in report["producers"])
    print(
        f"{report['scenario']}: {faults['summary']} over {faults['fault_phase_s']} s; "
        f"recovery {report['recovery_s']} s; "
        f"{acked} acknowledged, {report['read_back']['records']} read back",
        file=out,
    )
    print(
        f"  client errors {errors['by_name']}, consumer {errors['consumer']['errors']}; "
        f"not retriable {errors['not_retriable']}",
        file=out,
    )
    anomalies = ", ".join(f"{k} {v}" for k, v in check["anomalies"].items())
    print(f"  anomalies: {anomalies}", file=out)
    for kind, examples in check["examples"].items():
        if examples and kind != "other_duplicates":
            print(f"  {kind}: {examples[:3]}", file=out)
    if report["recovery_s"] is None:
        print("  no produce and consume succeeded after the faults stopped", file=out)
    for problem in report["problems"]:
        print(f"  problem: {problem}", file=out)
    print("  OK" if report["ok"] else "  FAILED", file=out)


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the scenario; `env`: extra environment of every agent started (tests)."""
    args = build_parser().parse_args(argv)
    if args.bootstrap:
        raise SystemExit("s3faults starts its own agents, on its own S3 store: no --bootstrap")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    started = harness.now_iso()
    wall = time.monotonic()
    machine = harness.machine()
    with s3_behind_proxy(args.fault_rate, kinds, args.max_latency_s, seed) as (proxy, s3_env):
        from tests.storage.moto_support import TEST_BUCKET

        args.agent_arg = [
            "--storage",
            f"s3://{TEST_BUCKET}/chaos-{uuid.uuid4().hex[:8]}",
            "--s3-endpoint-url",
            proxy.url,
            "--cache-bytes",
            str(args.cache_bytes),
            "--flush-interval-ms",
            str(args.flush_interval_ms),
            *args.agent_arg,
        ]
        with harness.open_agents(args, {**s3_env, **(env or {})}) as agents:
            body = run(args, agents, proxy)
            body["agent_logs"] = {
                **agents.log_errors(),
                "paths": [str(p) for p in agents.logs()]
                if args.keep_work_dir or args.work_dir
                else [],
            }
            config = {
                key: getattr(args, key)
                for key in (
                    "fault_rate",
                    "max_latency_s",
                    "cache_bytes",
                    "flush_interval_ms",
                    "partitions",
                    "producers",
                    "rate",
                    "probe_rate",
                    "seconds",
                    "settle_s",
                )
            }
            report = {
                "scenario": SCENARIO,
                "label": args.label,
                "started_at": started,
                "duration_s": None,
                "seed": seed,
                "machine": {**machine, "loadavg_at_end": os.getloadavg()},
                "agents": {**agents.describe(), "args": args.agent_arg, "env": dict(env or {})},
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
