"""Metadata-store faults: the agents' SQLite metadata store locked by another process's
write transaction, again and again, while producers write with acks=all and a consumer
reads; then the locks stop, recovery is timed (no agent restarted), everything is read
back and checked.

    .venv/bin/python -m integration.chaos.metafaults --lock-s 5 --gap-s 3 --seconds 60 \\
        --report integration/chaos/results/metadata-faults.json

1. Starts `--agents` agents on the local object store and one SQLite metadata store
   (`<work dir>/data/metadata.db`), and a topic of `--partitions` partitions.
2. Runs the clients of the S3 scenario (s3faults.run_with_faults: the kill loop's
   producers, a probe producer that never retries, a re-reading consumer).
3. For `--seconds`: holds `BEGIN EXCLUSIVE` on the metadata db from this process for
   `--lock-s`, lets go for `--gap-s`, and again. No agent can commit while it is held:
   a produce waits (the store retries a busy database for 30 s, metadata/sqlite_kv.py),
   and fails with KAFKA_STORAGE_ERROR, nothing of it committed, when the lock outlasts
   that.
4. Recovery (a new producer's record acknowledged and read back), read-back and check,
   as in the S3 scenario; the same exit status.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repository root holds our packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.chaos import harness, s3faults

SCENARIO = "metadata-faults"


def metadata_db(agents: harness.Agents) -> Path:
    if isinstance(agents, harness.HarnessRestarted):
        data_dir = agents.brokers[0].data_dir
    elif isinstance(agents, harness.SupervisorRestarted):
        data_dir = agents.broker.data_dir
    else:
        raise SystemExit("metafaults starts its own agents: no --bootstrap")
    return Path(data_dir) / "metadata.db"


def agent_pids(agents: harness.Agents) -> list[int]:
    if isinstance(agents, harness.HarnessRestarted):
        return [b.proc.pid for b in agents.brokers if b.proc is not None]
    if isinstance(agents, harness.SupervisorRestarted):
        return sorted(agents.broker.agent_pids().values())
    return []


def hold_locks(
    db: Path, lock_s: float, gap_s: float, seconds: float, stopped: Callable[[], bool]
) -> dict[str, Any]:
    """BEGIN EXCLUSIVE on `db` for lock_s, then none for gap_s, over `seconds`; what was
    held: the locks, how long each took to get and was held."""
    conn = sqlite3.connect(db, timeout=60, isolation_level=None)
    locks: list[list[float]] = []  # [waited_s, held_s]
    began = time.monotonic()
    try:
        while time.monotonic() - began < seconds and not stopped():
            asked = time.monotonic()
            conn.execute("BEGIN EXCLUSIVE")
            got = time.monotonic()
            while time.monotonic() - got < lock_s and not stopped():
                time.sleep(0.05)
            conn.execute("ROLLBACK")
            locks.append([round(got - asked, 3), round(time.monotonic() - got, 3)])
            pause_until = time.monotonic() + gap_s
            while time.monotonic() < pause_until and not stopped():
                time.sleep(0.05)
    finally:
        conn.close()
    held = sum(h for _w, h in locks)
    return {
        "db": str(db),
        "locks": len(locks),
        "held_s": round(held, 1),
        "fields": ["waited_s", "held_s"],
        "list": locks,
        "summary": f"{len(locks)} exclusive locks of {lock_s:g} s ({held:.0f} s held)",
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metafaults", description=__doc__.splitlines()[0].rstrip(",")
    )
    harness.add_agent_arguments(parser, agents=2)
    parser.add_argument("--lock-s", type=float, default=5.0, help="each lock held this long")
    parser.add_argument("--gap-s", type=float, default=3.0, help="between two locks")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the locks go on")
    s3faults.add_workload_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the scenario; `env`: extra environment of every agent started (tests)."""
    args = build_parser().parse_args(argv)
    if args.bootstrap:
        raise SystemExit(
            "metafaults starts its own agents, on its own SQLite store: no --bootstrap"
        )
    started = harness.now_iso()
    wall = time.monotonic()
    machine = harness.machine()
    with harness.open_agents(args, env) as agents:
        db = metadata_db(agents)
        if not db.exists():
            raise SystemExit(f"no SQLite metadata store at {db} (another store chosen?)")

        def fault_phase(stopped: Callable[[], bool]) -> dict[str, Any]:
            return hold_locks(db, args.lock_s, args.gap_s, args.seconds, stopped)

        pids_before = agent_pids(agents)
        body = s3faults.run_with_faults(args, agents, SCENARIO, fault_phase)
        # Recovery without a restart: the same agent processes, all still running.
        body["agents_not_restarted"] = agent_pids(agents) == pids_before and all(
            harness.pid_alive(pid) for pid in pids_before
        )
        if not body["agents_not_restarted"]:
            body["ok"], body["exit_status"] = False, max(1, body["exit_status"])
        body["agent_logs"] = {
            **agents.log_errors(),
            "paths": [str(p) for p in agents.logs()] if args.keep_work_dir or args.work_dir else [],
        }
        config = {
            key: getattr(args, key)
            for key in ("lock_s", "gap_s", "seconds", "partitions", "producers", "rate")
        }
        report = {
            "scenario": SCENARIO,
            "label": args.label,
            "started_at": started,
            "duration_s": None,
            "run_id": uuid.uuid4().hex[:8],
            "machine": {**machine, "loadavg_at_end": os.getloadavg()},
            "agents": {**agents.describe(), "args": args.agent_arg, "env": dict(env or {})},
            "config": config,
            **body,
        }
    report["duration_s"] = round(time.monotonic() - wall, 1)
    s3faults.print_summary(report)
    if args.report:
        print(f"  report: {harness.write_report(args.report, report)}")
    return int(report["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
