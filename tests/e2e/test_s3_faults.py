"""A short run of the object-store faults scenario (integration/chaos/s3faults.py): the
agents' S3 store behind a proxy that fails a share of the requests (503 SlowDown, 500,
connections dropped before and after the request took effect, latency) while producers
write with acks=all and a consumer re-reads; nothing acknowledged is lost, the only
errors that reach a client are retriable ones, and produce and consume work again at
once when the faults stop. And the scenario is checked too: an acknowledged batch the
broker dropped (a test-only fault point) is reported."""

from __future__ import annotations

import json

import pytest

from broker.ingest import ACK_WITHOUT_COMMIT
from integration.chaos import s3faults

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

SHORT = [
    "--agents", "2",
    "--partitions", "4",
    "--producers", "2",
    "--rate", "50",
    "--settle-s", "1",
    "--recovery-timeout-s", "15",
    "--flush-timeout-s", "30",
    "--read-timeout-s", "30",
    "--seed", "7",
]  # fmt: skip

NO_ANOMALIES = {
    "missing": 0,
    "idempotent_duplicates": 0,
    "offsets_not_dense": 0,
    "out_of_order": 0,
    "unrecognised": 0,
}


def run_s3_faults(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    status = s3faults.main(
        [*SHORT, *args, "--work-dir", str(tmp_path / "work"), "--report", str(report)], env=env
    )
    return status, json.loads(report.read_text())


def test_nothing_acknowledged_is_lost_under_s3_faults_and_produce_recovers(tmp_path):
    status, report = run_s3_faults(tmp_path, "--fault-rate", "0.2", "--seconds", "12")
    faults = report["faults"]
    assert set(faults["faults_by_kind"]) == set(s3faults.FAULT_KINDS)
    assert 0.1 <= faults["measured_fault_rate"] <= 0.3
    assert faults["requests_by_method"].get("PUT", 0) > 0
    assert faults["requests_by_method"].get("GET", 0) > 0  # the consumer read the store
    assert faults["acknowledged_during"] > 0
    assert report["problems"] == []
    assert report["check"]["anomalies"] == NO_ANOMALIES
    assert report["client_errors"]["not_retriable"] == {}
    assert report["client_errors"]["probe_after_recovery"] == {}
    assert report["client_errors"]["consumer"]["records"] > 0
    assert report["recovery_s"] is not None and report["recovery_s"] < 15
    assert report["agent_logs"]["error_lines"] == 0
    assert report["agent_logs"]["tracebacks"] == 0
    assert status == 0 and report["ok"]


def test_when_the_store_keeps_failing_clients_get_retriable_errors_and_nothing_is_lost(tmp_path):
    # Nearly every request fails: the store's own retries give up on some uploads, and
    # the producer that never retries is answered with the broker's error for them. One
    # producer of the scenario's own, idempotent: the order of one without idempotence
    # is librdkafka's to keep across retries (see s3faults.py).
    status, report = run_s3_faults(
        tmp_path,
        "--fault-rate", "0.95",
        "--faults", "slowdown,internal,drop-before,drop-after",
        "--seconds", "12",
        "--producers", "1",
    )  # fmt: skip
    errors = report["client_errors"]
    probe = next(p for p in report["producers"] if p["name"] == "probe")
    assert probe["failed"], "no error reached the producer that never retries"
    assert errors["not_retriable"] == {}
    assert report["check"]["anomalies"] == NO_ANOMALIES
    assert report["recovery_s"] is not None
    assert errors["probe_after_recovery"] == {}
    assert status == 0 and report["ok"]


def test_the_scenario_reports_an_acknowledged_batch_the_broker_dropped(tmp_path):
    # Every agent process drops the 10th batch it receives from a producer without
    # idempotence.
    status, report = run_s3_faults(
        tmp_path,
        "--fault-rate", "0.2",
        "--seconds", "4",
        env={"BUCKETLOG_FAULT_POINTS": f"{ACK_WITHOUT_COMMIT}@10"},
    )  # fmt: skip
    assert status == 1 and not report["ok"]
    assert report["problems"] == []
    anomalies = report["check"]["anomalies"]
    assert anomalies["missing"] >= 1
    assert {kind: n for kind, n in anomalies.items() if n} == {"missing": anomalies["missing"]}
    for missing in report["check"]["examples"]["missing"]:
        assert missing["found_at"] == []  # not anywhere in the log
