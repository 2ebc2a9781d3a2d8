"""Compacted topics: how long the cleaner takes to leave one record per key, at what rate
and memory, and what a restore (a read from the start to the end) costs before and after.

    .venv/bin/python integration/bench/compacted.py [--updates 1000000] [--keys 10000]
        [--partitions 8] [--value-bytes 1024] [--agent-arg=--option=value ...]
        [--label compacted] [--out DIR]

On one `bucketlog serve` agent (embedded stores: a local folder and SQLite) in a fresh
temp dir, each step on a freshly started agent of the same data dir (nothing cached):

1. produce: the cleaner off (`--log-cleaner-enable false`), a topic of PARTITIONS
   partitions with cleanup.policy=compact and min.compaction.lag.ms=0; confluent-kafka
   produces UPDATES records, update i to key `key-{i % KEYS}` (Java's murmur2
   partitioner), acks=all, linger.ms=50, batch.size=1 MiB, no compression (Kafka's
   default). Each value starts with `key:i:` and is padded with random bytes to
   VALUE_BYTES, so a reader knows which update it got. Then level-1 compaction
   (defaults) is left to merge the ingest files, as it would before a real cleaning;
2. restore before cleaning: a confluent-kafka consumer assigned to every partition at
   offset 0 (read_uncommitted, as a Kafka Streams restore without exactly-once) reads to
   the end offsets and builds the table key -> value; it must hold UPDATES records;
3. cleaning: the cleaner on (its first pass as the agent starts; passes back to back
   while they find work, then `--cleaner-backoff-ms` apart: 1 s here, Kafka's default
   is 15 s); the metadata store is polled until every
   partition's first dirty offset reached its high watermark (every record at least
   once cleaned against a map of all its later keys), while the agent's RSS is sampled;
4. restore after cleaning, as in 2; it must hold exactly one record per key, each the
   key's last update, and both tables must be the same. Anything else is a failure:
   the script says what it found and exits with status 1.

Every agent deletes replaced objects 2 s after their last entry
(`--object-delete-delay-ms`, 60 s by default), so that the store listed after a step
holds only what the log names; besides that and the cleaner's switch and back-off,
every setting is the agent's default. Writes `results/<date>-<label>.md` and `.json`
(the machine, the settings, every figure and the agents' counters). A measurement, not
a test: `make test` does not run it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import run as bench  # noqa: E402  (the harness's helpers: the machine's description)

from metadata import cleaning as cleaning_layer  # noqa: E402
from metadata import keys, log  # noqa: E402
from metadata import topics as topics_layer  # noqa: E402
from tests.support.brokerproc import BrokerProcess, free_ports  # noqa: E402

MB = 1_000_000
TOPIC = "compacted"
BATCH_BYTES = 1024 * 1024
LINGER_MS = 50
# Replaced objects go 2 s after their last entry (Kafka's file.delete.delay.ms is 60 s),
# so that the store listed after a step holds only what the log names.
DELETE_DELAY = ["--object-delete-delay-ms", "2000"]
DELETE_WAIT_S = 6.0  # the delay, and a few garbage collections (one each 0.5 s)
POLL_S = 0.5
SETTLE_AFTER_S = 40.0  # --compaction-min-age-ms (30 s) and --compaction-interval-ms (5 s)
SETTLED_S = 20.0
CLEANING_POLL_S = 0.1  # the cleaning's end is known this late at most (a read takes ~2 ms)
RSS_EVERY_S = 0.5
CONSUME_WAIT_S = 0.05  # consume() waits this long for a full batch: a read ends this late at most
CLEANER_OFF = [*DELETE_DELAY, "--log-cleaner-enable", "false", "--log-level", "WARNING"]


class BenchFailure(Exception):
    """The broker did not do what the benchmark needs: a wrong read, or a timeout."""


def now() -> str:
    return f"{datetime.datetime.now():%H:%M:%S}"


def say(line: str) -> None:
    print(f"[{now()}] {line}", flush=True)


# -- the agent's process, its store and its metadata --------------------------------------


def proc_status_mb(pid: int, field: str) -> float:
    """A memory line of /proc/<pid>/status (VmHWM, VmRSS) in MB (10^6 B)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MB
    raise BenchFailure(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_listing(data_dir: Path) -> tuple[int, int]:
    """(objects, bytes) in the agent's local object store."""
    count = size = 0
    for folder, _dirs, files in os.walk(data_dir / "objects"):
        for name in files:
            if name.startswith("."):
                continue  # a write in progress
            try:
                size += os.path.getsize(os.path.join(folder, name))
                count += 1
            except OSError:
                pass
    return count, size


def log_state(broker: BrokerProcess, partitions: int) -> dict[str, Any]:
    """The topic's log as one metadata transaction sees it: per partition its high
    watermark, log start, first dirty offset, chunk entries and their bytes; and the
    objects the entries lie in (an object may hold several partitions)."""
    sub = keys.cluster_subspace("default")

    def read(tr: Any) -> dict[str, Any]:
        topic = topics_layer.get_topic(tr, sub, TOPIC)
        out, objects = [], set()
        for p in range(partitions):
            state = log.get_partition(tr, sub, topic.topic_id, p)
            entries = list(log.iter_entries(tr, sub, topic.topic_id, p, page=1024))
            objects.update(e.object_key for e in entries)
            out.append(
                {
                    "high_watermark": state.high_watermark,
                    "log_start_offset": state.log_start_offset,
                    "first_dirty_offset": cleaning_layer.first_dirty_offset(
                        tr, sub, topic.topic_id, p
                    ),
                    "entries": len(entries),
                    "bytes": sum(e.length for e in entries),
                }
            )
        return {"partitions": out, "objects": len(objects)}

    return dict(broker.read_metadata(read))


def ingest_files_queued(broker: BrokerProcess) -> int:
    """Ingest files waiting for level-1 compaction."""
    sub = keys.cluster_subspace("default")
    return len(broker.read_metadata(lambda tr: tr.get_range(*sub.range(keys.L0_OBJECT))))


def settle_level_1(broker: BrokerProcess, timeout_s: float) -> tuple[float, int]:
    """Wait until level-1 compaction has merged what it will; (seconds, files left).

    Done when at most one ingest file is queued (a lone last one is never merged), or
    when the queue has not changed for SETTLED_S after the default minimum age and a
    pass: with a small --compaction-max-job-bytes, files that no two fit in one job stay.
    """
    started = time.monotonic()
    queued, changed = ingest_files_queued(broker), started
    while queued > 1:
        now_s = time.monotonic()
        if now_s - started > SETTLE_AFTER_S and now_s - changed > SETTLED_S:
            break
        if now_s - started > timeout_s:
            raise BenchFailure(
                f"timed out after {timeout_s:.0f} s waiting for level-1 compaction: "
                f"{queued} ingest files queued"
            )
        time.sleep(POLL_S)
        count = ingest_files_queued(broker)
        if count != queued:
            queued, changed = count, time.monotonic()
    return time.monotonic() - started, queued


def final_stats(broker: BrokerProcess) -> dict[str, Any]:
    """The agent's counters once it has written them (the file is written each second)."""
    time.sleep(1.5)
    stats = broker.stats()
    if not stats:
        raise BenchFailure(f"no stats file under {broker.data_dir}")
    return stats


# -- clients ------------------------------------------------------------------------------


def create_compacted_topic(bootstrap: str, partitions: int, timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
    admin.create_topics([NewTopic(TOPIC, partitions, 1, config=config)])[TOPIC].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # until every partition has a leader
        md = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            if all(p.leader >= 0 for p in md.partitions.values()):
                return
        time.sleep(0.2)
    raise BenchFailure(f"topic {TOPIC} has no leaders after {timeout_s:.0f} s")


def produce(
    bootstrap: str, updates: int, key_count: int, value_bytes: int, timeout_s: float
) -> tuple[dict[str, Any], dict[bytes, int]]:
    """Produce the updates; their figures, and the last update sent to each key."""
    from confluent_kafka import KafkaError, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "batch.size": BATCH_BYTES,
            "compression.type": "none",
            "partitioner": "murmur2_random",  # the Java client's, as Kafka Streams writes
        }
    )
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    filler = os.urandom(value_bytes)
    key_names = [f"key-{k}".encode() for k in range(key_count)]
    last: dict[bytes, int] = {}
    started = time.monotonic()
    deadline = started + timeout_s
    for i in range(updates):
        key = key_names[i % key_count]
        head = key + b":%d:" % i
        value = head + filler[len(head) :]
        while True:
            try:
                producer.produce(TOPIC, value, key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
                if time.monotonic() > deadline:
                    raise BenchFailure(
                        f"produce: {i} of {updates} sent in {timeout_s:.0f} s"
                    ) from None
        producer.poll(0)
        last[key] = i
        if failed:
            raise BenchFailure(f"produce failed: {failed[0]}")
    left = producer.flush(max(1.0, deadline - time.monotonic()))
    if left or failed:
        raise BenchFailure(f"produce: {left} records never acknowledged, {len(failed)} failed")
    seconds = time.monotonic() - started
    return figures(updates, updates * value_bytes, seconds), last


def figures(records: int, value_bytes: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "value_bytes": value_bytes,
        "seconds": round(seconds, 2),
        "records_s": round(records / seconds),
        "mb_s": round(value_bytes / MB / seconds, 1),
    }


def restore(bootstrap: str, partitions: int, timeout_s: float) -> tuple[dict[str, Any], Any]:
    """Read every partition from offset 0 to its end offset; the figures and the table
    (key -> (update, records of the key seen))."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-restore",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        ends = {}
        for p in range(partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)
            ends[p] = high
        table: dict[bytes, tuple[int, int]] = {}
        at_end: set[int] = set()
        records = size = 0
        started = time.monotonic()
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
        while len(at_end) < partitions:
            if time.monotonic() - started > timeout_s:
                raise BenchFailure(
                    f"restore: {records} records in {timeout_s:.0f} s, partitions "
                    f"{sorted(set(ends) - at_end)} not at their end offsets {ends}"
                )
            for msg in consumer.consume(10_000, CONSUME_WAIT_S):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise BenchFailure(f"restore: {err}")
                    if msg.offset() >= ends[msg.partition()]:
                        at_end.add(msg.partition())
                    continue
                if msg.offset() >= ends[msg.partition()] - 1:
                    # The partition's last offset: at its end without waiting for the next
                    # Fetch's EOF (which the broker holds up to fetch.wait.max.ms). The
                    # newest record of a partition is always the newest of its key: kept.
                    at_end.add(msg.partition())
                value = msg.value()
                key, update, _rest = value.split(b":", 2)
                if key != msg.key():
                    raise BenchFailure(
                        f"record {msg.partition()}@{msg.offset()}: key {msg.key()!r} holds {key!r}'s value"
                    )
                seen = table.get(key, (0, 0))[1]
                table[key] = (int(update), seen + 1)
                records += 1
                size += len(value)
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return figures(records, size, seconds), table


def check(
    name: str, table: dict[bytes, tuple[int, int]], records: int, last: dict[bytes, int], once: bool
) -> None:
    """The restored table is the last update of every key; with `once`, each key was read
    exactly once (one live record per key)."""
    problems = []
    wrong = [k for k, update in last.items() if table.get(k, (None, 0))[0] != update]
    extra = set(table) - set(last)
    if wrong:
        problems.append(
            f"{len(wrong)} keys do not end with their last update, e.g. "
            + ", ".join(
                f"{k.decode()}: read {table.get(k, (None,))[0]}, last {last[k]}" for k in wrong[:5]
            )
        )
    if extra:
        problems.append(f"{len(extra)} keys never written, e.g. {sorted(extra)[:5]}")
    if once:
        repeated = {k: n for k, (_u, n) in table.items() if n > 1}
        if records != len(last):
            problems.append(f"{records} records for {len(last)} keys")
        if repeated:
            problems.append(
                f"{len(repeated)} keys read more than once, e.g. "
                + ", ".join(f"{k.decode()} x{n}" for k, n in list(repeated.items())[:5])
            )
    if problems:
        raise BenchFailure(f"restore {name}: " + "; ".join(problems))


# -- the run ------------------------------------------------------------------------------


def cleaning_progress(broker: BrokerProcess, partitions: int) -> list[tuple[int, int]]:
    """(high watermark, first dirty offset) of each partition: a read of a few keys."""
    sub = keys.cluster_subspace("default")

    def read(tr: Any) -> list[tuple[int, int]]:
        topic_id = topics_layer.get_topic(tr, sub, TOPIC).topic_id
        return [
            (
                log.get_partition(tr, sub, topic_id, p).high_watermark,
                cleaning_layer.first_dirty_offset(tr, sub, topic_id, p),
            )
            for p in range(partitions)
        ]

    return list(broker.read_metadata(read))


def clean(
    broker: BrokerProcess, partitions: int, timeout_s: float
) -> dict[str, Any]:
    """Wait until every partition is cleaned to its high watermark; what it took."""
    assert broker.proc is not None
    pid = broker.proc.pid  # with --agents 1, `serve` is the agent itself (no fork)
    started = time.monotonic()
    rss_start = proc_status_mb(pid, "VmRSS")
    cpu_start = cpu_seconds(pid)
    rss: list[tuple[float, float]] = []
    cleaned_at: dict[int, float] = {}  # partition -> seconds until its round reached the end
    progress: list[tuple[int, int]] = []
    while len(cleaned_at) < partitions:
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            raise BenchFailure(
                f"timed out after {timeout_s:.0f} s waiting for the cleaning; (high watermark, "
                f"first dirty offset) of each partition: {progress}; cleaning counters: "
                f"{broker.stats().get('cleaning')}"
            )
        progress = cleaning_progress(broker, partitions)
        for p, (high_watermark, first_dirty) in enumerate(progress):
            if first_dirty >= high_watermark and p not in cleaned_at:
                cleaned_at[p] = round(elapsed, 2)
        if len(rss) < elapsed / RSS_EVERY_S:
            rss.append((round(elapsed, 1), round(proc_status_mb(pid, "VmRSS"), 1)))
        time.sleep(CLEANING_POLL_S)
    seconds = max(cleaned_at.values())
    cpu = cpu_seconds(pid) - cpu_start
    peak = proc_status_mb(pid, "VmHWM")
    stats = final_stats(broker)
    return {
        "seconds_to_one_per_key": seconds,
        # The cleaner's first pass comes as the agent starts, and passes follow each other
        # without the back-off while they find work: all of it is cleaning.
        "seconds_cleaning": seconds,
        "partition_cleaned_s": [cleaned_at[p] for p in range(partitions)],
        "agent_cpu_s": round(cpu, 2),
        "agent_rss_start_mb": round(rss_start, 1),
        "agent_peak_rss_mb": round(peak, 1),
        "rss_samples_mb": rss,
        "cleaning": stats.get("cleaning", {}),
        "compaction": stats.get("compaction", {}),
        "store": stats.get("store", {}),
    }


def summary(before: dict[str, Any], after: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """The cleaning's figures, from the log before and after it and its counters."""
    log_before = sum(p["bytes"] for p in before["partitions"])
    log_after = sum(p["bytes"] for p in after["partitions"])
    counters = c["cleaning"]
    store = c["store"]
    seconds = max(c["seconds_cleaning"], 1e-3)
    cleaner_cpu = counters.get("cpu_seconds", 0.0)
    return {
        "log_mb_before": round(log_before / MB, 1),
        "log_mb_after": round(log_after / MB, 1),
        "cleaning_mb_s": round(log_before / MB / seconds, 1),
        "store_mb_read": round(store.get("bytes_got", 0) / MB, 1),
        "store_mb_read_s": round(store.get("bytes_got", 0) / MB / seconds, 1),
        "store_mb_written": round(store.get("bytes_put", 0) / MB, 1),
        "mb_per_agent_cpu_s": round(log_before / MB / max(c["agent_cpu_s"], 1e-3), 1),
        "cleaner_cpu_s": round(cleaner_cpu, 2),
        "rounds": counters.get("rounds", 0),
        "rounds_stopped": counters.get("rounds_stopped", 0),
        "failures": counters.get("failures", 0),
        "records_read": counters.get("records_read", 0),
        "records_removed": counters.get("records_removed", 0),
        "entries_before": sum(p["entries"] for p in before["partitions"]),
        "entries_after": sum(p["entries"] for p in after["partitions"]),
        "objects_before": before["objects"],
        "objects_after": after["objects"],
    }


def markdown(report: dict[str, Any]) -> str:
    s, f = report["settings"], report["cleaning_figures"]
    c = report["cleaning"]
    lines = [
        f"# Compacted topics: cleaning ({report['date']}, {report['label']})",
        "",
        f"Machine: {report['machine']}",
        "",
        f"Workload: {s['updates']:,} updates over {s['keys']:,} keys, {s['value_bytes']} B "
        f"values, {s['partitions']} partitions, cleanup.policy=compact, "
        f"min.compaction.lag.ms=0; confluent-kafka {s['client']} producer (acks=all, "
        f"linger.ms={LINGER_MS}, batch.size={BATCH_BYTES}, no compression); one agent, "
        f"embedded stores; cleaner back-off {s['cleaner_backoff_ms']} ms, "
        f"dedupe buffer {s['dedupe_buffer_size']} B"
        + (f", agent arguments {' '.join(s['agent_args'])}" if s["agent_args"] else "")
        + f". Level-1 compaction settled {report['settle_s']} s after the produce, "
        f"{report['ingest_files_left']} ingest files left unmerged.",
        "",
        "| step | records | MB of values | seconds | records/s | MB/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (
        ("produce", report["produce"]),
        ("restore before cleaning", report["restore_before"]),
        ("restore after cleaning", report["restore_after"]),
    ):
        lines.append(
            f"| {name} | {r['records']:,} | {r['value_bytes'] / MB:.1f} | {r['seconds']} | "
            f"{r['records_s']:,} | {r['mb_s']} |"
        )
    lines += [
        "",
        "| cleaning | |",
        "|---|---|",
        f"| seconds to one record per key (from the agent listening) | {c['seconds_to_one_per_key']} |",
        f"| seconds cleaning | {c['seconds_cleaning']} |",
        f"| first / last partition cleaned at (s) | {min(c['partition_cleaned_s'])} / "
        f"{max(c['partition_cleaned_s'])} |",
        f"| log MB before → after | {f['log_mb_before']} → {f['log_mb_after']} |",
        f"| cleaning MB/s (log before ÷ seconds cleaning) | {f['cleaning_mb_s']} |",
        f"| MB read from the store (MB/s) | {f['store_mb_read']} ({f['store_mb_read_s']}) |",
        f"| MB written to the store | {f['store_mb_written']} |",
        f"| records read / removed by the cleaner | {f['records_read']:,} / {f['records_removed']:,} |",
        f"| rounds finished / stopped / failed passes | {f['rounds']} / {f['rounds_stopped']} / {f['failures']} |",
        f"| agent CPU s (MB of log per CPU s) | {c['agent_cpu_s']} ({f['mb_per_agent_cpu_s']}) |",
        f"| cleaner CPU s (its counter) | {f['cleaner_cpu_s']} |",
        f"| agent peak RSS MB (RSS at start) | {c['agent_peak_rss_mb']} ({c['agent_rss_start_mb']}) |",
        f"| chunk entries before → after | {f['entries_before']:,} → {f['entries_after']:,} |",
        f"| objects of the log before → after | {f['objects_before']:,} → {f['objects_after']:,} |",
        f"| store objects, MB before → after (listed) | {report['store_before'][0]:,}, "
        f"{report['store_before'][1] / MB:.1f} → {report['store_after'][0]:,}, "
        f"{report['store_after'][1] / MB:.1f} |",
        "",
        f"Check: the restore before read {report['restore_before']['records']:,} records and "
        f"the restore after {report['restore_after']['records']:,}, one per key, each the key's "
        "last update.",
        "",
        f"Cleaning counters: {json.dumps(c['cleaning'])}",
        "",
        f"Compaction counters while cleaning: {json.dumps(c['compaction'])}",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--cleaner-backoff-ms", type=int, default=1000)
    parser.add_argument(
        "--dedupe-buffer-size", type=int, default=128 * 1024 * 1024, help="the agent's default"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=1800, help="how long any one step may take"
    )
    parser.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        help="an argument for every agent (repeat; e.g. --agent-arg=--compaction-max-job-bytes=N)",
    )
    parser.add_argument("--label", default="compacted")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args()
    if args.keys < 1 or args.updates < args.keys:
        parser.error("needs 1 <= --keys <= --updates")
    if args.value_bytes < len(f"key-{args.keys}:{args.updates}:"):
        parser.error("--value-bytes too small to hold the key and update number")

    import confluent_kafka

    started = datetime.datetime.now(datetime.UTC)
    machine = bench.machine()
    work = Path(tempfile.mkdtemp(prefix="bench-compacted-"))
    data_dir = work / "data"
    port = free_ports(1)[0]
    broker: BrokerProcess | None = None
    timeout = args.timeout_s

    def start(extra: list[str]) -> BrokerProcess:
        nonlocal broker
        # A stats file left by the agent before would pass for this one's.
        (data_dir / f"stats-{port}.json").unlink(missing_ok=True)
        agent_args = [*extra, *args.agent_arg]
        broker = BrokerProcess(data_dir=data_dir, port=port, extra_args=agent_args).start()
        return broker

    def stop() -> None:
        if broker is not None:
            broker.stop()

    say(f"data dir {data_dir}; {args.updates:,} updates over {args.keys:,} keys")
    try:
        b = start(CLEANER_OFF)
        create_compacted_topic(b.bootstrap, args.partitions, timeout)
        produced, last = produce(b.bootstrap, args.updates, args.keys, args.value_bytes, timeout)
        say(f"produce: {produced}")
        settle, unmerged = settle_level_1(b, timeout)
        say(f"level-1 compaction settled after {settle:.1f} s, {unmerged} ingest files left")
        time.sleep(DELETE_WAIT_S)  # the ingest files it replaced are deleted
        stop()

        b = start(CLEANER_OFF)
        before_state = log_state(b, args.partitions)
        store_before = store_listing(data_dir)
        restored_before, table = restore(b.bootstrap, args.partitions, timeout)
        say(f"restore before cleaning: {restored_before}")
        if restored_before["records"] != args.updates:
            raise BenchFailure(
                f"restore before cleaning read {restored_before['records']} of {args.updates} records"
            )
        check("before cleaning", table, restored_before["records"], last, once=False)
        table_before = {k: u for k, (u, _n) in table.items()}
        stop()

        b = start(
            [
                "--log-cleaner-backoff-ms",
                str(args.cleaner_backoff_ms),
                "--log-cleaner-dedupe-buffer-size",
                str(args.dedupe_buffer_size),
                *DELETE_DELAY,
            ]
        )
        cleaning = clean(b, args.partitions, timeout)
        say(
            f"one record per key after {cleaning['seconds_to_one_per_key']} s, "
            f"peak RSS {cleaning['agent_peak_rss_mb']} MB"
        )
        # Replaced objects are deleted a few garbage collections after the delete delay.
        time.sleep(DELETE_WAIT_S)
        store_after = store_listing(data_dir)
        stop()

        b = start(CLEANER_OFF)
        after_state = log_state(b, args.partitions)
        restored_after, table = restore(b.bootstrap, args.partitions, timeout)
        say(f"restore after cleaning: {restored_after}")
        check("after cleaning", table, restored_after["records"], last, once=True)
        if {k: u for k, (u, _n) in table.items()} != table_before:
            raise BenchFailure("the tables restored before and after cleaning differ")
        stop()
    except BenchFailure as exc:
        stop()
        log_path = broker.log_path if broker is not None else None
        print(f"FAILED: {exc}\n(data dir and agent log kept: {work}, {log_path})", file=sys.stderr)
        return 1
    finally:
        stop()

    report = {
        "date": started.isoformat(timespec="seconds"),
        "label": args.label,
        "machine": (
            f"{machine['nproc']} cores ({machine['cpu_model']}), {machine['memory_gb']} GB, "
            f"Linux {machine['kernel']}, Python {machine['python']}, load average at start "
            f"{' '.join(f'{x:.2f}' for x in machine['loadavg_at_start'])}"
        ),
        "settings": {
            "updates": args.updates,
            "keys": args.keys,
            "partitions": args.partitions,
            "value_bytes": args.value_bytes,
            "cleaner_backoff_ms": args.cleaner_backoff_ms,
            "dedupe_buffer_size": args.dedupe_buffer_size,
            "client": f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})",
            "agent_args": args.agent_arg,
        },
        "produce": produced,
        "settle_s": round(settle, 1),
        "ingest_files_left": unmerged,
        "restore_before": restored_before,
        "restore_after": restored_after,
        "store_before": store_before,
        "store_after": store_after,
        "log_before": before_state,
        "log_after": after_state,
        "cleaning": cleaning,
        "cleaning_figures": summary(before_state, after_state, cleaning),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    stem = started.strftime("%Y-%m-%d") + f"-{args.label}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out / f"{stem}.md").write_text(text)
    print(text)
    say(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
