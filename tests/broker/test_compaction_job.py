"""A compaction job's output, built from real ingest files in a real local folder store and
planned in real SQLite metadata."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from functools import partial
from pathlib import Path

import anyio
import pytest

from broker import compaction as compaction_module
from broker import costs
from broker.compaction import Compaction, CompactionSettings, Spool, _picklable, build_output
from metadata import compaction, keys, log, topics
from metadata.sqlite_kv import SQLiteKV
from protocol.records import build_batch, iter_batches
from storage import local
from storage.cache import ObjectCache
from storage.disk_cache import DiskCache
from storage.ingest import decode_footer, encode_ingest_file
from storage.local import LocalObjectStore

SUB = keys.cluster_subspace("compaction-job-test")


@pytest.fixture
def setup(tmp_path: Path):
    kv = SQLiteKV(str(tmp_path / "meta.db"))
    store = LocalObjectStore(str(tmp_path / "objects"))
    topic = kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, 2, {}, 0)
    )
    yield kv, store, topic
    kv.close()


def _ingest(kv, store, topic, key: str, values: dict[int, list[list[bytes]]]) -> bytes:
    """Write and commit an ingest file: per partition, batches of the given values."""
    chunks = [
        (topic.topic_id, p, [build_batch([(None, v, [], 1000) for v in vs]) for vs in batches])
        for p, batches in values.items()
    ]
    data, locations = encode_ingest_file(chunks)
    pending = []
    for (_t, p, batches), loc in zip(chunks, locations, strict=True):
        for batch, start in zip(batches, loc.batch_starts, strict=True):
            (view,) = iter_batches(batch)
            pending.append(
                log.PendingBatch(
                    topic.topic_id, p, start, len(batch), view.last_offset_delta, 1000, -1, -1, -1
                )
            )
    store.put_sync(key, data, if_absent=True)
    kv.transact_sync(lambda tr: log.commit_ingest(tr, SUB, key, len(data), 1, pending))
    return data


def _plan(kv) -> compaction.Plan:
    plan = kv.transact_sync(
        lambda tr: compaction.plan_l1(tr, SUB, 1, 10**6, 0, compaction.Limits(), 1000)
    )
    assert plan is not None
    return plan


def _values(data: bytes) -> list[bytes]:
    from protocol.records import iter_records

    return [r.value for view in iter_batches(data) for r in iter_records(view)]


def test_the_output_holds_each_partitions_batches_byte_for_byte_in_offset_order(setup):
    kv, store, topic = setup
    first = _ingest(kv, store, topic, "ingest/a", {0: [[b"a0", b"a1"], [b"a2"]], 1: [[b"x0"]]})
    second = _ingest(kv, store, topic, "ingest/b", {1: [[b"x1"]], 0: [[b"a3"]]})
    plan = _plan(kv)
    gets = store.stats["gets"]
    built = build_output(store, plan, {"ingest/b": second}, "compacted/x")
    # ingest/a's entries are next to each other: one GET; ingest/b came from the cache.
    assert store.stats["gets"] == gets + 1
    assert built.bytes_cached == sum(
        e.entry.length for e in plan.entries if "b" in e.entry.object_key
    )
    output = store.get_sync("compacted/x")
    assert len(output) == built.size
    locations = decode_footer(output)
    assert [(loc.partition, loc.start) for loc in locations] == [
        (p, s) for (_t, p, _e), s in zip(plan.partitions(), built.chunk_starts, strict=True)
    ]
    for (_t, _p, entries), loc in zip(plan.partitions(), locations, strict=True):
        sources = {"ingest/a": first, "ingest/b": second}
        inputs = b"".join(sources[e.object_key][e.start : e.start + e.length] for e in entries)
        assert output[loc.start : loc.end] == inputs
    outputs = compaction.output_entries(plan, "compacted/x", built.chunk_starts, 1 << 20)
    assert kv.transact_sync(
        lambda tr: compaction.commit_job(
            tr, SUB, plan, 1, "compacted/x", built.size, outputs, 10**6, 1000
        )
    ).committed
    read = {
        p: kv.transact_sync(lambda tr, p=p: log.read_chunks(tr, SUB, topic.topic_id, p, 0))
        for p in (0, 1)
    }
    assert [(e.object_key, e.base_offset, e.last_offset) for e in read[0]] == [
        ("compacted/x", 0, 3)
    ]
    (entry,) = read[0]
    assert _values(output[entry.start : entry.start + entry.length]) == [b"a0", b"a1", b"a2", b"a3"]
    (entry,) = read[1]
    assert _values(output[entry.start : entry.start + entry.length]) == [b"x0", b"x1"]


def test_a_job_has_its_reads_under_way_at_once_and_builds_the_same_object(setup):
    kv, store, topic = setup
    for i in range(4):  # four objects: one GET each
        _ingest(kv, store, topic, f"ingest/{i}", {0: [[b"a%d" % i]], 1: [[b"x%d" % i] * 3]})
    plan = _plan(kv)
    one_by_one = build_output(store, plan, {}, "compacted/one")

    class Together:
        """The store, whose GETs answer only once four are under way together."""

        def __init__(self) -> None:
            self.all_there = threading.Barrier(4, timeout=10)
            self.charged: list[object] = []

        def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
            self.all_there.wait()  # BrokenBarrierError after 10 s: read one at a time
            self.charged.append(costs._charged_now())
            return store.get_view_sync(key, start, end)

        def put_parts_sync(self, key, parts, *, if_absent=False) -> None:
            store.put_parts_sync(key, parts, if_absent=if_absent)

    reader = Together()
    with costs.charge(lambda: {"t": 1.0}):  # the caller's context reaches every GET
        together = build_output(reader, plan, {}, "compacted/together", reads_at_once=4)
    assert reader.charged == [{"t": 1.0}] * 4
    assert together.bytes_read == one_by_one.bytes_read
    assert together.chunk_starts == one_by_one.chunk_starts
    assert store.get_sync("compacted/together") == store.get_sync("compacted/one")


def test_an_entry_whose_bytes_do_not_hold_its_offsets_fails_the_job(setup):
    kv, store, topic = setup
    _ingest(kv, store, topic, "ingest/a", {0: [[b"a0", b"a1"]]})
    _ingest(kv, store, topic, "ingest/b", {0: [[b"a2"]]})
    plan = _plan(kv)
    wrong = dataclasses.replace(plan.entries[0].entry, batch_count=2)  # it holds one
    bad = dataclasses.replace(
        plan, entries=(dataclasses.replace(plan.entries[0], entry=wrong), *plan.entries[1:])
    )
    with pytest.raises(ValueError, match="not the entry's"):
        build_output(store, bad, {}, "compacted/x")
    assert [info.key for info in _list(store, "compacted/")] == []


def _list(store, prefix):
    import anyio

    return anyio.run(store.list, prefix)


@dataclasses.dataclass
class _Agent:
    """What compaction needs of an agent."""

    kv: SQLiteKV
    store: LocalObjectStore
    sub: keys.Subspace = SUB
    node_id: int = 1
    cache: ObjectCache = dataclasses.field(default_factory=lambda: ObjectCache(1 << 20))
    disk_cache: DiskCache | None = None

    def topic_config(self, topic: topics.Topic, name: str) -> str:
        return {"cleanup.policy": "delete", "retention.ms": "-1"}[name]


async def test_a_job_that_fails_leaves_its_inputs_claimed_and_the_next_pass_plans_others(setup):
    kv, store, topic = setup
    for key in "abcd":
        _ingest(kv, store, topic, f"ingest/{key}", {0: [[key.encode()]]})
    await store.delete("ingest/a")  # an input that cannot be read
    settings = CompactionSettings(max_inputs=2, min_age_ms=1)
    job = Compaction(_Agent(kv, store), settings)
    assert await job.run_pass() == 0
    assert (job.stats.failures, job.stats.l1_jobs) == (1, 0)
    # a and b stay claimed until the lease runs out: c and d go first.
    assert await job.run_pass() == 1
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    assert [e.object_key.split("/")[0] for e in entries] == ["ingest", "ingest", "compacted"]


async def test_level_two_waits_for_its_oldest_data_then_takes_every_level_one_object(setup):
    kv, store, topic = setup
    for i in range(10):
        _ingest(kv, store, topic, f"ingest/{i}", {0: [[b"v%d" % i]]})
    agent = _Agent(kv, store)

    def entries() -> list[log.ChunkEntry]:
        return kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))

    def objects() -> list[str]:
        return list(dict.fromkeys(e.object_key for e in entries()))

    # Five level-1 objects, far from 256 or 64 MiB: level 2 waits (10 minutes by default).
    waiting = Compaction(agent, CompactionSettings(max_inputs=2, min_age_ms=1))
    assert await waiting.run_pass() == 5
    assert (waiting.stats.l1_jobs, waiting.stats.l2_jobs) == (5, 0)
    level_one = objects()
    assert len(level_one) == 5
    await anyio.sleep(0.01)
    # Once the oldest has waited (here 5 ms), one job takes all five.
    due = Compaction(agent, CompactionSettings(max_inputs=2, min_age_ms=1, l2_max_wait_ms=5))
    assert await due.run_pass() == 1
    assert due.stats.l2_jobs == 1
    (output,) = objects()
    assert output not in level_one
    data = store.get_sync(output)
    values = [v for e in entries() for v in _values(data[e.start : e.start + e.length])]
    assert values == [b"v%d" % i for i in range(10)]


@pytest.mark.parametrize("on_snapshot", [False, True])
async def test_a_jobs_commit_is_worked_out_on_a_snapshot_only_where_told(setup, on_snapshot):
    """commit_on_snapshot (compaction's own process): the commit's writes as worked out on
    a snapshot, and the job's result the same either way."""
    kv, store, topic = setup
    for key in "abcd":
        _ingest(
            kv, store, topic, f"ingest/{key}", {0: [[key.encode()]], 1: [[key.upper().encode()]]}
        )
    settings = CompactionSettings(max_inputs=2, min_age_ms=1, commit_on_snapshot=on_snapshot)
    job = Compaction(_Agent(kv, store), settings)
    assert await job.run_pass() == 2
    assert job.stats.commits_on_snapshot == (2 if on_snapshot else 0)
    assert job.stats.commits_rerun == 0
    for p, values in ((0, b"abcd"), (1, b"ABCD")):
        entries = kv.transact_sync(
            partial(log.read_chunks, sub=SUB, topic_id=topic.topic_id, partition=p, from_offset=0)
        )
        assert [e.object_key.split("/")[0] for e in entries] == ["compacted"] * 2
        got = [
            v
            for e in entries
            for v in _values(store.get_sync(e.object_key)[e.start : e.start + e.length])
        ]
        assert got == [bytes([c]) for c in values]


def test_only_compactions_own_process_commits_on_a_snapshot(tmp_path):
    from broker.compactor import compaction_settings
    from tests.broker.test_workers import _config

    config = _config("--data-dir", str(tmp_path))
    assert not compaction_settings(config).commit_on_snapshot
    assert compaction_settings(config, apart=True).commit_on_snapshot


async def test_the_level_two_options_reach_the_agents_compaction(tmp_path, monkeypatch):
    from broker.agent import Agent
    from broker.cli import config_from_args, parse_serve_args

    monkeypatch.setenv("BUCKETLOG_COMPACTION_L2_MAX_WAIT_MS", "1234")
    argv = ["serve", "--data-dir", str(tmp_path), "--compaction-l2-max-inputs", "40"]
    agent = Agent.open(config_from_args(parse_serve_args(argv)[1]))
    try:
        s = agent.compaction.settings
        assert (s.l2_max_inputs, s.l2_max_wait_ms) == (40, 1234)
        assert (s.limits.max_inputs, s.limits.l2_max_inputs) == (32, 40)
    finally:
        await agent.aclose()
    with pytest.raises(SystemExit):  # refused as every other non-positive count
        parse_serve_args(["serve", "--compaction-l2-max-inputs", "0"])


def test_the_promotion_size_reaches_the_plans_and_zero_turns_it_off(tmp_path, monkeypatch):
    from broker.compactor import compaction_settings
    from tests.broker.test_workers import _config

    assert compaction_settings(_config("--data-dir", str(tmp_path))).limits.promote_bytes == (
        128 * 1024
    )
    monkeypatch.setenv("BUCKETLOG_COMPACTION_PROMOTE_ENTRY_BYTES", "0")
    assert compaction_settings(_config("--data-dir", str(tmp_path))).limits.promote_bytes == 0
    config = _config("--data-dir", str(tmp_path), "--compaction-promote-entry-bytes", "4096")
    assert compaction_settings(config).limits.promote_bytes == 4096
    with pytest.raises(SystemExit):
        _config("--compaction-promote-entry-bytes", "-1")


def test_ingest_files_age_by_the_store_and_jobs_read_as_told(tmp_path, monkeypatch):
    """With S3 ingest files wait 10 s for level 1, with a local folder 30 s; a job has
    one GET under way; the flags and their variables say otherwise."""
    from broker.compactor import compaction_settings
    from tests.broker.test_workers import _config

    for name in ("MIN_AGE_MS", "READS_AT_ONCE"):
        monkeypatch.delenv(f"BUCKETLOG_COMPACTION_{name}", raising=False)
    local = compaction_settings(_config("--data-dir", str(tmp_path)))
    assert (local.min_age_ms, local.reads_at_once) == (30_000, 1)
    s3 = ("--data-dir", str(tmp_path), "--storage", "s3://bucket/p")
    remote = compaction_settings(_config(*s3))
    assert (remote.min_age_ms, remote.reads_at_once) == (10_000, 1)
    told = compaction_settings(
        _config(*s3, "--compaction-min-age-ms", "20000", "--compaction-reads-at-once", "2")
    )
    assert (told.min_age_ms, told.reads_at_once) == (20_000, 2)
    monkeypatch.setenv("BUCKETLOG_COMPACTION_READS_AT_ONCE", "3")
    assert compaction_settings(_config("--data-dir", str(tmp_path))).reads_at_once == 3
    with pytest.raises(SystemExit):
        _config("--compaction-reads-at-once", "0")


def test_a_cached_object_goes_to_a_worker_process_as_bytes_without_a_copy() -> None:
    """A view of a whole bytes object (an S3 store's get_view) is sent as that object;
    a view of part of one, or of a mapping, as a copy of its bytes."""
    whole = b"x" * 1000
    assert _picklable(memoryview(whole)) is whole
    assert _picklable(whole) is whole
    part = _picklable(memoryview(whole)[10:20])
    assert part == b"x" * 10 and isinstance(part, bytes)
    mapped = _picklable(memoryview(bytearray(b"abc")))
    assert mapped == b"abc" and isinstance(mapped, bytes)


async def test_outputs_keep_the_stores_pace_until_compaction_falls_behind(setup, monkeypatch):
    """A level-1 job whose oldest input waited longer than unpaced_after_ms is written as
    fast as the store takes it, and so is each job after it until a level-1 job's inputs
    are younger; the others keep the store's pace for large writes."""
    kv, store, topic = setup
    paced_store = LocalObjectStore(store.root, large_write_bytes_per_s=16 << 20)
    slept: list[float] = []
    monkeypatch.setattr(local.time, "sleep", slept.append)  # the pace's waits, not slept
    big = [[os.urandom(1 << 20)], [os.urandom(1 << 20)]]  # 2 MiB an input: 4 MiB a job
    job = Compaction(
        _Agent(kv, paced_store),
        # Entries of 1 MiB, merged by a job only where none is promoted as it is.
        CompactionSettings(
            max_inputs=2, min_age_ms=1, unpaced_after_ms=60_000, promote_entry_bytes=0
        ),
    )
    # Inputs committed at 1 ms after the epoch: far behind.
    _ingest(kv, store, topic, "ingest/a", {0: big})
    _ingest(kv, store, topic, "ingest/b", {0: big})
    assert await job.run_pass() == 1
    assert (job.stats.l1_jobs, job.stats.unpaced_jobs) == (1, 1)
    assert slept == []
    # The same inputs' age seen from 1 s after the epoch: keeping up.
    monkeypatch.setattr(compaction_module, "_now_ms", lambda: 1_000)
    _ingest(kv, store, topic, "ingest/c", {1: big})
    _ingest(kv, store, topic, "ingest/d", {1: big})
    assert await job.run_pass() == 1
    assert (job.stats.l1_jobs, job.stats.unpaced_jobs) == (2, 1)
    assert sum(slept) > 0.1, "4 MiB at 16 MiB/s: three pieces wait a sixteenth of a second"
    # A level-2 job follows the level-1 job before it.
    behind = compaction.Plan(level=1, entries=(), queued=((1, "ingest/x"),))
    level_two = compaction.Plan(level=2, entries=())
    assert not job._paced(behind, now_ms=60_002) and not job._paced(level_two)
    assert job._paced(compaction.Plan(level=1, entries=(), queued=((1, "ingest/y"),)), 60_001)
    assert job._paced(level_two)
    # Without a pace (no unpaced_after_ms) every job is as the store writes it.
    unpaced_store = Compaction(_Agent(kv, store), CompactionSettings())
    assert unpaced_store._paced(behind, now_ms=60_002) and unpaced_store._paced(level_two)
    assert unpaced_store.stats.unpaced_jobs == 0


async def _level_one_files(kv, store, topic, count: int) -> list[str]:
    """`count` ingest files of both partitions, entered in level 1 as they are."""
    keys_ = [f"ingest/{i}" for i in range(count)]
    for i, key in enumerate(keys_):
        _ingest(kv, store, topic, key, {0: [[b"a%d" % i] * 20], 1: [[b"b%d" % i] * 20]})
    promoting = Compaction(
        _Agent(kv, store), CompactionSettings(min_age_ms=1, promote_entry_bytes=1)
    )
    await promoting.run_pass()
    assert promoting.stats.l1_promoted == count
    return keys_


async def _one_partition_a_job(setup, tmp_path, disk: DiskCache | None) -> tuple[Compaction, int]:
    """Level 2 over four promoted files of two partitions, a job per partition; the GETs."""
    kv, store, topic = setup
    await _level_one_files(kv, store, topic, 4)
    run = sum(
        e.length
        for e in kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    )
    await anyio.sleep(0.01)
    settings = CompactionSettings(
        min_age_ms=1, l2_max_wait_ms=5, max_job_bytes=run + run // 2, promote_entry_bytes=1
    )
    job = Compaction(_Agent(kv, store, disk_cache=disk), settings)
    gets = store.stats["gets"]
    assert await job.run_pass() == 2
    gets = store.stats["gets"] - gets
    assert job.stats.l2_jobs == 2
    for p, prefix in ((0, b"a"), (1, b"b")):
        entries = kv.transact_sync(
            partial(log.read_chunks, sub=SUB, topic_id=topic.topic_id, partition=p, from_offset=0)
        )
        assert [e.object_key.split("/")[0] for e in entries] == ["compacted"]
        (e,) = entries
        got = _values(store.get_sync(e.object_key)[e.start : e.start + e.length])
        assert got == [prefix + b"%d" % i for i in range(4) for _ in range(20)]
    return job, gets


async def test_level_two_jobs_read_each_input_once_through_the_disk_cache(setup, tmp_path):
    """The first partition's job GETs each input whole into the disk cache; the second's
    reads them there: four GETs for two jobs over four files, not eight."""
    disk = DiskCache(str(tmp_path / "disk"), 1 << 20)
    job, gets = await _one_partition_a_job(setup, tmp_path, disk)
    assert gets == 4
    assert job.stats.bytes_from_disk > 0
    assert disk.stats["objects_kept"] == 4
    assert [n for n in os.listdir(tmp_path / "disk") if n.endswith(".tmp")] == []


async def test_without_a_disk_cache_each_level_two_job_gets_its_ranges(setup, tmp_path):
    job, gets = await _one_partition_a_job(setup, tmp_path, None)
    assert gets == 8
    assert job.stats.bytes_from_disk == 0


def _l2_plan(kv, topic) -> compaction.Plan:
    plan = kv.transact_sync(
        lambda tr: compaction.plan_l2(
            tr, SUB, 1, compaction_module._now_ms() + 1000, compaction.Limits(), 1000, max_wait_ms=0
        )
    )
    assert plan is not None and plan.level == compaction.L2
    return plan


async def test_an_input_gone_from_the_disk_is_read_with_a_get(setup, tmp_path):
    kv, store, topic = setup
    keys_ = await _level_one_files(kv, store, topic, 2)
    plan = _l2_plan(kv, topic)
    kept = {key: str(tmp_path / f"gone-{i}") for i, key in enumerate(keys_)}  # no such files
    gets = store.stats["gets"]
    spool = Spool(kept, str(tmp_path))
    built = build_output(store, plan, {}, "compacted/x", spool=spool)
    assert store.stats["gets"] - gets == 2  # a range each
    assert (built.bytes_from_disk, built.spooled) == (0, ())
    assert build_output(store, plan, {}, "compacted/y").chunk_starts == built.chunk_starts
    assert store.get_sync("compacted/x") == store.get_sync("compacted/y")


async def test_a_failed_job_leaves_no_file_for_the_disk(setup, tmp_path):
    kv, store, topic = setup
    await _level_one_files(kv, store, topic, 2)
    plan = _l2_plan(kv, topic)
    wrong = dataclasses.replace(plan.entries[-1].entry, batch_count=2)  # it holds one
    bad = dataclasses.replace(
        plan, entries=(*plan.entries[:-1], dataclasses.replace(plan.entries[-1], entry=wrong))
    )
    folder = tmp_path / "spool"
    folder.mkdir()
    with pytest.raises(ValueError, match="not the entry's"):
        build_output(store, bad, {}, "compacted/x", spool=Spool({}, str(folder)))
    assert os.listdir(folder) == []
    # Too large for the disk cache: read, used, and deleted rather than kept.
    small = DiskCache(str(folder), 80)  # keeps objects of 10 bytes at most
    built = build_output(store, plan, {}, "compacted/y", spool=Spool({}, small.directory))
    assert built.bytes_read == sum(len(store.get_sync(k)) for k in plan.input_keys)
    assert len(built.spooled) == len(plan.input_keys)
    compaction_module._adopt_all(small, built.spooled)
    assert os.listdir(folder) == [] and small.held_bytes == 0


async def test_level_one_reads_the_files_the_disk_holds_and_gets_the_others_as_before(
    setup, tmp_path
):
    """Ingest files the flushes left in the disk cache are read there; the others with a
    GET of their range each, as without a disk cache, and not put into it."""
    kv, store, topic = setup
    for key in "abcd":
        _ingest(
            kv, store, topic, f"ingest/{key}", {0: [[key.encode()]], 1: [[key.upper().encode()]]}
        )
    disk = DiskCache(str(tmp_path / "disk"), 1 << 20)
    for key in ("ingest/a", "ingest/b"):
        disk.put(key, store.get_sync(key))
    on_disk = [
        e.length
        for p in (0, 1)
        for e in kv.transact_sync(lambda tr, p=p: log.read_chunks(tr, SUB, topic.topic_id, p, 0))
        if e.object_key in ("ingest/a", "ingest/b")
    ]
    assert len(on_disk) == 4
    gets = store.stats["gets"]
    settings = CompactionSettings(max_inputs=4, min_age_ms=1, promote_entry_bytes=0)
    job = Compaction(_Agent(kv, store, disk_cache=disk), settings)
    assert await job.run_pass() == 1
    assert job.stats.l1_jobs == 1
    assert store.stats["gets"] - gets == 2
    assert sum(on_disk) <= job.stats.bytes_from_disk <= disk.held_bytes
    assert disk.stats["objects_kept"] == 2
    for p, values in ((0, b"abcd"), (1, b"ABCD")):
        entries = kv.transact_sync(
            partial(log.read_chunks, sub=SUB, topic_id=topic.topic_id, partition=p, from_offset=0)
        )
        got = [
            v
            for e in entries
            for v in _values(store.get_sync(e.object_key)[e.start : e.start + e.length])
        ]
        assert got == [bytes([c]) for c in values]
