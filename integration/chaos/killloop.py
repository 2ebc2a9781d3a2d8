"""Kill loop: producers with acks=all over many partitions while agents are killed with
SIGKILL one after another and started again; then everything is read back and checked.

    .venv/bin/python -m integration.chaos.killloop --kills 1000 --interval-s 0.5 \\
        --seconds 720 --report integration/chaos/results/kill-loop.json

1. Starts `--agents` agents (`harness.py`: restarted by the harness at once, or by the
   supervisor with `--restart supervisor`), or uses `--bootstrap`, and creates a topic
   of `--partitions` partitions.
2. Runs `--producers` confluent-kafka producers in threads, every other one idempotent,
   all with acks=all, each at `--rate` records a second round-robin over the
   partitions (catching up after a stall, with at most 2 s' worth waiting). A record's value names its producer and sequence number
   (`checker.encode_value`); every delivery report without an error is an
   acknowledgement of (partition, offset). The producer without idempotence keeps one
   request in flight; it may still write a record twice, and librdkafka may send its
   newer records before the retry of an older one: its order is counted, not promised.
3. Once every producer has had an acknowledgement, kills a random agent that is up every
   `--interval-s`, until `--kills` kills or `--seconds` seconds, whichever comes first.
4. Produces `--settle-s` more with every agent up, stops the producers (each waits up to
   `--flush-timeout-s` for its last reports), reads every partition from its log start
   to its end offset, and checks (`checker.check`): acknowledged but missing, duplicates
   of idempotent producers, offsets not dense, each idempotent producer's order.
5. Prints a summary, writes the JSON report (`--report`), and exits 0 if nothing was
   wrong, 1 on any anomaly, 2 if the run itself failed (nothing acknowledged, a
   read-back that did not finish, an agent that did not come back, a producer's fatal
   error).

How fast kills go. With the harness restarting agents, a kill costs the start of a new
agent process: 0.7 s on an idle core (0.5 s of it imports), 1 to 3 s when several start
at once next to the running agents and producers. An agent is down until it listens
again on its port, where clients find it at once (its lease, 2.5 s, runs out only if it
is down longer); the loop waits while no agent is up. Measured on 2 cores, 3 agents,
`--interval-s 0.5`: 116 kills a minute on an otherwise idle machine (down p50 1.1 s),
64 to 78 a minute while other work shared it; 1,000 kills take about 9 minutes. With
`--restart supervisor` the supervisor's back-off (0.5 s doubling to 30 s for an agent
that dies within a minute of its start) soon holds each agent down for 30 s: 6 kills a
minute with 3 agents once it is reached (11 over the first 3 minutes).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repository root holds our packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from integration.chaos import checker, harness
from integration.chaos.checker import Ack, Record

SCENARIO = "kill-loop"


class ChaosProducer(threading.Thread):
    """One producer: numbered records round-robin over the partitions at a steady rate
    until stopped; notes every acknowledgement and every failed delivery."""

    def __init__(
        self,
        name: str,
        idempotent: bool,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float,
        value_bytes: int,
        flush_timeout_s: float,
        client_log_level: int,
        offsets_known: bool = True,
    ) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.producer_name = name
        # False on a lightning topic: the answer's offset is -1 (librdkafka adds each
        # record's index to it), so an acknowledgement names no offset.
        self.offsets_known = offsets_known
        self.idempotent = idempotent
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.value_bytes = value_bytes
        self.flush_timeout_s = flush_timeout_s
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": idempotent,
            "linger.ms": 5,
            # Ride out the kills: retry for minutes, reconnect within a second.
            "message.timeout.ms": 300_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 1000,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 1000,
            "client.id": f"chaos-{name}",
            # Refused connections to a killed agent are the point here, not news.
            "log_level": client_log_level,
        }
        if not idempotent:
            config["max.in.flight.requests.per.connection"] = 1
        self.config = config
        self.stopping = threading.Event()
        self.acks: list[Ack] = []
        self.failed: Counter[str] = Counter()
        self.fatal: str | None = None
        self.sent = 0
        self.pending_at_end = 0

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        decoded = checker.decode_value(msg.value())
        if decoded is None:  # not one of ours: cannot happen
            self.failed["unrecognised delivery"] += 1
            return
        if err is not None:
            self.failed[err.name()] += 1
            if err.fatal():
                self.fatal = str(err)
                self.stopping.set()
            return
        offset = msg.offset() if self.offsets_known else None
        self.acks.append(Ack(self.producer_name, decoded[1], msg.partition(), offset))

    def run(self) -> None:
        try:
            self._produce()
        except Exception as exc:  # the run fails with it
            self.fatal = f"{type(exc).__name__}: {exc}"

    def _produce(self) -> None:
        producer = Producer(self.config)
        began = time.monotonic()
        max_queued = max(100, int(self.rate * 2))  # records waiting: about 2 s' worth
        while not self.stopping.is_set():
            due = int((time.monotonic() - began) * self.rate)
            if self.sent >= due or len(producer) >= max_queued:
                producer.poll(0.01)
                continue
            producer.produce(
                self.topic,
                value=checker.encode_value(self.producer_name, self.sent, self.value_bytes),
                key=self.producer_name.encode(),
                partition=self.sent % self.partitions,
                on_delivery=self._delivered,
            )
            self.sent += 1
            producer.poll(0)
        self.pending_at_end = producer.flush(self.flush_timeout_s)

    def stop(self) -> None:
        self.stopping.set()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.producer_name,
            "idempotent": self.idempotent,
            "sent": self.sent,
            "acknowledged": len(self.acks),
            "failed": dict(self.failed),
            "pending_at_end": self.pending_at_end,
            "fatal": self.fatal,
        }


def create_topic(
    bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, config=dict(configs or {}))]
    )
    futures[topic].result(30)


def wait_for_sequencing(
    bootstrap: str, topic: str, acks: list[Ack], timeout_s: float
) -> float | None:
    """Seconds until each partition's end offset reaches the number of distinct records
    acknowledged in it (None: not within timeout_s)."""
    wanted = Counter({(a.producer, a.seq): a.partition for a in acks}.values())
    began = time.monotonic()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"chaos-wait-{uuid.uuid4().hex[:8]}"}
    )
    try:
        while time.monotonic() - began < timeout_s:
            try:
                ends = {
                    p: consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=10, cached=False
                    )[1]
                    for p in wanted
                }
            except KafkaException:  # asked again
                ends = {}
            if ends and all(ends[p] >= n for p, n in wanted.items()):
                return time.monotonic() - began
            time.sleep(0.2)
    finally:
        consumer.close()
    return None


def read_back(
    bootstrap: str, topic: str, partitions: int, timeout_s: float
) -> tuple[list[Record], dict[int, tuple[int, int]], bool]:
    """Every record of every partition from its log start to its end offset: (records
    in each partition's order, partition -> (start, end), whether every partition was
    read to its end within the timeout)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-read-back-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    deadline = time.monotonic() + timeout_s
    try:
        ranges: dict[int, tuple[int, int]] = {}
        for partition in range(partitions):
            tp = TopicPartition(topic, partition)
            while True:
                try:
                    ranges[partition] = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _end) in ranges.items()])
        done = {p for p, (start, end) in ranges.items() if start >= end}
        records: list[Record] = []
        while len(done) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                partition_or_none, offset, err = msg.partition(), msg.offset(), msg.error()
                if partition_or_none is None:
                    continue  # an error of the client, not of a partition: it retries
                partition = partition_or_none
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(partition)
                    continue
                if offset is None:
                    continue
                if offset >= ranges[partition][1]:
                    done.add(partition)  # past the end of the read: written after it
                    continue
                records.append(Record.from_value(partition, offset, msg.value()))
                if offset == ranges[partition][1] - 1:
                    done.add(partition)
        return records, ranges, len(done) == partitions
    finally:
        consumer.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="killloop", description=__doc__.splitlines()[0].rstrip(",")
    )
    harness.add_agent_arguments(parser)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument(
        "--producers", type=int, default=4, help="producers; every other one idempotent"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="records a second per producer")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--topic-config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a config of the topic created (repeat); bucketlog.topic.type=lightning runs "
        "the scenario on a lightning topic, whose acknowledgements carry no offset",
    )
    parser.add_argument(
        "--classic-alongside",
        action="store_true",
        help="also a classic topic, written at the same time by as many producers again "
        "and checked on its own (with --topic-config bucketlog.topic.type=lightning: both "
        "kinds in one cluster)",
    )
    parser.add_argument("--kills", type=int, default=10, help="stop after this many kills")
    parser.add_argument("--interval-s", type=float, default=1.0, help="between two kills")
    parser.add_argument(
        "--seconds", type=float, default=600.0, help="stop killing after this long, however many"
    )
    parser.add_argument("--settle-s", type=float, default=2.0, help="producing after the kills")
    parser.add_argument("--flush-timeout-s", type=float, default=60.0)
    parser.add_argument("--read-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--client-log-level",
        type=int,
        default=2,
        help="librdkafka's log level for the producers (syslog levels; 6 shows each disconnect)",
    )
    parser.add_argument("--seed", type=int, default=None, help="of the choice of victims")
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--label", default="", help="a note kept in the report")
    return parser


def run(args: argparse.Namespace, agents: harness.Agents) -> dict[str, Any]:
    """The scenario on agents already started; the report."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    topic = f"chaos-kill-loop-{uuid.uuid4().hex[:8]}"
    configs = dict(item.split("=", 1) for item in args.topic_config)
    create_topic(agents.bootstrap, topic, args.partitions, configs)
    offsets_known = configs.get("bucketlog.topic.type", "classic") != "lightning"
    groups = [(topic, "", offsets_known)]
    if args.classic_alongside:
        create_topic(agents.bootstrap, f"{topic}-classic", args.partitions)
        groups.append((f"{topic}-classic", "classic-", True))
    by_topic = {
        name: [
            ChaosProducer(
                f"{prefix}{'idem' if i % 2 == 0 else 'plain'}{i}",
                i % 2 == 0,
                agents.bootstrap,
                name,
                args.partitions,
                args.rate,
                args.value_bytes,
                args.flush_timeout_s,
                args.client_log_level,
                known,
            )
            for i in range(args.producers)
        ]
        for name, prefix, known in groups
    }
    producers = [p for group in by_topic.values() for p in group]
    problems: list[str] = []
    for producer in producers:
        producer.start()
    warm_deadline = time.monotonic() + 60
    while not all(p.acks for p in producers) and time.monotonic() < warm_deadline:
        time.sleep(0.05)
    if not all(p.acks for p in producers):
        problems.append("a producer had no acknowledgement within 60 s of its start")

    began = time.monotonic()
    waited_s = 0.0  # time no agent was up to be killed
    next_kill = began
    kills_wanted = args.kills if agents.can_kill else 0
    while len(agents.kills) < kills_wanted and time.monotonic() - began < args.seconds:
        if any(p.fatal for p in producers):
            break
        pause = next_kill - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        waiting_since = time.monotonic()
        while agents.kill_one(rng) is None:
            if time.monotonic() - began >= args.seconds:
                break
            time.sleep(0.02)
        waited_s += time.monotonic() - waiting_since
        next_kill = max(next_kill + args.interval_s, time.monotonic())
    if kills_wanted == 0:
        time.sleep(max(0.0, args.seconds - (time.monotonic() - began)))
    kill_phase_s = time.monotonic() - began
    if len(agents.kills) < kills_wanted:
        print(f"--seconds {args.seconds:g} ran out after {len(agents.kills)} kills")

    if not agents.wait_all_up(60):
        problems.append("not every agent was up again within 60 s of the last kill")
    time.sleep(args.settle_s)
    for producer in producers:
        producer.stop()
    for producer in producers:
        producer.join()
    for producer in producers:
        if producer.fatal:
            problems.append(f"producer {producer.producer_name}: fatal error {producer.fatal}")

    sequenced_s = None
    if not offsets_known:
        # Answered before sequenced: read once every partition holds at least as many
        # records as were acknowledged in it (a dead agent's are sequenced by the sweep).
        acks = [ack for producer in by_topic[topic] for ack in producer.acks]
        sequenced_s = wait_for_sequencing(agents.bootstrap, topic, acks, args.read_timeout_s)
        if sequenced_s is None:
            problems.append("the acknowledged records were not all sequenced in time")
    read_began = time.monotonic()
    checks = {}
    for name, group in by_topic.items():
        records, ranges, complete = read_back(
            agents.bootstrap, name, args.partitions, args.read_timeout_s
        )
        if not complete:
            problems.append(f"the read-back of {name} did not reach every partition's end")
        acks = [ack for producer in group for ack in producer.acks]
        if not acks:
            problems.append(f"nothing was acknowledged on {name}")
        # Without idempotence, librdkafka may send a producer's newer records before
        # its retry of an older one that failed (seen on a lightning topic: one agent
        # got records 144 and 152 of a plain producer in one request, 0 to 136 in a
        # later one; on a classic one: record 99, then a batch of 91, 107, 115 and 123).
        # Only idempotent producers are promised their order; the others' is counted.
        checks[name] = (
            checker.check(
                acks,
                records,
                ranges,
                {p.producer_name: p.idempotent for p in group},
                plain_order=False,
            ),
            records,
            ranges,
            complete,
        )
    read_s = time.monotonic() - read_began
    result, records, ranges, complete = checks[topic]
    classic = checks.get(f"{topic}-classic")

    kills = agents.kills
    return {
        "topic": topic,
        "seed": seed,
        "kills": {
            "count": len(kills),
            "kill_phase_s": round(kill_phase_s, 1),
            "per_minute": round(len(kills) / kill_phase_s * 60, 1) if kill_phase_s else None,
            "waited_for_an_agent_up_s": round(waited_s, 1),
            "down_s": harness.percentiles([k.down_s for k in kills if k.down_s is not None]),
            "stopped_by": "kills" if len(kills) >= kills_wanted else "seconds",
            "notes": agents.notes,
            "fields": ["at_s", "agent", "pid", "down_s"],
            "list": [k.as_row() for k in kills],
        },
        "producers": [p.describe() for p in producers],
        "read_back": {
            "sequenced_after_s": None if sequenced_s is None else round(sequenced_s, 1),
            "records": len(records),
            "seconds": round(read_s, 1),
            "complete": complete,
            "end_offsets": {str(p): list(r) for p, r in sorted(ranges.items())},
        },
        "check": result.summary(),
        **({"check_classic": classic[0].summary()} if classic else {}),
        "problems": problems,
        "ok": result.ok and (classic is None or classic[0].ok) and not problems,
        "exit_status": 2
        if problems
        else (0 if result.ok and (classic is None or classic[0].ok) else 1),
    }


def _print_examples(check: dict[str, Any], prefix: str, out: Any) -> None:
    """A few examples of each anomaly (the allowed kinds left out)."""
    for kind, examples in check["examples"].items():
        if examples and not kind.startswith("other_"):
            print(f"  {prefix}{kind}: {examples[:3]}", file=out)


def print_summary(report: dict[str, Any], out: Any = sys.stdout) -> None:
    kills, check = report["kills"], report["check"]
    acked = sum(p["acknowledged"] for p in report["producers"])
    print(
        f"kill loop: {kills['count']} kills in {kills['kill_phase_s']} s "
        f"({kills['per_minute']}/min, down p50 {kills['down_s']['p50']} s, "
        f"max {kills['down_s']['max']} s); {acked} acknowledged, "
        f"{report['read_back']['records']} read back",
        file=out,
    )
    anomalies = ", ".join(f"{k} {v}" for k, v in check["anomalies"].items())
    print(
        f"  anomalies: {anomalies}; allowed: duplicates without idempotence "
        f"{check['other_duplicates']}, out of order without idempotence "
        f"{check['other_out_of_order']}, read but not acknowledged {check['unacknowledged_read']}",
        file=out,
    )
    _print_examples(check, "", out)
    if "check_classic" in report:
        classic = report["check_classic"]
        anomalies = ", ".join(f"{k} {v}" for k, v in classic["anomalies"].items())
        print(
            f"  classic topic alongside: {classic['acknowledged']} acknowledged; anomalies: "
            f"{anomalies}",
            file=out,
        )
        _print_examples(classic, "classic ", out)
    for problem in report["problems"]:
        print(f"  problem: {problem}", file=out)
    print("  OK" if report["ok"] else "  FAILED", file=out)


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the kill loop; `env`: extra environment of every agent started (tests)."""
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
                "rate",
                "value_bytes",
                "kills",
                "interval_s",
                "seconds",
                "settle_s",
                "topic_config",
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
