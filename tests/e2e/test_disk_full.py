"""A short run of the disk-full scenario (integration/chaos/diskfull.py): the agents'
local object store, or their SQLite metadata store, on a small tmpfs, filled to the last
byte twice while producers write with acks=all. Produces fail with KAFKA_STORAGE_ERROR
while the volume is full (retried by the clients), nothing acknowledged is lost or
written twice, no
temp file is left behind, and produce and consume work at once when space is back, with
no agent restarted."""

from __future__ import annotations

import json

import pytest

from integration.chaos import diskfull

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]


@pytest.mark.parametrize("store", ["objects", "metadata"])
def test_a_full_volume_fails_produces_retriably_and_loses_nothing(tmp_path, store):
    report_path = tmp_path / "report.json"
    argv = [
        "--agents", "2",
        "--partitions", "4",
        "--producers", "2",
        "--rate", "50",
        "--store", store,
        "--volume-mb", "48",
        "--full-s", "3",
        "--gap-s", "1",
        "--seconds", "6",
        "--settle-s", "1",
        "--recovery-timeout-s", "15",
        "--read-timeout-s", "30",
        "--work-dir", str(tmp_path / "work"),
        "--report", str(report_path),
    ]  # fmt: skip
    try:
        with diskfull.small_volume(None, 48):
            pass
    except diskfull.VolumeUnavailable as exc:
        pytest.skip(f"no small volume to fill: {exc}")
    status = diskfull.main(argv)
    report = json.loads(report_path.read_text())
    fills = report["faults"]
    assert fills["fills"] == 2 and all(held >= 3 for *_bytes, held in fills["list"])
    assert all(ballast > 0 for ballast, _retaken, _held in fills["list"])
    assert report["problems"] == []
    assert report["check"]["anomalies"] == {
        "missing": 0,
        "idempotent_duplicates": 0,
        "offsets_not_dense": 0,
        "out_of_order": 0,
        "unrecognised": 0,
    }
    # The fault bit: the probe, which never retries, was told the upload or the commit
    # failed.
    assert report["client_errors"]["by_name"].get("KAFKA_STORAGE_ERROR", 0) > 0
    assert report["client_errors"]["not_retriable"] == {}
    assert report["recovery_s"] is not None and report["recovery_s"] < 15
    assert report["client_errors"]["probe_after_recovery"] == {}
    assert report["temp_files_left"] == []
    assert report["agents_not_restarted"]
    assert report["agent_logs"]["tracebacks"] == 0
    assert status == 0 and report["ok"]
