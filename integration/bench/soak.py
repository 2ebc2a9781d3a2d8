"""Soak: steady produce into a topic with a short retention, for long enough that
retention, garbage collection and compaction reach a steady state; then a catch-up read.

    .venv/bin/python integration/bench/soak.py --minutes 20 --label soak

What it does, on one bucketlog agent (the embedded stores, or BENCH_BUCKETLOG; with
`--store s3` its objects go to moto's S3 server on 127.0.0.1, started for the run):

1. measures the agent's maximum produce rate into the topic's partitions for a short
   while, and produces at `--fraction` of it (default half) from then on, in one-minute
   runs of Apache Kafka's ProducerPerformance (acks=all), back to back, so that each
   minute has its own latency percentiles; with `--warmup-s`, a run's percentiles leave
   out its first seconds of records (the tool's `--warmup-records`: each run is a new
   JVM, whose start-up is not the agent's latency), and its whole-run p99 is kept
   beside them;
2. every `--sample-s` seconds records: objects and bytes in the store (listed), chunk
   entries and objects as the metadata counts them, the metadata file's size, the
   lifecycle's and compaction's counters, and the agent's CPU seconds;
3. at the end reads the retained range from the earliest offset with ConsumerPerformance
   (a catch-up read: GETs per GB and MB/s), retention held meanwhile, and, for
   comparison, the same amount of data freshly written (read from the agent's cache);
4. writes `results/<date>-<label>.json`, a markdown table and a PNG plot of it all.

Targets (issue: the log's second half): objects, bytes and chunk entries flat once
retention is reached, bytes <= 1.3 x rate x retention; the catch-up read <= 20 GETs per
GB and at least as fast as reading fresh data; produce p99 with compaction <= 1.2 x
without (run once with `--agent-arg=--compaction=false` and compare).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the harness's helpers: systems, tools, counters)

MB = 1_000_000
T = TypeVar("T")


_stores: dict[str, Any] = {}  # one LocalObjectStore per agent's folder, for every sample


def store_listing(system: bench.Bucketlog) -> tuple[int, int]:
    """(objects, bytes) in the agent's local object store, as it lists them (the flushes
    packed into segment files count one each, at their size)."""
    from storage.local import LocalObjectStore

    root = str(system.dir / "data" / "objects")
    store = _stores.get(root)
    if store is None:
        store = _stores[root] = LocalObjectStore(root)
    listed = anyio.run(store.list)
    return len(listed), sum(info.size for info in listed)


class S3Listing:
    """(objects, bytes) under the agent's prefix of a bucket on moto's server."""

    def __init__(self, moto: bench.Moto, prefix: str) -> None:
        self.client = moto.client()
        self.bucket = moto.bucket
        self.prefix = prefix

    def __call__(self, system: bench.Bucketlog) -> tuple[int, int]:
        count = size = 0
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", ()):
                count += 1
                size += item["Size"]
        return count, size


def metadata_bytes(system: bench.Bucketlog) -> int:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        path = system.dir / "data" / f"metadata.db{suffix}"
        if path.exists():
            total += path.stat().st_size
    return total


def level_bytes(system: bench.Bucketlog) -> dict[str, int]:
    """Bytes of the objects the metadata records, by level and by whether something still
    names them ("L1": referenced level-1 objects; "L1 dead": level-1 objects waiting out
    the delete delay), read from the agent's SQLite file."""
    from metadata import keys

    sub = keys.cluster_subspace("default")

    def read(tr: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        begin, end = sub.range(keys.OBJECT)
        for _key, value in tr.get_range(begin, end):
            # (size, live entries, created_ms, dead_since_ms, level): metadata/keys.py
            size, _live, _created, dead_since, level = (*keys.unpack_value(value), None, None)[:5]
            name = f"L{'?' if level is None else level}" + ("" if dead_since is None else " dead")
            out[name] = out.get(name, 0) + int(size)
        return out

    return read_metadata(system, read, {})


def read_metadata(system: bench.Bucketlog, read: Callable[[Any], T], missing: T) -> T:
    """`read` run in a read transaction of the agent's SQLite file (`missing` before the
    file exists)."""
    from metadata.sqlite_kv import SQLiteKV

    path = system.dir / "data" / "metadata.db"
    if not path.exists():
        return missing
    kv = SQLiteKV(str(path))
    try:
        return kv.read_sync(read)
    finally:
        kv.close()


def object_census(system: bench.Bucketlog) -> list[dict[str, Any]]:
    """Every object the metadata still names (its delete delay not begun), with its
    level, size, the bytes its chunk entries still hold, the partitions they are of and
    the newest record time of the oldest and the newest of them: the objects a catch-up
    read of the retained range reads."""
    from metadata import keys
    from metadata.log import object_entries

    sub = keys.cluster_subspace("default")

    def read(tr: Any) -> list[dict[str, Any]]:
        out = []
        begin, end = sub.range(keys.OBJECT)
        for key, value in tr.get_range(begin, end):
            size, _live, created, dead_since, level = (*keys.unpack_value(value), None, None)[:5]
            if dead_since is not None or level is None:
                continue
            object_key = sub.unpack(key)[1]
            entries = object_entries(tr, sub, object_key)
            if not entries:
                continue
            times = [e.max_timestamp for _t, _p, e in entries]
            found = {
                "level": int(level),
                "size": int(size),
                "live": sum(e.length for _t, _p, e in entries),
                "partitions": len({(t, p) for t, p, _e in entries}),
                "created_ms": int(created),
                "oldest_ms": min(times),
                "newest_ms": max(times),
            }
            if int(level) == 1 and found["live"] * 2 < int(size):
                found["entries"] = [_neighbours(tr, sub, t, p, e) for t, p, e in entries]
            out.append(found)
        return out

    census: list[dict[str, Any]] = read_metadata(system, read, [])
    return census


def _neighbours(tr: Any, sub: Any, topic_id: bytes, partition: int, entry: Any) -> dict[str, Any]:
    """A chunk entry of a level-1 object that mostly left level 1: its offsets, the level
    and arrival of the partition's entries just before and after it, and the partition's
    level-1 row, for the census (what kept the entry behind)."""
    from metadata import keys
    from metadata.lifecycle import get_objects
    from metadata.log import decode_entry

    begin, end = sub.range(keys.CHUNK, topic_id, partition)
    at = sub.key(keys.CHUNK, topic_id, partition, entry.last_offset)
    before = tr.get_range(begin, at, limit=1, reverse=True)
    after = tr.get_range(at + b"\x00", end, limit=1)
    near = [decode_entry(sub, *rows[0]) if rows else None for rows in (before, after)]
    records = get_objects(tr, sub, [e.object_key for e in near if e is not None])
    sides: list[Any] = []
    for e in near:
        if e is None:
            sides.append(None)
            continue
        record = records.pop(0)
        sides.append(
            {
                "offsets": [e.base_offset, e.last_offset],
                "same_object": e.object_key == entry.object_key,
                "level": None if record is None else record.level,
                "created_ms": None if record is None else record.created_ms,
            }
        )
    row = tr.get(sub.key(keys.L1_PARTITION, topic_id, partition))
    return {
        "partition": partition,
        "offsets": [entry.base_offset, entry.last_offset],
        "length": entry.length,
        "before": sides[0],
        "after": sides[1],
        "l1_row": None if row is None else [int(v) for v in keys.unpack_value(row)],
    }


def census_summary(census: list[dict[str, Any]]) -> str:
    """The census by level: objects, their sizes and live shares (10th, 50th and 90th
    percentiles), partitions per object and the seconds between its oldest and newest
    record times; then the level-1 objects less than half live, the entries they hold
    and how many of those lie behind their partition's level-1 row (reports made before
    the census: "")."""
    if not census:
        return ""

    def tenths(values: list[float]) -> str:
        values = sorted(values)
        at = [values[min(len(values) - 1, len(values) * q // 10)] for q in (1, 5, 9)]
        return " / ".join(f"{v:.3g}" for v in at)

    parts = []
    for level in sorted({o["level"] for o in census}, reverse=True):
        found = [o for o in census if o["level"] == level]
        total = sum(o["size"] for o in found) / MB
        live = sum(o["live"] for o in found) / MB
        parts.append(
            f"level {level} {len(found)} objects of {total:.0f} MB ({live:.0f} MB live): size MB"
            f" {tenths([o['size'] / MB for o in found])}, live share"
            f" {tenths([o['live'] / o['size'] for o in found])}, partitions"
            f" {tenths([o['partitions'] for o in found])}, record time span s"
            f" {tenths([(o['newest_ms'] - o['oldest_ms']) / 1000 for o in found])}"
        )
    named = [e for o in census for e in o.get("entries", ())]
    behind = [
        e for e in named if e["l1_row"] is None or e["offsets"][1] < e["l1_row"][2]
    ]  # the row's first offset past the entry: no level-2 plan looks at it again
    return (
        "Objects the metadata names as the catch-up read began, by level (10th / 50th / 90th"
        f" percentiles): {'; '.join(parts)}. Level-1 objects less than half live:"
        f" {sum(1 for o in census if 'entries' in o)}, holding {len(named)} entries,"
        f" {len(behind)} of them behind their partition's level-1 row."
    )


def agent_stats(system: bench.Bucketlog) -> dict[str, Any]:
    path = system.dir / "data" / f"stats-{system.port}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


class Sampler:
    """Samples the agent every interval on a thread of its own."""

    def __init__(
        self,
        system: bench.Bucketlog,
        interval_s: float,
        listing: Callable[[bench.Bucketlog], tuple[int, int]] = store_listing,
        others: dict[str, int] | None = None,
    ) -> None:
        self.system = system
        self.listing = listing
        self.others = dict(others or {})  # processes beside the agent: name -> pid
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval_s)

    def sample(self) -> dict[str, Any]:
        objects, size = self.listing(self.system)
        stats = agent_stats(self.system)
        lifecycle = stats.get("lifecycle", {})
        others = {
            f"{name}_cpu_s": round(bench.tree_cpu_seconds(pid), 2)
            for name, pid in self.others.items()
        }
        return {
            **others,
            "t_s": round(time.monotonic() - self._start, 1),
            "store_objects": objects,
            "store_bytes": size,
            "chunk_entries": lifecycle.get("cluster_chunk_entries"),
            "level_bytes": level_bytes(self.system),
            "metadata_bytes": metadata_bytes(self.system),
            "cpu_s": round(bench.tree_cpu_seconds(self.system.root_pid), 2),
            "lifecycle": lifecycle,
            "compaction": stats.get("compaction", {}),
            "store": stats.get("store", {}),
        }


def produce_for(
    system: bench.Bucketlog,
    topic: str,
    minutes: float,
    records_s: int,
    log: Any,
    warmup_s: float = 0.0,
) -> list[dict[str, Any]]:
    """One-minute ProducerPerformance runs at records_s until `minutes` have passed; the
    percentiles of each leave out its first warmup_s seconds of records."""
    runs = []
    end = time.monotonic() + minutes * 60
    while time.monotonic() < end:
        started = time.monotonic()
        result = bench.producer_perf(
            system.bootstrap,
            topic,
            records_s * 60,
            "none",
            records_s,
            warmup=int(records_s * warmup_s),
        )
        result["t_end_s"] = round(time.monotonic(), 1)
        result["wall_s"] = round(time.monotonic() - started, 1)
        runs.append(result)
        log(f"minute {len(runs)}: {result['mb_s']:.1f} MB/s, p99 {result['p99_ms']} ms")
    return runs


def catch_up(system: bench.Bucketlog, topic: str, records: int) -> dict[str, Any]:
    """ConsumerPerformance from the earliest offset; GETs and CPU per GB of it. Allowed
    as long as a read at 5 MB/s would take (a catch-up on moto's S3 server may be slow),
    and the tool's own minute of waiting for records that do not come."""
    megabytes = records * bench.RECORD_SIZE / MB
    return bench.measure(
        system,
        megabytes,
        lambda: bench.consumer_perf(
            system.bootstrap, topic, records, timeout=max(bench.TOOL_TIMEOUT, 60 + megabytes / 5)
        ),
    )


def set_retention(bootstrap: str, topic: str, retention_ms: int) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(
        "retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


def retention_check_s(agent_args: list[str]) -> float:
    """The agent's retention check interval, as its arguments set it (the last wins)."""
    interval_ms = 300_000.0  # the agent's default, Kafka's
    for i, arg in enumerate(agent_args):
        if arg == "--log-retention-check-interval-ms" and i + 1 < len(agent_args):
            interval_ms = float(agent_args[i + 1])
        elif arg.startswith("--log-retention-check-interval-ms="):
            interval_ms = float(arg.split("=", 1)[1])
    return interval_ms / 1000


def retained_records(bootstrap: str, topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-offsets"})
    total = 0
    for p in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        total += high - low
    consumer.close()
    return total


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    minutes = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    retention_mb = report["settings"]["rate_mb_s"] * report["settings"]["retention_ms"] / 1000

    def draw(ax: Any, values: list[Any], title: str, limit: float | None = None) -> None:
        ax.plot(minutes, values)
        if limit is not None:
            ax.axhline(limit, color="red", linestyle="--", linewidth=1)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)

    draw(axes[0][0], [s["store_objects"] for s in samples], "objects in the store")
    draw(
        axes[0][1],
        [s["store_bytes"] / MB for s in samples],
        "MB in the store (red: 1.3 x rate x retention)",
        1.3 * retention_mb,
    )
    levels = sorted({name for s in samples for name in s.get("level_bytes", {})})
    for name in levels:  # what the metadata records of each level (soaks since 2026-11-28)
        axes[0][1].plot(
            minutes,
            [s.get("level_bytes", {}).get(name, 0) / MB for s in samples],
            linewidth=0.8,
            label=name,
        )
    if levels:
        axes[0][1].legend(fontsize=7, ncol=2)
    draw(axes[1][0], [s["chunk_entries"] or 0 for s in samples], "chunk-index entries")
    draw(axes[1][1], [s["metadata_bytes"] / MB for s in samples], "metadata file MB")
    cpu = [s["cpu_s"] for s in samples]
    rate = [0.0] + [
        (cpu[i] - cpu[i - 1]) / max(0.001, samples[i]["t_s"] - samples[i - 1]["t_s"])
        for i in range(1, len(cpu))
    ]
    draw(axes[2][0], rate, "agent CPU (cores)")
    produce = report["produce_runs"]
    start = report["produce_started_monotonic"]
    axes[2][1].plot(
        [(r["t_end_s"] - start) / 60 for r in produce], [r["p99_ms"] for r in produce], marker="o"
    )
    axes[2][1].set_title("produce p99 ms, per minute")
    axes[2][1].grid(True, alpha=0.3)
    for ax in axes[2]:
        ax.set_xlabel("minutes")
    fig.suptitle(f"soak: {report['label']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def compaction_summary(report: dict[str, Any]) -> str:
    c = report["samples"][-1]["compaction"]
    produced = sum(r["records"] for r in report["produce_runs"]) * bench.RECORD_SIZE
    produced_gb = produced / 1e9
    if not c or not c.get("passes"):
        return f"Compaction off; {produced_gb:.1f} GB produced."
    cpu = c.get("cpu_seconds", 0.0)
    return (
        f"Compaction: {c.get('l1_jobs', 0)} level-1 and {c.get('l2_jobs', 0)} level-2 jobs, "
        f"{c.get('bytes_read', 0) / MB:.0f} MB read from the store, "
        f"{c.get('bytes_cached', 0) / MB:.0f} MB from the cache, "
        f"{c.get('bytes_written', 0) / MB:.0f} MB written, {cpu:.1f} CPU s in its workers: "
        f"{cpu / max(produced_gb, 1e-9):.2f} CPU s per GB produced ({produced_gb:.1f} GB)."
    )


def steady_samples(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples from a minute after retention is first reached to the produce's end."""
    s = report["settings"]
    begin = s["retention_ms"] / 1000 + 60
    end = report["produce_runs"][-1]["t_end_s"] - report["produce_started_monotonic"]
    return [x for x in report["samples"] if begin <= x["t_s"] <= end]


def steady_summary(report: dict[str, Any]) -> str:
    s = report["settings"]
    steady = steady_samples(report)
    if not steady:
        return "No steady state: the produce ended before retention was reached."
    limit = s["rate_mb_s"] * s["retention_ms"] / 1000

    def spread(name: str, scale: float = 1) -> tuple[float, float, float]:
        values = [x[name] / scale for x in steady if x[name] is not None]
        return min(values), statistics.median(values), max(values)

    low, mid, high = spread("store_bytes", MB)
    objects = spread("store_objects")
    entries = spread("chunk_entries")
    meta = spread("metadata_bytes", MB)
    return (
        f"Steady state, minute {steady[0]['t_s'] / 60:.1f} to {steady[-1]['t_s'] / 60:.1f} "
        f"(min / median / max): MB in the store {low:.0f} / {mid:.0f} / {high:.0f}, that is "
        f"{mid / limit:.2f} / {high / limit:.2f} x rate x retention ({limit:.0f} MB; target "
        f"<= 1.3); objects {objects[0]:.0f} / {objects[1]:.0f} / {objects[2]:.0f}; chunk "
        f"entries {entries[0]:.0f} / {entries[1]:.0f} / {entries[2]:.0f}; metadata MB "
        f"{meta[0]:.1f} / {meta[1]:.1f} / {meta[2]:.1f}."
    ) + level_summary(steady, limit)


def level_summary(steady: list[dict[str, Any]], limit: float) -> str:
    """The median bytes of each level the metadata records, over the steady samples."""
    names = sorted({name for x in steady for name in x.get("level_bytes", {})})
    if not names:
        return ""
    parts = []
    for name in names:
        mid = statistics.median(x.get("level_bytes", {}).get(name, 0) / MB for x in steady)
        parts.append(f"{name} {mid:.0f} MB ({mid / limit:.2f})")
    return " By level, as the metadata records them (median MB, x rate x retention): " + (
        ", ".join(parts) + "."
    )


def requests_summary(report: dict[str, Any]) -> str:
    """The store requests of the whole run (the agent's, compaction's worker included), per
    GB produced; and moto's CPU where it ran."""
    last = report["samples"][-1]
    store = last.get("store", {})
    produced_gb = sum(r["records"] for r in report["produce_runs"]) * bench.RECORD_SIZE / 1e9
    per_gb = ", ".join(
        f"{store.get(name, 0)} {label} ({store.get(name, 0) / max(produced_gb, 1e-9):.0f} per GB)"
        for name, label in (("puts", "PUTs"), ("gets", "GETs"), ("deletes", "DELETEs"))
    )
    text = f"Store requests until the last sample, for {produced_gb:.1f} GB produced: {per_gb}."
    if "moto_cpu_s" in last:
        text += f" moto's server: {last['moto_cpu_s']} CPU s (the agent's: {last['cpu_s']})."
    return text


def read_levels(read: dict[str, Any]) -> str:
    """The GETs of a read by the level of the objects they read, with the bytes read
    ahead from each level (reports made before the agent counted those bytes: "")."""
    path = read.get("read_path", {})
    if "read_ahead.level2_bytes" not in path:
        return ""
    parts = []
    for level in (2, 1, 0):
        gets = path.get(f"read_ahead.level{level}_reads", 0)
        if level == 2:  # a stream's GET and the ranges read on from it count once
            gets += path.get("read_ahead.streams_opened", 0)
        mb = path.get(f"read_ahead.level{level}_bytes", 0) / MB
        # (no rate for a few reads of under a MB: it would be arithmetic on noise)
        per_gb = f" ({gets / (mb / 1000):.0f} per GB)" if mb >= 1 else ""
        parts.append(f"level {level} {gets} for {mb:.0f} MB{per_gb}")
    why = ""
    if "read_ahead.fetches_evicted" in path:
        why = (
            " (Fetches that found bytes read ahead for them no longer cached:"
            f" {path['read_ahead.fetches_evicted']}; beside a stretch under way:"
            f" {path['read_ahead.fetches_beside_stretch']}; ranges a Fetch waited for"
            f" that its stretch ended without: {path['read_ahead.promises_unkept']})"
        )
    disk = ""
    if path.get("read_ahead.disk_fills", 0):
        disk = (
            " The disk cache: objects of many partitions read whole into it"
            f" {path['read_ahead.disk_fills']}"
            f" ({path['read_ahead.disk_fill_bytes'] / MB:.0f} MB; counted above as GETs of"
            f" their level), ranges read from it by read-ahead {path['read_ahead.disk_reads']}"
            f" and by Fetches {path.get('reader.disk_reads', 0)}, objects evicted"
            f" {path.get('disk_cache.objects_evicted', 'not counted')}."
        )
        if "read_ahead.level1_fills" in path:
            disk += (
                " Objects read into it by level: "
                + ", ".join(
                    f"level {level} {path[f'read_ahead.level{level}_fills']}" for level in (2, 1, 0)
                )
                + "."
            )
    return (
        "GETs of the catch-up read by the level of what they read (read-ahead's, with the"
        f" bytes it read from each): {', '.join(parts)}; the Fetches' own"
        f" {path.get('reader.gets', 0)}{why}.{disk}"
    )


def _store_name(store: str, data_fs: str | None = None, moto_fs: str | None = None) -> str:
    if store == "s3":
        return "moto's S3 server on 127.0.0.1" + (
            f" (its temporary files on {moto_fs})" if moto_fs else ""
        )
    return "local folder" + (f" on {data_fs}" if data_fs else "")


def file_system(path: Path) -> str:
    """The file system a path is on, as "TYPE (MOUNT POINT)", from /proc/mounts (the
    agent's data folder follows TMPDIR: a folder on tmpfs takes the disk out of a run)."""
    target = os.path.realpath(path)
    best = ("", "?")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best[0]):
                    best = (point, fields[2])
    except OSError:
        return "?"
    return f"{best[1]} ({best[0] or '?'})"


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    rate_source = (
        f"set; {s['max_mb_s']:.1f} MB/s measured as the maximum"
        if s.get("fixed_rate")
        else f"{s['fraction']} of the {s['max_mb_s']:.1f} MB/s measured"
    )
    lines = [
        f"# Soak {report['date']} ({report['label']})",
        "",
        f"Machine: {report['machine']}",
        "",
        f"Settings: {s['partitions']} partitions, retention.ms {s['retention_ms']}, "
        f"{s['rate_mb_s']:.1f} MB/s ({s['records_s']} records/s of {bench.RECORD_SIZE} B, "
        f"{rate_source}), {s['minutes']} minutes; "
        f"store: {_store_name(s.get('store', 'local'), s.get('data_fs'), s.get('moto_fs'))}; "
        f"agent arguments: {' '.join(s['agent_args'])}",
        "",
        "| minute | MB in store | objects | chunk entries | metadata MB | agent CPU s "
        "| compaction jobs (L1 + L2) | compaction CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sample in report["samples"][:: max(1, round(60 / s["sample_s"]))]:
        c = sample["compaction"]
        lines.append(
            f"| {sample['t_s'] / 60:.1f} | {sample['store_bytes'] / MB:.1f} | "
            f"{sample['store_objects']} | {sample['chunk_entries']} | "
            f"{sample['metadata_bytes'] / MB:.1f} | {sample['cpu_s']} | "
            f"{c.get('l1_jobs', 0)} + {c.get('l2_jobs', 0)} | "
            f"{round(c.get('cpu_seconds', 0.0), 1)} |"
        )
    produce = report["produce_runs"]
    warmup_s = s.get("warmup_s", 0)
    if warmup_s:
        lines += [
            "",
            f"Percentiles after each run's first {warmup_s:g} s of records (a new JVM per "
            "minute); whole run: all of its records.",
        ]
    whole = ["whole run p99 ms", "whole run max ms"] if warmup_s else []
    header = ["produce, per minute", "p50 ms", "p99 ms", "max ms", *whole, "MB/s"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, r in enumerate(produce, 1):
        cells = [i, r["p50_ms"], r["p99_ms"], r["max_ms"]]
        cells += [r["all_p99_ms"], r["all_max_ms"]] if warmup_s else []
        lines.append("| " + " | ".join(map(str, cells)) + f" | {r['mb_s']:.1f} |")
    lines += [
        "",
        f"Produce p99, median of the minutes: {statistics.median(r['p99_ms'] for r in produce)} ms.",
        "",
        compaction_summary(report),
        "",
        "GETs: all of the agent's while the read ran (compaction's too); GETs of the reads: "
        "those of its Fetches and their read-ahead only.",
        "",
        "| read | MB/s | GETs | GETs per GB | GETs of the reads | per GB | agent CPU s per GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("catch_up", "fresh"):
        r = report[name]
        # A read short of what it asked for includes the tool's minute of waiting.
        short = f" of {r['asked']:.0f} asked" if r.get("asked", r["records"]) > r["records"] else ""
        lines.append(
            f"| {name.replace('_', '-')} ({r['records']:.0f} records{short}) | {r['mb_s']:.1f} | "
            f"{r['gets']} | {r['gets_per_gb']} | {r.get('read_gets', '-')} | "
            f"{r.get('read_gets_per_gb', '-')} | {r['broker_cpu_s_per_gb']} |"
        )
    levels = read_levels(report["catch_up"])
    if levels:
        lines += ["", levels]
    census = census_summary(report.get("objects_at_catch_up", []))
    if census:
        lines += ["", census]
    last = report["samples"][-1]
    lines += ["", steady_summary(report), "", requests_summary(report), ""]
    lines += [
        f"Lifecycle counters at the end: {json.dumps(last['lifecycle'])}",
        "",
        f"Compaction counters at the end: {json.dumps(last['compaction'])}",
        "",
        f"![soak]({report['png']})",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--retention-ms", type=int, default=300_000)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="leave each minute's first seconds of records out of its percentiles",
    )
    parser.add_argument(
        "--records-s",
        type=int,
        default=0,
        help="produce this many records/s instead of --fraction of a measured maximum "
        "(to compare two runs at the same rate)",
    )
    parser.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        help="an argument for the agent (repeat); the defaults below come first",
    )
    parser.add_argument(
        "--render",
        metavar="JSON",
        help="write the markdown and the plot again from a report, and run nothing",
    )
    parser.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="the agent's object store: its data folder, or a bucket on moto's S3 server",
    )
    parser.add_argument(
        "--moto-tmpdir",
        metavar="DIR",
        help="TMPDIR of moto's server alone (where it keeps objects over 5 MB), for example"
        " a folder on tmpfs to take the S3 server's writes off the agent's disk",
    )
    parser.add_argument("--label", default="soak")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    if args.render:
        source = Path(args.render)
        report = json.loads(source.read_text())
        report["png"] = source.with_suffix(".png").name  # the report may have been renamed
        plot(report, source.with_suffix(".png"))
        source.with_suffix(".md").write_text(markdown(report))
        return 0

    # Lifecycle checks often enough for a retention of minutes (defaults are Kafka's).
    agent_args = [
        "--log-retention-check-interval-ms",
        "15000",
        "--object-delete-delay-ms",
        "60000",
        *args.agent_arg,
    ]

    def log(line: str) -> None:
        print(f"[{datetime.datetime.now():%H:%M:%S}] {line}", flush=True)

    started = datetime.datetime.now(datetime.UTC)
    moto: bench.Moto | None = None
    listing: Callable[[bench.Bucketlog], tuple[int, int]] = store_listing
    others: dict[str, int] = {}
    if args.store == "s3":
        moto = bench.Moto(bench.S3_BUCKET, args.moto_tmpdir)
        moto.start()
        assert moto.proc is not None
        others["moto"] = moto.proc.pid
        prefix = "soak"
        listing = S3Listing(moto, f"{prefix}/")
        store_args = ["--storage", f"s3://{moto.bucket}/{prefix}"]
        store_args += ["--s3-endpoint-url", moto.url]
        system = bench.Bucketlog(1, store_args + agent_args, env=bench.S3_CREDENTIALS)
    else:
        system = bench.Bucketlog(1, agent_args)
    data_fs = file_system(system.dir)
    try:
        system.start()
        probe = "soak-probe"
        bench.create_topic(system.bootstrap, probe, args.partitions)
        max_run = bench.producer_perf(system.bootstrap, probe, 200_000, "none")
        records_s = args.records_s or int(max_run["records_s"] * args.fraction)
        log(f"max {max_run['mb_s']:.1f} MB/s; producing {records_s} records/s")
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = "soak"
        admin = AdminClient({"bootstrap.servers": system.bootstrap})
        admin.create_topics(
            [NewTopic(topic, args.partitions, 1, config={"retention.ms": str(args.retention_ms)})]
        )[topic].result(30)
        admin.delete_topics([probe])[probe].result(30)
        sampler = Sampler(system, args.sample_s, listing, others)
        sampler.start()
        produce_started = time.monotonic()
        runs = produce_for(system, topic, args.minutes, records_s, log, args.warmup_s)
        # Retention would take records from the front of the range while it is read, and
        # ConsumerPerformance would wait its minute for them and count that minute in
        # its fetch time: retention is held for the read (after one check interval, so
        # that no pass begun before still deletes), and given back afterwards.
        set_retention(system.bootstrap, topic, -1)
        time.sleep(retention_check_s(agent_args) + 1)
        retained = retained_records(system.bootstrap, topic, args.partitions)
        log(f"catch-up read of {retained} records")
        census = object_census(system)
        caught_up = catch_up(system, topic, retained)
        caught_up["asked"] = retained
        set_retention(system.bootstrap, topic, args.retention_ms)
        fresh_topic = "soak-fresh"
        bench.create_topic(system.bootstrap, fresh_topic, args.partitions)
        fresh_records = min(retained, 300_000)
        bench.producer_perf(system.bootstrap, fresh_topic, fresh_records, "none")
        fresh = catch_up(system, fresh_topic, fresh_records)
        sampler.stop()
    finally:
        system.stop()
        if moto is not None:
            moto.stop()

    stem = started.strftime("%Y-%m-%d") + f"-{args.label}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = bench.machine()
    report = {
        "date": started.isoformat(timespec="seconds"),
        "label": args.label,
        "machine": (
            f"{machine['nproc']} cores ({machine['cpu_model']}), {machine['memory_gb']} GB, "
            f"Linux {machine['kernel']}, Python {machine['python']}"
        ),
        "settings": {
            "partitions": args.partitions,
            "retention_ms": args.retention_ms,
            "fraction": args.fraction,
            "fixed_rate": bool(args.records_s),
            "max_mb_s": max_run["mb_s"],
            "records_s": records_s,
            "rate_mb_s": records_s * bench.RECORD_SIZE / MB,
            "minutes": args.minutes,
            "sample_s": args.sample_s,
            "warmup_s": args.warmup_s,
            "agent_args": agent_args,
            "store": args.store,
            "data_fs": data_fs,
            "moto_fs": file_system(Path(args.moto_tmpdir)) if args.moto_tmpdir else None,
        },
        "produce_started_monotonic": produce_started,
        "produce_runs": runs,
        "samples": sampler.samples,
        "catch_up": caught_up,
        "objects_at_catch_up": census,
        "fresh": fresh,
        "png": f"{stem}.png",
    }
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / f"{stem}.png")
    (out / f"{stem}.md").write_text(markdown(report))
    log(f"wrote {out / stem}.md, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
