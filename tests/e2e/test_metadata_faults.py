"""A short run of the metadata-store faults scenario (integration/chaos/metafaults.py):
another process holds an exclusive lock on the agents' SQLite metadata store, twice,
while producers write with acks=all; each produce waits for the lock (shorter than the
store's 30 s of retries) instead of failing, nothing acknowledged is lost or written
twice, and produce and consume work at once after, with no agent restarted."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from integration.chaos import metafaults
from tests.support import fdb_server

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]


def run(tmp_path, extra: list[str]) -> dict:
    report_path = tmp_path / "report.json"
    status = metafaults.main(
        [
            "--agents", "2",
            "--partitions", "4",
            "--producers", "2",
            "--rate", "50",
            "--lock-s", "4",
            "--gap-s", "2",
            "--seconds", "10",
            "--settle-s", "1",
            "--recovery-timeout-s", "15",
            "--read-timeout-s", "30",
            "--work-dir", str(tmp_path / "work"),
            "--report", str(report_path),
            *extra,
        ]
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    report["status"] = status
    return report


def assert_waited_out(report: dict) -> None:
    assert report["problems"] == []
    assert report["check"]["anomalies"] == {
        "missing": 0,
        "idempotent_duplicates": 0,
        "offsets_not_dense": 0,
        "out_of_order": 0,
        "unrecognised": 0,
    }
    # The outages were shorter than the store's retries: no client was told of them.
    assert report["client_errors"]["by_name"] == {}
    assert report["client_errors"]["not_retriable"] == {}
    assert report["faults"]["acknowledged_during"] > 0
    assert report["recovery_s"] is not None and report["recovery_s"] < 15
    assert report["agents_not_restarted"]
    assert report["agent_logs"]["tracebacks"] == 0
    assert report["status"] == 0 and report["ok"]


def test_produce_waits_out_a_locked_metadata_store_and_loses_nothing(tmp_path):
    report = run(tmp_path, [])
    locks = report["faults"]
    assert locks["locks"] == 2 and all(held >= 4 for _waited, held in locks["list"])
    assert_waited_out(report)


def test_an_outage_made_by_commands_is_waited_out_too(tmp_path):
    # --stop-command / --start-command: how a user stops a store of their own. Here the
    # commands start and kill a process holding the SQLite store's write lock.
    db = tmp_path / "work" / "data" / "metadata.db"
    pid_file = tmp_path / "locker.pid"
    locker = (
        f"import os, sqlite3, time; c = sqlite3.connect({str(db)!r}, timeout=60, "
        "isolation_level=None); c.execute('BEGIN EXCLUSIVE'); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    stop = (
        f"{shlex.quote(sys.executable)} -c {shlex.quote(locker)} >/dev/null 2>&1 & "
        f"while [ ! -s {pid_file} ]; do sleep 0.05; done"
    )
    start = f"kill $(cat {pid_file}) && rm {pid_file}"
    report = run(tmp_path, ["--stop-command", stop, "--start-command", start])
    outages = report["faults"]
    assert outages["command_failures"] == []
    assert outages["locks"] == 2 and all(down >= 4 for _stop_s, down in outages["list"])
    assert not pid_file.exists()
    assert_waited_out(report)


def test_foundationdb_stopped_is_waited_out(tmp_path):
    if not fdb_server.available():
        pytest.skip(fdb_server.FDB_MISSING)
    report = run(tmp_path, ["--fdb"])
    outages = report["faults"]
    assert outages["command_failures"] == []
    assert outages["stop_command"].startswith("kill -STOP ")
    assert outages["locks"] == 2 and all(down >= 4 for _stop_s, down in outages["list"])
    assert_waited_out(report)
