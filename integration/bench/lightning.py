"""Lightning against classic topics under an object-store latency model: produce and
end-to-end latency at a fixed rate.

    .venv/bin/python integration/bench/lightning.py [--seconds 15] [--warmup-s 3]
                                                    [--rate 500] [--label lightning]

What it does:

1. starts moto's S3 server (`moto_server`, one bucket) and measures its own PUT latency
   from this process (the rig adds it to every modelled PUT);
2. for each latency model (S3 Express One Zone-like, S3 Standard-like; see MODELS and
   integration/bench/README.md for the figures and where they come from), each flush
   interval (25 and 250 ms) and each topic type (classic, lightning): starts a fresh
   `bucketlog serve --agents 1` on the S3 store with `--inject-put-latency-ms` (the
   model's PUT latency) and a `faulty+sqlite://` metadata URL with `commit_latency_ms`
   (the model's metadata commit latency), creates a one-partition topic, and runs one
   producer (acks=all, linger.ms=5) at `--rate` 1 KiB records/s with
   one tailing consumer in this process: `--warmup-s` not recorded, then `--seconds`
   recorded. Produce latency = delivery callback - send; end-to-end = consumer receive
   - the send time carried in the record's first 8 bytes. Each with three producers
   (PRODUCERS): idempotent, the issue's workload, and one with idempotence off and its
   requests pipelined (librdkafka's idempotent producer sends one request per partition
   at a time), both confluent-kafka; and the Java producer, idempotent with up to 5
   requests in flight (integration/java/FixedRateProducer.java, the same records, its
   own latencies); and, as a diagnostic, both topic types without hedged PUTs
   (DIAGNOSTICS);
3. writes results/<date>-<label>.json, .md and .png (latency CDFs, classic against
   lightning, per model, flush interval and producer), with the machine's description
   and the targets checked: lightning produce p99 <= the model's PUT p99 + flush
   interval + 5 ms, and lightning end-to-end p99 <= classic end-to-end p99.

`--render JSON` writes the markdown and the plot again from a report and runs nothing.
Takes about 11 minutes on 2 cores (28 runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the harness's helpers: systems, ports, machine)

RECORD_SIZE = 1024
LINGER_MS = 5
FLUSH_INTERVALS_MS = (25, 250)
TOPIC_TYPES = ("classic", "lightning")
# Diagnostic runs: both topic types without hedged PUTs (storage.hedge: on by default on
# S3), for the producer without the client's queue. Name -> (topic type, agent
# arguments, producers).
DIAGNOSTICS: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "classic-no-hedge": ("classic", ["--put-hedge-percentile", "0"], ("unbounded",)),
    "lightning-no-hedge": ("lightning", ["--put-hedge-percentile", "0"], ("unbounded",)),
}
# The producer the issue asks for, and one that pipelines its requests: librdkafka's
# idempotent producer sends one Produce request per partition at a time (librdkafka PR
# 4989, open), so with one partition a record waits in the client for the previous
# request's answer, i.e. for up to a whole flush cycle, before its own.
# The Java producer (integration/java/FixedRateProducer.java) pipelines an idempotent
# producer's requests, up to 5 per partition: the idempotent workload without the wait.
PRODUCERS: dict[str, dict[str, Any]] = {
    "idempotent": {"enable.idempotence": True},
    "unbounded": {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1000},
    # A batch of one partition is at most batch.size, and a request holds one batch per
    # partition: with Java's 16 KB default, 5 requests in flight of a flush cycle each
    # carry less than this rate (a larger batch.size is the usual advice for brokers on
    # object stores).
    "java-idempotent": {
        "client": "java",
        "enable.idempotence": "true",
        "max.in.flight.requests.per.connection": "5",
        "batch.size": "1000000",
    },
}
JAVA_PRODUCER = HERE.parent / "java" / "FixedRateProducer.java"
BUCKET = "bench-lightning"
TARGET_MARGIN_MS = 5.0
CREDENTIALS = bench.S3_CREDENTIALS

# Latency models: (median, p99) in ms. Sources in integration/bench/README.md
# ("Lightning topics under an object-store latency model"); what no source states is
# marked as an assumption there and in the results.
MODELS: dict[str, dict[str, Any]] = {
    "s3-express-one-zone": {
        "title": "S3 Express One Zone-like",
        "put_ms": (5.0, 15.0),
        "commit_ms": (3.0, 10.0),
    },
    "s3-standard": {
        "title": "S3 Standard-like",
        "put_ms": (40.0, 200.0),
        "commit_ms": (3.0, 10.0),
    },
}
SOURCES = [
    "S3 Express One Zone: 'consistent single-digit millisecond first-byte read and write "
    "request latencies - up to 10x faster than S3 Standard' "
    "(https://docs.aws.amazon.com/AmazonS3/latest/userguide/s3-express-performance.html). "
    "Median 5 ms from it; p99 15 ms is an assumption (AWS states no percentile).",
    "S3 Standard: 'when you make smaller requests (for example, less than 512 KB), where "
    "median latencies are often in the tens of milliseconds range' (https://docs.aws.amazon"
    ".com/whitepapers/latest/s3-optimizing-performance-best-practices/timeouts-and-retries-"
    "for-latency-sensitive-applications.html); WarpStream: 'the minimum latency for a PUT "
    "operation in traditional object stores is on the order of a few hundred milliseconds' "
    "(https://www.warpstream.com/blog/the-art-of-being-lazy-log-lower-latency-and-higher-"
    "availability-with-delayed-sequencing). Median 40 ms from the first; p99 200 ms is an "
    "assumption between the two.",
    "Metadata commit (FoundationDB): at under 75% load, start transaction 0.3-1 ms, read "
    "0.1-1 ms, commit 1.5-2.5 ms (https://apple.github.io/foundationdb/performance.html). "
    "Median 3 ms for a transaction (start, reads, commit); p99 10 ms is an assumption.",
    "WarpStream's figures for comparison (same blog post; docs.warpstream.com 'Low Latency "
    "Clusters'): S3 Express One Zone, 25 ms batch timeout, 10 ms linger: lightning produce "
    "p50 33 ms, p99 50 ms; classic on S3 Express One Zone p50 105 ms, p99 170 ms.",
]


def log(line: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {line}", flush=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def summary(values_s: list[float]) -> dict[str, float]:
    if not values_s:
        return {"n": 0}
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


# The quantiles kept for the plot: every 0.5% up to 99%, then every 0.1%.
QUANTILE_GRID = [i / 1000 for i in range(0, 990, 5)] + [i / 1000 for i in range(990, 1001)]


def quantiles(values_s: list[float]) -> list[float]:
    """values_s's quantiles at QUANTILE_GRID, in ms."""
    if not values_s:
        return []
    ordered = sorted(values_s)
    last = len(ordered) - 1
    return [round(ordered[round(last * q)] * 1000, 2) for q in QUANTILE_GRID]


# -- moto -------------------------------------------------------------------------------


def put_latency(moto: bench.Moto, size: int, count: int) -> dict[str, float]:
    """PUT latency of moto alone, from this process, objects of `size` bytes."""
    client = moto.client()
    body = os.urandom(size)
    took = []
    for i in range(count):
        started = time.monotonic()
        client.put_object(Bucket=moto.bucket, Key=f"probe/{size}/{i}", Body=body, IfNoneMatch="*")
        took.append(time.monotonic() - started)
    return summary(took)


# -- one run ----------------------------------------------------------------------------


def agent_stats(system: bench.Bucketlog) -> dict[str, Any]:
    path = system.dir / "data" / f"stats-{system.port}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def fresh_stats(system: bench.Bucketlog) -> dict[str, Any]:
    """The agent's counters as of now (it writes them once a second when they change)."""
    time.sleep(1.2)
    return agent_stats(system)


def counter_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    out = {}
    for group in ("pipeline", "journal", "store", "store_injected", "metadata", "put_hedge"):
        for name, value in after.get(group, {}).items():
            if isinstance(value, int):
                out[f"{group}.{name}"] = value - int(before.get(group, {}).get(name, 0))
    return out


def put_time(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """p50/p99/max of the PUTs' whole time as the agent saw it (injected delay + moto),
    from the histogram of storage.injected (1 ms buckets below 100 ms; upper bounds)."""
    old = before.get("store_injected", {}).get("put_ms_le", {})
    new = after.get("store_injected", {}).get("put_ms_le", {})
    counts = sorted(
        (float(bound), count - old.get(bound, 0))
        for bound, count in new.items()
        if count - old.get(bound, 0) > 0
    )
    total = sum(count for _bound, count in counts)
    if not total:
        return {"n": 0}
    out: dict[str, float] = {"n": total}
    for label, p in (("p50_ms", 50), ("p99_ms", 99)):
        seen = 0
        for bound, count in counts:
            seen += count
            if seen >= total * p / 100:
                out[label] = bound
                break
    out["max_ms"] = counts[-1][0]
    return out


def create_topic(bootstrap: str, name: str, topic_type: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"bucketlog.topic.type": topic_type}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            md is not None
            and md.error is None
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {name} has no leader")


def fixed_rate(
    bootstrap: str,
    topic: str,
    producer_config: dict[str, Any],
    rate: int,
    warmup_s: float,
    seconds: float,
    on_measuring: Any,
) -> dict[str, Any]:
    """One producer at `rate` records/s and one tailing consumer; latencies of the records
    sent after the warm-up."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 500,
        }
    )
    consumer.assign([TopicPartition(topic, 0, -1)])  # the end: a tailing consumer
    e2e: list[float] = []
    stop = threading.Event()
    measured_from_ns = [0]

    def tail() -> None:
        while not stop.is_set():
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                sent_ns = int.from_bytes(m.value()[:8], "big")
                if measured_from_ns[0] and sent_ns >= measured_from_ns[0]:
                    e2e.append(time.time() - sent_ns / 1e9)

    reader = threading.Thread(target=tail, daemon=True)
    reader.start()
    if producer_config.get("client") == "java":
        config = {k: v for k, v in producer_config.items() if k != "client"}
        sent, produce_s, acks, errors, left = java_fixed_rate(
            bootstrap, topic, config, rate, warmup_s, seconds, on_measuring, measured_from_ns
        )
    else:
        sent, produce_s, acks, errors, left = python_fixed_rate(
            bootstrap, topic, producer_config, rate, warmup_s, seconds, on_measuring,
            measured_from_ns,
        )  # fmt: skip
    deadline = time.monotonic() + 15
    while len(e2e) < sent and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join(10)
    consumer.close()
    return {
        "records": sent,
        "achieved_rate": round(sent / produce_s, 1),
        "acked": len(acks),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "unflushed": left,
        "seen": len(e2e),
        "produce": summary(acks),
        "end_to_end": summary(e2e),
        # For the plot: the quantiles at QUANTILE_GRID (not every record).
        "produce_ms": quantiles(acks),
        "end_to_end_ms": quantiles(e2e),
    }


def java_fixed_rate(
    bootstrap: str,
    topic: str,
    config: dict[str, Any],
    rate: int,
    warmup_s: float,
    seconds: float,
    on_measuring: Any,
    measured_from_ns: list[int],
) -> tuple[int, float, list[float], list[str], int]:
    """The Java producer at `rate`: (records measured, their seconds, acknowledgement
    latencies in s, errors, records never answered)."""
    argv = [
        *bench.kafka_class(str(JAVA_PRODUCER)),
        bootstrap, topic, str(rate), str(warmup_s), str(seconds), str(RECORD_SIZE),
        f"linger.ms={LINGER_MS}", "acks=all",
        *(f"{k}={v}" for k, v in config.items()),
    ]  # fmt: skip
    acks: list[float] = []
    errors: list[str] = []
    sent, produce_s = 0, seconds
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            what, _, rest = line.rstrip("\n").partition(" ")
            if what == "measuring":
                on_measuring()
                measured_from_ns[0] = time.time_ns()
            elif what == "ack":
                acks.append(int(rest) / 1_000_000)
            elif what == "error":
                errors.append(rest)
            elif what == "done":
                n, s = rest.split()
                sent, produce_s = int(n), float(s)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0 or not sent:
        assert proc.stderr is not None
        raise RuntimeError(
            f"the Java producer failed ({proc.returncode}): {proc.stderr.read()[-2000:]}"
        )
    return sent, produce_s, acks, errors, sent - len(acks) - len(errors)


def python_fixed_rate(
    bootstrap: str,
    topic: str,
    producer_config: dict[str, Any],
    rate: int,
    warmup_s: float,
    seconds: float,
    on_measuring: Any,
    measured_from_ns: list[int],
) -> tuple[int, float, list[float], list[str], int]:
    """confluent-kafka at `rate`, as java_fixed_rate."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            **producer_config,
        }
    )
    pad = b"x" * (RECORD_SIZE - 8)
    acks: list[float] = []
    errors: list[str] = []
    sent = 0
    warmup_n = int(rate * warmup_s)
    total = warmup_n + int(rate * seconds)
    start = time.monotonic()
    for i in range(total):
        if i == warmup_n:
            on_measuring()
            measured_from_ns[0] = time.time_ns()
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            producer.poll(delay)
        measured = i >= warmup_n
        sent_at = time.monotonic()

        def delivered(
            err: Any, _msg: Any, sent_at: float = sent_at, measured: bool = measured
        ) -> None:
            if err is not None:
                errors.append(str(err))
            elif measured:
                acks.append(time.monotonic() - sent_at)

        producer.produce(
            topic, time.time_ns().to_bytes(8, "big") + pad, partition=0, on_delivery=delivered
        )
        sent += measured
    produce_s = time.monotonic() - start - warmup_s
    left = producer.flush(30)
    return sent, produce_s, acks, errors, left


def one_run(
    moto: bench.Moto,
    model: dict[str, Any],
    flush_ms: int,
    producer: str,
    topic_type: str,
    args: argparse.Namespace,
    agent_args: list[str] | None = None,
) -> dict[str, Any]:
    put, commit = model["put_ms"], model["commit_ms"]
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    system = bench.Bucketlog(1)
    metadata = f"faulty+sqlite://{system.dir}/data/metadata.db?commit_latency_ms={commit[0]:g},{commit[1]:g}"
    system.extra_args = [
        "--storage", f"s3://{BUCKET}/{prefix}",
        "--s3-endpoint-url", moto.url,
        "--metadata", metadata,
        "--flush-interval-ms", str(flush_ms),
        "--inject-put-latency-ms", f"{put[0]:g},{put[1]:g}",
        *(agent_args or []),
    ]  # fmt: skip
    try:
        system.start()
        topic = f"{topic_type}-{flush_ms}-{producer}-{uuid.uuid4().hex[:6]}"
        create_topic(system.bootstrap, topic, topic_type)
        marks: dict[str, Any] = {}

        def cpu() -> tuple[float, float, float]:
            assert moto.proc is not None
            own = os.times()
            return (
                bench.tree_cpu_seconds(system.root_pid),
                bench.tree_cpu_seconds(moto.proc.pid),
                own.user + own.system,
            )

        def on_measuring() -> None:
            marks["stats"] = agent_stats(system)
            marks["cpu"] = cpu()

        result = fixed_rate(
            system.bootstrap,
            topic,
            PRODUCERS[producer],
            args.rate,
            args.warmup_s,
            args.seconds,
            on_measuring,
        )
        used = [round((b - a) / args.seconds, 2) for a, b in zip(marks["cpu"], cpu(), strict=True)]
        after = fresh_stats(system)
        deltas = counter_deltas(marks["stats"], after)
        puts = deltas.get("store_injected.put_delays", 0)
        # Cores busy while measuring (the flush and the wait for the consumer included).
        result["cpu_cores"] = dict(zip(("broker", "moto", "clients"), used, strict=True))
        # Other work on the machine shows here (the 1-minute load average at the end).
        result["loadavg_1m"] = round(os.getloadavg()[0], 2)
        result["put_seen_by_agent"] = put_time(marks["stats"], after)
        result["counters"] = deltas
        if puts:
            # What the agent saw: the injected delay, and the whole PUT (delay + moto).
            result["mean_injected_put_ms"] = round(
                deltas["store_injected.put_delay_us"] / puts / 1000, 2
            )
            result["mean_put_ms"] = round(deltas["store_injected.put_us"] / puts / 1000, 2)
        delays = deltas.get("metadata.injected_delays", 0)
        if delays:
            result["mean_injected_commit_ms"] = round(
                deltas["metadata.injected_delay_us"] / delays / 1000, 2
            )
            # The whole transaction as the agent saw it (delay, SQLite's commit, threads).
            result["mean_commit_ms"] = round(deltas["metadata.transact_us"] / delays / 1000, 2)
        return result
    finally:
        system.stop()


# -- the report -------------------------------------------------------------------------


def target_ms(model: dict[str, Any], flush_ms: int) -> float:
    return float(model["put_ms"][1]) + flush_ms + TARGET_MARGIN_MS


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, model in report["models"].items():
        for flush_ms in report["settings"]["flush_intervals_ms"]:
            for producer in report["settings"]["producers"]:
                runs = report["runs"][name][str(flush_ms)][producer]
                classic, lightning = runs["classic"], runs["lightning"]
                limit = target_ms(model, flush_ms)
                seen = lightning["put_seen_by_agent"].get("p99_ms")
                produce_p99 = lightning["produce"]["p99_ms"]
                out.append(
                    {
                        "model": name,
                        "flush_ms": flush_ms,
                        "producer": producer,
                        "lightning_produce_p99_ms": produce_p99,
                        "produce_target_ms": limit,
                        "produce_ok": produce_p99 <= limit,
                        # The same target with the PUT p99 the agent saw (model + moto).
                        "put_p99_seen_ms": seen,
                        "produce_target_seen_ms": None
                        if seen is None
                        else seen + flush_ms + TARGET_MARGIN_MS,
                        "produce_ok_seen": seen is not None
                        and produce_p99 <= seen + flush_ms + TARGET_MARGIN_MS,
                        "lightning_e2e_p99_ms": lightning["end_to_end"]["p99_ms"],
                        "classic_e2e_p99_ms": classic["end_to_end"]["p99_ms"],
                        "e2e_ok": lightning["end_to_end"]["p99_ms"]
                        <= classic["end_to_end"]["p99_ms"],
                        # The diagnostic run, where there is one (not a target).
                        "no_hedge_produce_p99_ms": runs.get("lightning-no-hedge", {})
                        .get("produce", {})
                        .get("p99_ms"),
                        "no_hedge_e2e_p99_ms": runs.get("lightning-no-hedge", {})
                        .get("end_to_end", {})
                        .get("p99_ms"),
                    }
                )
    return out


def hedged_share(run: dict[str, Any]) -> str:
    """The share of the run's flush PUTs that were sent a second time."""
    counters = run.get("counters", {})
    puts = counters.get("put_hedge.puts")
    if not puts:
        return "-"
    return f"{100 * counters.get('put_hedge.hedged', 0) / puts:.1f}%"


def loadavg(values: list[float] | None) -> str:
    return "?" if not values else " / ".join(f"{v:.2f}" for v in values)


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    machine = report["machine"]
    lines = [
        f"# Lightning vs classic topics under an object-store latency model ({report['date']})",
        "",
        f"Machine: {report['machine_line']}. Load average (1, 5, 15 min) at start "
        f"{loadavg(machine['loadavg_at_start'])}, at end {loadavg(machine.get('loadavg_at_end'))}"
        f"{'; ' + machine['note'] if machine.get('note') else ''}. "
        f"Took {report.get('duration_s')} s. Made by `integration/bench/lightning.py`.",
        "",
        "One `bucketlog serve --agents 1` per row (fresh data dir), the S3 store on moto "
        "(`moto_server`, same machine) with `--inject-put-latency-ms`, SQLite metadata behind "
        "`faulty+sqlite://...?commit_latency_ms=`; one partition; one producer "
        f"at {s['rate']} records/s of {s['record_size']} B (acks=all, linger.ms="
        f"{s['linger_ms']}) and one tailing consumer in the same process; "
        f"{s['warmup_s']:g} s warm-up not recorded, then {s['seconds']:g} s recorded. "
        "Produce = delivery callback - send; end-to-end = received - send time in the record.",
        "",
        "Producers: **idempotent** (`enable.idempotence=true`, the issue's workload) and "
        "**unbounded** (`enable.idempotence=false`, `max.in.flight.requests.per.connection="
        "1000`). librdkafka's idempotent producer sends one Produce request per partition at "
        "a time whatever max.in.flight says (https://github.com/confluentinc/librdkafka/pull/"
        "4989, open), so with one partition its records wait in the client for the previous "
        "request's answer, a whole flush cycle; the unbounded producer pipelines its "
        "requests and shows the broker's own latency. **java-idempotent**: Apache Kafka's "
        "Java producer (`enable.idempotence=true`, `max.in.flight.requests.per.connection=5`, "
        "integration/java/FixedRateProducer.java, the same records at the same rate), which "
        "pipelines an idempotent producer's requests, up to 5 per partition: the issue's "
        "workload without the client's wait. **classic-no-hedge** and "
        "**lightning-no-hedge** (diagnostics, unbounded producer only): the agent with "
        "`--put-hedge-percentile 0`, i.e. without hedged PUTs (on by default on S3: a PUT "
        "that outlasts the 95th percentile of the recent ones is sent a second time, the "
        "first answer wins; storage/hedge.py). *hedged* is the share of PUTs sent twice.",
        "",
        "## Latency models (median, p99 in ms; lognormal fitted to both)",
        "",
        "| model | PUT | metadata commit |",
        "|---|---|---|",
    ]
    for model in report["models"].values():
        put, commit = model["put_ms"], model["commit_ms"]
        lines.append(
            f"| {model['title']} | {put[0]:g}, {put[1]:g} | {commit[0]:g}, {commit[1]:g} |"
        )
    lines += ["", "Sources and assumptions:", ""]
    lines += [f"- {source}" for source in report["sources"]]
    probe = report["moto_put_latency"]
    lines += [
        "",
        "The rig's own PUT time comes on top of the model's. moto alone, measured from the "
        "benchmark process before the runs (one PUT at a time, If-None-Match): "
        + "; ".join(
            f"{int(size) // 1024} KiB p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms, "
            f"max {v['max_ms']} ms"
            for size, v in probe.items()
        )
        + ". The column *PUT seen* is the whole PUT as the agent timed it (injected delay + "
        "moto + thread hand-off; storage.injected's histogram, 1 ms buckets); *commit seen* "
        "the mean metadata transaction (injected delay + SQLite's commit with its fsync).",
        "",
        "## Results (ms)",
        "",
        "| model | flush | producer | topic | produce p50 | p99 | max | e2e p50 | p99 | max "
        "| records (seen) | errors | PUT seen p50 / p99 | hedged | commit seen (mean) "
        "| cores: broker / moto / clients |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, model in report["models"].items():
        for flush_ms in s["flush_intervals_ms"]:
            for producer in s["producers"]:
                for topic_type, r in report["runs"][name][str(flush_ms)][producer].items():
                    p, e, put = r["produce"], r["end_to_end"], r["put_seen_by_agent"]
                    cores = r["cpu_cores"]
                    lines.append(
                        f"| {model['title']} | {flush_ms} | {producer} | {topic_type} | "
                        f"{p['p50_ms']} | {p['p99_ms']} | {p['max_ms']} | {e['p50_ms']} | "
                        f"{e['p99_ms']} | {e['max_ms']} | {r['records']} ({r['seen']}) | "
                        f"{r['errors']} | {put.get('p50_ms', '-')} / {put.get('p99_ms', '-')} | "
                        f"{hedged_share(r)} | {r.get('mean_commit_ms', '-')} | "
                        f"{cores['broker']} / {cores['moto']} / {cores['clients']} |"
                    )
    lines += [
        "",
        "## Targets",
        "",
        f"Lightning produce p99 <= the model's PUT p99 + flush interval + {TARGET_MARGIN_MS:g} "
        "ms (and, for reference, the same with the PUT p99 the agent saw, model + moto); "
        "lightning end-to-end p99 <= classic end-to-end p99.",
        "",
        "| model | flush | producer | lightning produce p99 | target (model PUT p99) | met "
        "| target (PUT p99 seen) | met | lightning e2e p99 | classic e2e p99 | met "
        "| no-hedge produce / e2e p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    for c in report["checks"]:
        title = report["models"][c["model"]]["title"]
        lines.append(
            f"| {title} | {c['flush_ms']} | {c['producer']} | {c['lightning_produce_p99_ms']} | "
            f"{c['produce_target_ms']:g} | {yes(c['produce_ok'])} | "
            f"{c['produce_target_seen_ms']} | {yes(c['produce_ok_seen'])} | "
            f"{c['lightning_e2e_p99_ms']} | {c['classic_e2e_p99_ms']} | {yes(c['e2e_ok'])} | "
            + (
                f"{c['no_hedge_produce_p99_ms']} / {c['no_hedge_e2e_p99_ms']} |"
                if c.get("no_hedge_produce_p99_ms") is not None
                else "- |"
            )
        )
    if report.get("notes"):
        lines += ["", "## Notes", "", report["notes"]]
    lines += ["", f"Plot: `{report['plot']}` (latency CDFs).", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["settings"]
    rows = [(name, producer) for name in report["models"] for producer in s["producers"]]
    flushes = s["flush_intervals_ms"]
    fig, axes = plt.subplots(
        len(rows), len(flushes), figsize=(6 * len(flushes), 3.6 * len(rows)), squeeze=False
    )
    colors = {
        "classic": "tab:blue",
        "lightning": "tab:orange",
        "classic-no-hedge": "tab:cyan",
        "lightning-no-hedge": "tab:green",
    }
    for row, (name, producer) in enumerate(rows):
        model = report["models"][name]
        for col, flush_ms in enumerate(flushes):
            ax = axes[row][col]
            for topic_type, r in report["runs"][name][str(flush_ms)][producer].items():
                for key, style, what in (
                    ("produce_ms", "-", "produce"),
                    ("end_to_end_ms", "--", "end-to-end"),
                ):
                    values = r[key]  # at the quantiles of the grid
                    if not values:
                        continue
                    ys = s["quantile_grid"]
                    ax.plot(
                        values,
                        ys,
                        style,
                        color=colors.get(topic_type, "tab:gray"),
                        label=f"{topic_type} {what}",
                    )
            ax.axvline(target_ms(model, flush_ms), color="red", linewidth=0.8, linestyle=":")
            ax.axhline(0.99, color="grey", linewidth=0.5)
            ax.set_xscale("log")
            ax.set_ylim(0, 1.01)
            ax.set_title(f"{model['title']}, flush {flush_ms} ms, {producer} producer", fontsize=9)
            ax.set_xlabel("ms (red: lightning produce p99 target)", fontsize=8)
            ax.set_ylabel("fraction of records", fontsize=8)
            ax.grid(True, alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency CDFs, classic vs lightning (solid: produce, dashed: end-to-end)")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--warmup-s", type=float, default=3)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--producers", default=",".join(PRODUCERS))
    parser.add_argument(
        "--flush-intervals-ms", default=",".join(str(ms) for ms in FLUSH_INTERVALS_MS)
    )
    parser.add_argument("--no-diagnostics", action="store_true", help="skip DIAGNOSTICS' runs")
    parser.add_argument("--label", default="lightning")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--note", default="", help="what else ran on the machine, if known")
    parser.add_argument("--render", metavar="JSON", help="only write the .md and .png again")
    args = parser.parse_args()
    if args.render:
        source = Path(args.render)
        report = json.loads(source.read_text())
        plot(report, source.with_suffix(".png"))
        source.with_suffix(".md").write_text(markdown(report))
        return 0

    os.environ.update(CREDENTIALS)
    # This checkout's broker (BENCH_BUCKETLOG: another command, as for run.py).
    os.environ.setdefault("BENCH_BUCKETLOG", f"{sys.executable} -m broker")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(bench.REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    started = datetime.datetime.now(datetime.UTC)
    machine = bench.machine()
    machine.pop("kafka", None)
    if args.note:
        machine["note"] = args.note
    models = {name: MODELS[name] for name in args.models.split(",")}
    producers = args.producers.split(",")
    flush_intervals = [int(ms) for ms in args.flush_intervals_ms.split(",")]
    report: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine,
        "machine_line": (
            f"{machine['nproc']} cores ({machine['cpu_model']}), {machine['memory_gb']} GB, "
            f"Linux {machine['kernel']}, Python {machine['python']}"
        ),
        "settings": {
            "rate": args.rate,
            "record_size": RECORD_SIZE,
            "linger_ms": LINGER_MS,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "flush_intervals_ms": flush_intervals,
            "quantile_grid": QUANTILE_GRID,
            "topic_types": list(TOPIC_TYPES),
            "diagnostics": {
                k: {"agent_args": v[1], "producers": v[2]} for k, v in DIAGNOSTICS.items()
            },
            "producers": producers,
            "producer_configs": {name: PRODUCERS[name] for name in producers},
        },
        "models": models,
        "sources": SOURCES,
        "runs": {},
    }
    moto = bench.Moto(BUCKET)
    moto.start()
    try:
        # About one flush's object at 25 ms and at 250 ms of 500 records/s.
        report["moto_put_latency"] = {
            str(size): put_latency(moto, size, 200) for size in (16 * 1024, 128 * 1024)
        }
        log(f"moto PUT latency: {report['moto_put_latency']}")
        for name, model in models.items():
            for flush_ms in flush_intervals:
                for producer in producers:
                    kinds = [(t, t, []) for t in TOPIC_TYPES] + [
                        (kind, topic_type, agent_args)
                        for kind, (topic_type, agent_args, only) in DIAGNOSTICS.items()
                        if producer in only and not args.no_diagnostics
                    ]
                    for kind, topic_type, agent_args in kinds:
                        log(f"{name}, flush {flush_ms} ms, {producer} producer, {kind}")
                        result = one_run(
                            moto, model, flush_ms, producer, topic_type, args, agent_args
                        )
                        result["agent_args"] = agent_args
                        runs = report["runs"].setdefault(name, {}).setdefault(str(flush_ms), {})
                        runs.setdefault(producer, {})[kind] = result
                        log(
                            f"  produce {result['produce']}, end-to-end {result['end_to_end']},"
                            f" errors {result['errors']}, PUT seen {result['put_seen_by_agent']},"
                            f" cores {result['cpu_cores']}"
                        )
    finally:
        moto.stop()
    report["checks"] = checks(report)
    report["duration_s"] = round((datetime.datetime.now(datetime.UTC) - started).total_seconds())
    report["machine"]["loadavg_at_end"] = os.getloadavg()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = started.strftime("%Y-%m-%d") + f"-{args.label}"
    report["plot"] = f"{stem}.png"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / f"{stem}.png")
    (out / f"{stem}.md").write_text(markdown(report))
    log(f"wrote {out / stem}.md, .json and .png")
    for c in report["checks"]:
        log(str(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
