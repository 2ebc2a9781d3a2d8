"""Compaction in a process of its own beside the agent (`--compaction-process`,
broker.compactor): started once there is work, its jobs and requests counted as the
agent's, started again when it dies, and dying with the agent. Real agents, real
processes, real stores."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_compaction import COMPACT, OFF, produce_flushes, read_records
from tests.e2e.test_retention import create, wait_for
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

APART = [*COMPACT, "--compaction-process", "true"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _compaction_process(broker: BrokerProcess) -> int | None:
    """The pid of the agent's child that runs compaction (spawned; not the resource
    tracker that multiprocessing starts beside it)."""
    assert broker.proc is not None
    spawned = [
        pid
        for pid in _children(broker.proc.pid)
        if "spawn_main" in _cmdline(pid) and "resource_tracker" not in _cmdline(pid)
    ]
    assert len(spawned) <= 1, spawned
    return spawned[0] if spawned else None


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _process_stats(broker: BrokerProcess) -> tuple[int, int, int]:
    """The process's starts, exits and whether it runs, from the agent's stats."""
    process = broker.stats().get("compaction_process", {})
    return (process.get("starts"), process.get("exits"), process.get("running"))


def _compaction(broker: BrokerProcess) -> dict[str, int]:
    return broker.stats().get("compaction", {})


def _wait_for_a_level_one_job(broker: BrokerProcess) -> None:
    """One level-1 job or more (on S3, files flushed a quarter of a second apart may
    make two before a stats write)."""
    wait_for("a level-1 job", lambda: _compaction(broker).get("l1_jobs", 0) >= 1, timeout=60)


def test_jobs_run_in_a_process_of_the_agent_and_count_as_the_agents(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    create(broker, "p", 2)
    expected = produce_flushes(broker, {"p": 2}, flushes=8)
    broker.stop()

    again = start_broker(extra_args=APART, data_dir=data_dir, port=broker.port)
    # 8 ingest files, 4 a job: two level-1 jobs.
    wait_for("compaction done", lambda: _compaction(again).get("l1_jobs") == 2, timeout=60)
    stats = again.stats()
    process = stats["compaction_process"]
    assert (process["starts"], process["exits"], process["running"]) == (1, 0, 1)
    assert process["cpu_seconds"] > 0
    assert stats["compaction"]["failures"] == 0
    child = _compaction_process(again)
    assert child is not None
    # Its builds run in its own worker process, at the lower priority, not in the agent.
    workers = [pid for pid in _children(child) if "spawn_main" in _cmdline(pid)]
    assert workers and all(os.getpriority(os.PRIO_PROCESS, w) == 10 for w in workers), workers
    assert os.getpriority(os.PRIO_PROCESS, child) == os.getpriority(os.PRIO_PROCESS, 0)
    # This agent flushed nothing: the PUTs in its counters are the process's outputs.
    assert stats["store"]["puts"] >= 2
    assert stats["metadata"]["commits"] >= 2 + 2  # each job's claim and commit
    assert read_records(again, "p", 2, 48) == {p: expected["p", p] for p in range(2)}


def test_a_killed_process_is_started_again_and_its_counters_go_on(start_broker):
    broker = start_broker(extra_args=APART)
    create(broker, "k", 1)
    expected = produce_flushes(broker, {"k": 1}, flushes=4)
    _wait_for_a_level_one_job(broker)
    before = _compaction(broker)
    child = _compaction_process(broker)
    assert child is not None
    os.kill(child, signal.SIGKILL)

    wait_for(
        "the process started again",
        lambda: _process_stats(broker) == (2, 1, 1),
        timeout=30,
    )
    assert _compaction_process(broker) not in (None, child)
    assert all(_compaction(broker)[name] >= value for name, value in before.items())
    more = produce_flushes(broker, {"k": 1}, flushes=4)
    wait_for(
        "a job of the new process",
        lambda: _compaction(broker).get("l1_jobs", 0) >= before["l1_jobs"] + 1,
        timeout=60,
    )
    got = read_records(broker, "k", 1, 24)[0]
    assert got == expected["k", 0] + [(o + 12, *rest) for o, *rest in more["k", 0]]


def test_the_process_dies_with_the_agent(start_broker):
    broker = start_broker(extra_args=APART)
    create(broker, "d", 1)
    produce_flushes(broker, {"d": 1}, flushes=4)
    _wait_for_a_level_one_job(broker)
    child = _compaction_process(broker)
    assert child is not None
    workers = _children(child)
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(10)
    wait_for(
        "the process and its workers gone",
        lambda: not any(_alive(pid) for pid in [child, *workers]),
        timeout=10,
    )


def test_an_agent_with_no_compaction_work_starts_no_process(start_broker):
    broker = start_broker(extra_args=APART)
    create(broker, "w", 1)
    time.sleep(2)  # ten compaction intervals
    assert _process_stats(broker) == (0, 0, 0)
    assert _compaction_process(broker) is None
    produce_flushes(broker, {"w": 1}, flushes=4)
    _wait_for_a_level_one_job(broker)
    assert broker.stats()["compaction_process"]["starts"] == 1


def test_without_the_option_compaction_runs_in_the_agent(start_broker):
    broker = start_broker(extra_args=[*COMPACT, "--compaction-process", "false"])
    create(broker, "a", 1)
    produce_flushes(broker, {"a": 1}, flushes=4)
    _wait_for_a_level_one_job(broker)
    assert "compaction_process" not in broker.stats()
    # The agent's children are its build workers (and multiprocessing's resource
    # tracker), none with children of its own.
    assert broker.proc is not None
    assert all(_children(pid) == [] for pid in _children(broker.proc.pid))


def test_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.broker.test_workers import _config

    for name in ("COMPACTION_PROCESS", "COMPACTION", "STORAGE", "CONFIG"):
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)
    # On by default with a local folder; off with S3, whose GETs the agent's cache saves.
    assert _config().compacts_apart
    assert not _config("--storage", "s3://bucket/prefix").compacts_apart
    assert _config("--storage", "s3://bucket/prefix", "--compaction-process", "true").compacts_apart
    assert not _config("--compaction-process", "false").compacts_apart
    assert not _config("--compaction", "false").compacts_apart  # no compaction at all
    monkeypatch.setenv("BUCKETLOG_COMPACTION_PROCESS", "false")
    assert not _config().compacts_apart
    monkeypatch.delenv("BUCKETLOG_COMPACTION_PROCESS")
    with pytest.raises(SystemExit) as exited:
        _config("--compaction-process", "maybe")
    assert exited.value.code == 2
