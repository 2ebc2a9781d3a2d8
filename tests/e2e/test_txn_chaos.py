"""A short transactions chaos run (integration/chaos/transactions.py): random commit and
abort transactions over several partitions, producers replaced mid-transaction,
transactions abandoned to their timeout, and a consume-transform-produce stage, while
agents (mostly the coordinator of a transactional id about to end a transaction) are
killed with SIGKILL. read_committed must see exactly the committed transactions, whole,
in order; read_uncommitted every committed record; nothing left open; every input
transformed exactly once; and no client may get a fatal error Kafka would not give.
The run is checked too: a broker that refuses one commit with INVALID_TXN_STATE (a
test-only fault point) is reported."""

from __future__ import annotations

import argparse
import json
import threading
from collections import Counter

import pytest

from broker import faults
from broker.transactions import END_COMMIT_REFUSED
from integration.chaos import transactions

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

SHORT = [
    "--agents", "3",
    "--partitions", "4",
    "--producers", "3",
    "--transformers", "1",
    "--max-records", "4",
    "--zombie-ratio", "0.05",
    "--abandon-ratio", "0.04",
    "--abandon-timeout-ms", "2000",
    "--interval-s", "0.7",
    "--seconds", "60",
    "--settle-timeout-s", "30",
    "--read-timeout-s", "30",
]  # fmt: skip


def run_scenario(
    tmp_path, count: int, kills: int, env: dict[str, str] | None = None
) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    status = transactions.main(
        [
            *SHORT,
            "--transactions",
            str(count),
            "--kills",
            str(kills),
            "--work-dir",
            str(tmp_path / "work"),
            "--report",
            str(report),
        ],  # fmt: skip
        env=env,
    )
    return status, json.loads(report.read_text())


def nonzero(anomalies: dict[str, dict[str, int]]) -> dict[str, int]:
    return {f"{part}.{k}": n for part, kinds in anomalies.items() for k, n in kinds.items() if n}


def test_transactions_stay_whole_and_exactly_once_across_coordinator_kills(tmp_path):
    # A kill every 0.7 s (SHORT) until 8 or the transactions end: enough transactions
    # that they outlast 8 kills (250 took 4.9 s unkilled, too few for 8).
    status, report = run_scenario(tmp_path, count=500, kills=8)
    assert report["problems"] == []
    kills = report["kills"]
    assert kills["count"] == 8
    assert kills["aimed_at_coordinator"] >= 1
    assert all(kill[3] is not None for kill in kills["list"]), "an agent stayed down"
    assert report["transactions"]["random"] == 500
    kinds: Counter[str] = Counter()
    for producer in report["clients"]["producers"]:
        kinds.update(producer["kinds"])
    for kind in (
        "commit",
        "commit after flush",
        "abort",
        "abort after flush",
        "replaced mid-transaction",
        "abandoned",
    ):
        assert kinds[kind] > 0, kinds
    transformed = sum(t["outcomes"].get("committed", 0) for t in report["clients"]["transformers"])
    assert transformed > 0
    assert report["transactions"]["transformers_caught_up_s"] is not None
    check = report["check"]
    assert nonzero(check["anomalies"]) == {}
    assert check["total_anomalies"] == 0
    assert check["input"]["transactions"]["committed"] > 0
    assert check["input"]["transactions"]["aborted"] > 0
    assert check["processing"]["inputs_below_committed"] == check["input"]["read_committed"]
    assert report["agent_logs"]["error_lines"] == 0
    assert report["agent_logs"]["tracebacks"] == 0
    assert status == 0 and report["ok"]


def test_the_run_reports_a_fatal_error_no_kafka_broker_would_give(tmp_path):
    # Every agent refuses the 5th EndTxn(commit) it receives with INVALID_TXN_STATE.
    status, report = run_scenario(
        tmp_path, count=60, kills=0, env={faults.ENV: f"{END_COMMIT_REFUSED}@5"}
    )
    assert status == 1 and not report["ok"]
    assert report["problems"] == []
    found = nonzero(report["check"]["anomalies"])
    assert set(found) == {"clients.unexpected_errors"}, found
    for line in report["clients"]["unexpected_errors"]:
        assert "INVALID_TXN_STATE" in line


class _Blocking(transactions.TransactionalClient):
    """A client whose one call blocks until released (librdkafka#5511's hang, say)."""

    def __init__(self, name: str, release) -> None:
        super().__init__(name, "tid", None, transactions.Tally(), None)  # type: ignore[arg-type]
        self.release = release

    def work(self) -> None:
        with self.calling("send_offsets_to_transaction"):
            self.release.wait(30)

    def replacement(self, name: str) -> _Blocking:
        return _Blocking(name, self.release)


def test_a_client_hung_in_a_call_at_stop_is_given_up_with_its_call_named(monkeypatch):
    monkeypatch.setattr(transactions, "HUNG_CALL_S", 0.3)
    release = threading.Event()
    pool = transactions.Pool([_Blocking("t0", release)])
    pool.start()
    try:
        problems = pool.stop("transformer")
        assert problems == []
        assert pool.hangs() == ["t0 in send_offsets_to_transaction"]
        assert [c.client_name for c in pool.all()] == ["t0"]
    finally:
        release.set()


def test_the_catch_up_waits_for_a_call_past_its_timeout_to_count_as_hung(monkeypatch):
    monkeypatch.setattr(transactions, "API_TIMEOUT_S", 0.2)
    monkeypatch.setattr(transactions, "HUNG_CALL_S", 1.5)
    release = threading.Event()
    pool = transactions.Pool([_Blocking("t0", release)])
    committed = {"offset": 0}

    def offsets(_bootstrap, _group, _topic, _partitions):
        # Only a replacement of the hung transformer makes progress.
        if len(pool.given_up) >= 1:
            committed["offset"] = 5
        return {0: committed["offset"]}

    monkeypatch.setattr(transactions, "committed_offsets", offsets)
    pool.start()
    try:
        args = argparse.Namespace(read_timeout_s=0.5)
        took, reached = transactions.catch_up(pool, "b", "g", "topic", {0: 5}, args)
        # Without waiting for the suspect call, the catch-up gives up after 0.5 s.
        assert took is not None and took >= 1.0
        assert reached == {0: 5}
        assert pool.hangs() == ["t0 in send_offsets_to_transaction"]
    finally:
        release.set()
