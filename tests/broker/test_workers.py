"""broker.workers: compaction's builds in worker processes, with a real local folder store
and real SQLite metadata; the processes are real (spawned), as the agent's are."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from broker.compaction import Compaction, CompactionSettings, build_output
from broker.compactor import compaction_settings
from broker.costs import UNATTRIBUTED, AccountingStore, Ledger
from broker.workers import StoreSpec, WorkerPool, add_spent
from metadata import log
from storage.local import LocalObjectStore
from storage.segments import is_packed_key
from tests.broker.test_compaction_job import SUB, _Agent, _ingest, _plan, _values, setup  # noqa: F401

pytestmark = pytest.mark.slow


def _worker_facts(store: object, pause: float = 0.0) -> tuple[int, int, int]:
    """In the worker: its pid, its parent's and its niceness."""
    time.sleep(pause)
    return os.getpid(), os.getppid(), os.nice(0)


def _write_pace(store: AccountingStore) -> tuple[float | None, bool]:
    """In the worker: the pace of its store's large writes, and whether they are direct."""
    inner = store.inner
    assert isinstance(inner, LocalObjectStore)
    return inner.large_write_bytes_per_s, inner.large_io_direct


def _faults_reusing(store: object, rounds: int = 5, buffers: int = 32) -> list[int]:
    """In the worker: the minor page faults of each round of `buffers` 1 MiB buffers made,
    held together and freed, as a job's reads are."""
    import resource

    counts = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [bytearray(1 << 20) for _ in range(buffers)]
        del held
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return counts


def _copy(store: AccountingStore, source: str, target: str) -> int:
    data = store.get_sync(source)
    store.put_sync(target, data)
    return len(data)


async def test_a_job_runs_in_a_process_of_lower_priority_and_its_requests_are_counted(
    tmp_path: Path,
) -> None:
    inner = LocalObjectStore(str(tmp_path / "objects"))
    await inner.put("a", b"x" * 1000)
    ledger = Ledger()
    agent_store = AccountingStore(inner, ledger)
    gets, puts = inner.stats["gets"], inner.stats["puts"]
    pool = WorkerPool(StoreSpec(f"file://{tmp_path / 'objects'}"), workers=1, nice=7)
    try:
        (pid, parent, nice), _spent = await pool.run(_worker_facts)
        assert pid != os.getpid() and parent == os.getpid()
        assert nice == os.nice(0) + 7
        size, spent = await pool.run(_copy, "a", "b")
    finally:
        pool.close()
    assert size == 1000
    assert spent.stats == {"gets": 1, "bytes_got": 1000, "puts": 1, "bytes_put": 1000}
    assert (inner.stats["gets"], inner.stats["puts"]) == (gets, puts)  # not the agent's own
    add_spent(agent_store, spent)
    assert (inner.stats["gets"], inner.stats["puts"]) == (gets + 1, puts + 1)
    assert await inner.get("b") == b"x" * 1000
    requests, sizes = ledger.copy()
    assert requests == {(UNATTRIBUTED, "GET"): 1, (UNATTRIBUTED, "PUT"): 1}
    assert sizes == {(UNATTRIBUTED, "out"): 1000, (UNATTRIBUTED, "in"): 1000}


async def test_a_dead_worker_fails_its_job_and_the_next_job_gets_a_new_one(
    tmp_path: Path,
) -> None:
    pool = WorkerPool(StoreSpec(f"file://{tmp_path}"), workers=1, nice=0)
    try:
        (first, _parent, _nice), _spent = await pool.run(_worker_facts)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(Exception, match="terminated abruptly"):
            await pool.run(_worker_facts, 5.0)
        (second, _parent, _nice), _spent = await pool.run(_worker_facts)
    finally:
        pool.close()
    assert second != first


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="the allocator settings are glibc's (mallopt); this C library is not glibc",
)
async def test_a_worker_reuses_the_memory_its_last_job_freed(tmp_path: Path) -> None:
    """A job's reads are fresh buffers each time: a worker keeps what it freed and uses it
    again (broker.memory.tune_allocator, as the agent does), rather than taking new pages
    from the kernel and faulting each one in (measured: 262,000-289,000 minor faults a
    worker for a GB written with glibc's defaults, 36,000-52,000 with this)."""
    pool = WorkerPool(StoreSpec(f"file://{tmp_path}"), workers=1, nice=0)
    try:
        counts, _spent = await pool.run(_faults_reusing)
    finally:
        pool.close()
    pages = 32 * (1 << 20) // 4096
    assert counts[0] >= pages // 2  # the first round's pages are new (the check counts)
    assert max(counts[1:]) < pages // 10, counts  # the later rounds' are not


def test_workers_die_with_their_agent(tmp_path: Path) -> None:
    """kill -9 of the agent: no worker goes on building for nobody."""
    script = textwrap.dedent(
        f"""
        import anyio, sys, time
        from broker.workers import StoreSpec, WorkerPool, add_spent
        from tests.broker.test_workers import _worker_facts

        async def main():
            pool = WorkerPool(StoreSpec("file://{tmp_path}"), workers=1, nice=0)
            (pid, _parent, _nice), _spent = await pool.run(_worker_facts)
            print(pid, flush=True)
            time.sleep(60)

        anyio.run(main)
        """
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        os.kill(worker, 0)  # alive
        agent.kill()
        agent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            _reap_if_ours(worker)
            time.sleep(0.05)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail(f"worker {worker} outlived its agent")
    finally:
        agent.kill()


def _reap_if_ours(pid: int) -> None:
    try:  # an orphan is reaped by init, not by us; this only avoids a zombie of ours
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def test_a_job_built_by_a_worker_process_is_the_one_a_thread_builds(setup) -> None:  # noqa: F811
    kv, store, topic = setup
    _ingest(kv, store, topic, "ingest/a", {0: [[b"a0", b"a1"], [b"a2"]], 1: [[b"x0"]]})
    _ingest(kv, store, topic, "ingest/b", {1: [[b"x1"]], 0: [[b"a3"]]})
    plan = _plan(kv)
    by_thread = build_output(store, plan, {}, "compacted/thread")
    pool = WorkerPool(StoreSpec(f"file://{store.root}"), workers=1, nice=10)
    try:
        by_process, spent = await pool.run(build_output, plan, {}, "compacted/process")
    finally:
        pool.close()
    assert by_process.chunk_starts == by_thread.chunk_starts
    assert by_process.size == by_thread.size
    assert await store.get("compacted/process") == await store.get("compacted/thread")
    assert spent.stats["puts"] == 1 and spent.stats["gets"] == 2  # one GET per input


async def test_compaction_with_worker_processes_commits_and_reads_back(setup) -> None:  # noqa: F811
    kv, store, topic = setup
    for key in "abcd":
        _ingest(kv, store, topic, f"ingest/{key}", {0: [[key.encode()]]})
    settings = CompactionSettings(max_inputs=4, min_age_ms=1, workers="process")
    pool = WorkerPool(StoreSpec(f"file://{store.root}"), workers=1, nice=10)
    job = Compaction(_Agent(kv, store), settings, pool)
    try:
        assert await job.run_pass() == 1
    finally:
        job.close()
    assert job.stats.l1_jobs == 1 and job.stats.cpu_seconds > 0
    entries = kv.transact_sync(lambda tr: log.read_chunks(tr, SUB, topic.topic_id, 0, 0))
    assert [e.object_key.split("/")[0] for e in entries] == ["compacted"]
    data = await store.get(
        entries[0].object_key, entries[0].start, entries[0].start + entries[0].length
    )
    assert _values(data) == [b"a", b"b", b"c", b"d"]


def test_a_pool_is_given_with_process_workers_and_only_then(setup) -> None:  # noqa: F811
    kv, store, _topic = setup
    pool = WorkerPool(StoreSpec("file:///nowhere"), workers=1, nice=0)
    with pytest.raises(ValueError):
        Compaction(_Agent(kv, store), CompactionSettings(workers="process"))
    with pytest.raises(ValueError):
        Compaction(_Agent(kv, store), CompactionSettings(workers="thread"), pool)


def _config(*argv: str):
    from broker.cli import config_from_args, parse_serve_args

    _parser, args = parse_serve_args(["serve", *argv])
    return config_from_args(args)


def test_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COMPACTION_WORKERS", "COMPACTION_WORKER_NICE", "CONFIG"):
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)
    config = _config()
    assert (config.compaction_workers, config.compaction_worker_nice) == ("process", 10)
    config = _config("--compaction-workers", "thread")
    assert (config.compaction_workers, config.compaction_worker_nice) == ("thread", 0)
    assert _config("--compaction-worker-nice", "0").compaction_worker_nice == 0
    monkeypatch.setenv("BUCKETLOG_COMPACTION_WORKER_NICE", "19")
    assert _config().compaction_worker_nice == 19
    # A niceness threads cannot have is refused, not ignored.
    with pytest.raises(ValueError, match="compaction-worker-nice"):
        _config("--compaction-workers", "thread")
    monkeypatch.delenv("BUCKETLOG_COMPACTION_WORKER_NICE")
    for bad in (["--compaction-workers", "fork"], ["--compaction-worker-nice", "20"],
                ["--compaction-worker-nice", "-1"], ["--compaction-worker-nice", "x"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            _config(*bad)
        assert exited.value.code == 2


async def test_the_workers_store_paces_its_large_writes_and_the_agents_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction's workers write large objects paced and with O_DIRECT; the agent's
    own flushes are neither."""
    monkeypatch.delenv("BUCKETLOG_CONFIG", raising=False)
    config = _config("--data-dir", str(tmp_path), "--compaction-write-bytes-per-s", "50000000")
    assert config.compaction_write_bytes_per_s == 50_000_000
    own = StoreSpec.of(config).open()
    assert isinstance(own, LocalObjectStore)
    assert own.large_write_bytes_per_s is None and not own.large_io_direct
    pool = WorkerPool(StoreSpec.of(config, worker=True), workers=1, nice=0)
    try:
        (pace, direct), _spent = await pool.run(_write_pace)
    finally:
        pool.close()
    assert pace == 50_000_000
    assert direct


def test_the_write_pace_option(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COMPACTION_WORKERS", "COMPACTION_WRITE_BYTES_PER_S", "COMPACTION_UNPACED_AFTER_MS",
                 "STORAGE", "CONFIG"):  # fmt: skip
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)
    assert _config().compaction_write_bytes_per_s == 0  # unpaced, as Kafka's cleaner
    assert _config().compaction_unpaced_after_ms == 120_000
    with pytest.raises(ValueError, match="only with --compaction-write-bytes-per-s"):
        _config("--compaction-unpaced-after-ms", "5000")  # no pace: it would do nothing
    monkeypatch.setenv("BUCKETLOG_COMPACTION_WRITE_BYTES_PER_S", "1000000")
    assert _config().compaction_write_bytes_per_s == 1_000_000
    assert _config("--compaction-unpaced-after-ms", "5000").compaction_unpaced_after_ms == 5_000
    assert compaction_settings(_config()).unpaced_after_ms == 120_000
    monkeypatch.setenv("BUCKETLOG_COMPACTION_WRITE_BYTES_PER_S", "0")
    assert compaction_settings(_config()).unpaced_after_ms is None  # no pace to leave
    monkeypatch.setenv("BUCKETLOG_COMPACTION_WRITE_BYTES_PER_S", "1000000")
    # Writes it would not pace are refused, not ignored: a thread's, an S3 store's.
    with pytest.raises(ValueError, match="worker processes"):
        _config("--compaction-workers", "thread")
    with pytest.raises(ValueError, match="local folder"):
        _config("--storage", "s3://bucket/prefix")
    assert _config("--compaction-write-bytes-per-s", "0", "--storage", "s3://b/p")
    monkeypatch.delenv("BUCKETLOG_COMPACTION_WRITE_BYTES_PER_S")
    for bad in (["--compaction-write-bytes-per-s", "-1"], ["--compaction-unpaced-after-ms", "0"]):
        with pytest.raises(SystemExit) as exited:
            _config(*bad)
        assert exited.value.code == 2


def test_the_agents_flushes_go_into_segments_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--local-segments: on by default for a local folder, the agent's store only (the
    workers write compaction's outputs as files); refused, not ignored, with S3."""
    for name in ("LOCAL_SEGMENTS", "STORAGE", "CONFIG"):
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)
    config = _config("--data-dir", str(tmp_path))
    own = StoreSpec.of(config).open()
    worker = StoreSpec.of(config, worker=True).open()
    assert is_packed_key(own.new_key("ingest/", 100))
    assert not is_packed_key(worker.new_key("ingest/", 100))
    off = _config("--data-dir", str(tmp_path), "--local-segments", "false")
    assert not is_packed_key(StoreSpec.of(off).open().new_key("ingest/", 100))
    monkeypatch.setenv("BUCKETLOG_LOCAL_SEGMENTS", "false")
    assert not _config("--data-dir", str(tmp_path)).packs_flushes
    monkeypatch.delenv("BUCKETLOG_LOCAL_SEGMENTS")
    assert not _config("--storage", "s3://bucket/prefix").packs_flushes
    with pytest.raises(ValueError, match="local folder"):
        _config("--storage", "s3://bucket/prefix", "--local-segments", "true")
