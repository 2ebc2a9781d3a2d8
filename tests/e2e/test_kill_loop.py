"""A short kill loop (integration/chaos/killloop.py): three agents killed with SIGKILL one
after another while idempotent and plain producers write with acks=all; everything
acknowledged is read back where its acknowledgement said, once, in order, with dense
offsets. And the harness is checked too: with a test-only fault point that acknowledges
a batch without committing it, the same run reports the loss and fails."""

from __future__ import annotations

import json

import pytest

from broker.ingest import ACK_WITHOUT_COMMIT
from integration.chaos import killloop

pytestmark = [pytest.mark.slow, pytest.mark.serial]

SHORT = [
    "--agents", "3",
    "--partitions", "8",
    "--producers", "4",
    "--rate", "50",
    "--interval-s", "0.5",
    "--seconds", "40",
    "--settle-s", "1",
    "--flush-timeout-s", "30",
    "--read-timeout-s", "30",
]  # fmt: skip


# A lightning topic, and a classic one written at the same time in the same cluster.
LIGHTNING = [
    "--topic-config", "bucketlog.topic.type=lightning",
    "--classic-alongside",
    "--agent-arg=--journal-sweep-interval-ms", "--agent-arg=1000",
    "--agent-arg=--journal-idle-ms", "--agent-arg=2000",
]  # fmt: skip


def run_kill_loop(
    tmp_path, kills: int, env: dict[str, str] | None = None, extra: list[str] | None = None
) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    status = killloop.main(
        [
            *SHORT,
            *(extra or []),
            "--kills",
            str(kills),
            "--work-dir",
            str(tmp_path / "work"),
            "--report",
            str(report),
        ],
        env=env,
    )
    return status, json.loads(report.read_text())


@pytest.mark.parametrize(
    ("kind", "kills"),
    [
        ("classic", 12),
        # The journal's rules do not depend on the store (its S3 calls have their own
        # tests in tests/storage): run once, on the embedded stores.
        pytest.param("lightning", 50, marks=pytest.mark.store_independent),
    ],
)
def test_nothing_acknowledged_is_lost_duplicated_or_reordered_across_kills(tmp_path, kind, kills):
    # A lightning topic's acknowledgements carry no offset: each is found by its value,
    # and must be there once, in its producer's order.
    status, report = run_kill_loop(
        tmp_path, kills=kills, extra=LIGHTNING if kind == "lightning" else []
    )
    assert report["problems"] == []
    assert report["kills"]["count"] == kills
    assert all(kill[3] is not None for kill in report["kills"]["list"]), "an agent stayed down"
    producers = report["producers"]
    assert {p["idempotent"] for p in producers} == {True, False}
    assert all(p["acknowledged"] > 0 for p in producers)
    checks = [report["check"]]
    if kind == "lightning":
        checks.append(report["check_classic"])
        assert checks[1]["acknowledged"] > 0
    for check in checks:
        assert check["anomalies"] == {
            "missing": 0,
            "idempotent_duplicates": 0,
            "offsets_not_dense": 0,
            "out_of_order": 0,
            "unrecognised": 0,
        }
    check = report["check"]
    assert report["agent_logs"]["error_lines"] == 0
    assert report["agent_logs"]["tracebacks"] == 0
    assert sum(c["acknowledged"] for c in checks) == sum(p["acknowledged"] for p in producers)
    assert check["read"] >= check["acknowledged"]
    assert status == 0 and report["ok"]


def test_the_kill_loop_reports_an_acknowledged_batch_the_broker_dropped(tmp_path):
    # Every agent process drops the 10th batch it receives from a plain producer.
    status, report = run_kill_loop(
        tmp_path, kills=3, env={"BUCKETLOG_FAULT_POINTS": f"{ACK_WITHOUT_COMMIT}@10"}
    )
    assert status == 1 and not report["ok"]
    assert report["problems"] == []
    anomalies = report["check"]["anomalies"]
    assert anomalies["missing"] >= 1
    assert {kind: n for kind, n in anomalies.items() if n} == {"missing": anomalies["missing"]}
    # A plain producer's retry may follow an attempt whose commit landed before its agent
    # was killed: that record is in the log once, but not where the dropped retry's
    # acknowledgement said. At least one dropped batch is nowhere at all.
    assert report["check"]["missing_found_elsewhere"] < anomalies["missing"]
    for missing in report["check"]["examples"]["missing"]:
        ack = missing["ack"]
        assert ack["producer"].startswith("plain")
        assert all(partition == ack["partition"] for partition, _offset in missing["found_at"])
