"""A short run of the metadata-store faults scenario (integration/chaos/metafaults.py):
another process holds an exclusive lock on the agents' SQLite metadata store, twice,
while producers write with acks=all; each produce waits for the lock (shorter than the
store's 30 s of retries) instead of failing, nothing acknowledged is lost or written
twice, and produce and consume work at once after, with no agent restarted."""

from __future__ import annotations

import json

import pytest

from integration.chaos import metafaults

pytestmark = pytest.mark.slow


def test_produce_waits_out_a_locked_metadata_store_and_loses_nothing(tmp_path):
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
        ]
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    locks = report["faults"]
    assert locks["locks"] == 2 and all(held >= 4 for _waited, held in locks["list"])
    assert report["problems"] == []
    assert report["check"]["anomalies"] == {
        "missing": 0,
        "idempotent_duplicates": 0,
        "offsets_not_dense": 0,
        "out_of_order": 0,
        "unrecognised": 0,
    }
    # The locks were shorter than the store's retries: no client was told of them.
    assert report["client_errors"]["by_name"] == {}
    assert report["client_errors"]["not_retriable"] == {}
    assert report["faults"]["acknowledged_during"] > 0
    assert report["recovery_s"] is not None and report["recovery_s"] < 15
    assert report["agents_not_restarted"]
    assert report["agent_logs"]["tracebacks"] == 0
    assert status == 0 and report["ok"]
