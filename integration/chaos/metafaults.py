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

Any metadata store, stopped by commands of your own instead of the lock:
`--metadata URL` for the agents, `--stop-command` run at the start of each outage and
`--start-command` at its end (shell commands). `--fdb` starts a throwaway FoundationDB
server (fdbserver and libfdb_c must be installed) and stops it with SIGSTOP and SIGCONT:

    .venv/bin/python -m integration.chaos.metafaults --fdb --lock-s 5 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repository root holds our packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.chaos import harness, s3faults
from tests.support import fdb_server

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


def run_commands(
    stop: str, start: str, lock_s: float, gap_s: float, seconds: float, stopped: Callable[[], bool]
) -> dict[str, Any]:
    """`stop`, then `start` lock_s later, then none for gap_s, over `seconds` (shell
    commands: an outage of the metadata store however it is run); what was done."""
    outages: list[list[float]] = []  # [stop_command_s, down_s]
    began = time.monotonic()
    failed: list[str] = []

    def shell(command: str) -> None:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            failed.append(f"{command!r} exited with {done.returncode}: {done.stderr.strip()}")

    while time.monotonic() - began < seconds and not stopped() and not failed:
        asked = time.monotonic()
        shell(stop)
        down = time.monotonic()
        try:
            while time.monotonic() - down < lock_s and not stopped():
                time.sleep(0.05)
        finally:
            shell(start)
        outages.append([round(down - asked, 3), round(time.monotonic() - down, 3)])
        pause_until = time.monotonic() + gap_s
        while time.monotonic() < pause_until and not stopped():
            time.sleep(0.05)
    held = sum(h for _s, h in outages)
    return {
        "stop_command": stop,
        "start_command": start,
        "locks": len(outages),
        "held_s": round(held, 1),
        "fields": ["stop_command_s", "down_s"],
        "list": outages,
        "command_failures": failed,
        "summary": f"{len(outages)} outages of {lock_s:g} s ({held:.0f} s down)",
    }


def fdbserver_pids(cluster_file: str) -> list[int]:
    """The fdbserver processes started with this cluster file (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"fdbserver" and cluster_file.encode() in argv:
            found.append(int(entry))
    return found


@contextlib.contextmanager
def throwaway_fdb() -> Iterator[tuple[str, list[int]]]:
    """A FoundationDB server of its own (tests/support/fdb_server.py): its cluster file
    and process ids."""
    with tempfile.TemporaryDirectory(prefix="bucketlog-chaos-fdb-") as workdir:
        with fdb_server.fdb_cluster(Path(workdir)) as cluster_file:
            pids = fdbserver_pids(cluster_file)
            if not pids:
                raise SystemExit(f"no fdbserver process of {cluster_file} found to stop")
            try:
                yield cluster_file, pids
            finally:
                for pid in pids:  # never leave it stopped
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 18)  # SIGCONT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metafaults", description=__doc__.splitlines()[0].rstrip(",")
    )
    harness.add_agent_arguments(parser, agents=2)
    parser.add_argument("--lock-s", type=float, default=5.0, help="each lock held this long")
    parser.add_argument("--gap-s", type=float, default=3.0, help="between two locks")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the locks go on")
    parser.add_argument("--metadata", help="the agents' metadata store URL (with the commands)")
    parser.add_argument(
        "--stop-command", help="instead of the SQLite lock: a shell command that stops the store"
    )
    parser.add_argument("--start-command", help="the shell command that starts it again")
    parser.add_argument(
        "--fdb",
        action="store_true",
        help="a FoundationDB server started here, stopped with SIGSTOP and SIGCONT",
    )
    s3faults.add_workload_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the scenario; `env`: extra environment of every agent started (tests)."""
    args = build_parser().parse_args(argv)
    if args.bootstrap:
        raise SystemExit("metafaults starts its own agents, on its own store: no --bootstrap")
    if bool(args.stop_command) != bool(args.start_command):
        raise SystemExit("--stop-command and --start-command go together")
    if not args.fdb:
        return run(args, env)
    if not fdb_server.available():
        print(f"{SCENARIO}: not run: {fdb_server.FDB_MISSING}", file=sys.stderr)
        return 2
    with throwaway_fdb() as (cluster_file, pids):
        ids = " ".join(str(pid) for pid in pids)
        args.metadata = f"fdb://{cluster_file}"
        args.stop_command, args.start_command = f"kill -STOP {ids}", f"kill -CONT {ids}"
        return run(args, env)


def run(args: argparse.Namespace, env: dict[str, str] | None) -> int:
    started = harness.now_iso()
    wall = time.monotonic()
    machine = harness.machine()
    if args.metadata:
        args.agent_arg = [*args.agent_arg, "--metadata", args.metadata]
    with harness.open_agents(args, env) as agents:
        if args.stop_command:

            def fault_phase(stopped: Callable[[], bool]) -> dict[str, Any]:
                return run_commands(
                    args.stop_command,
                    args.start_command,
                    args.lock_s,
                    args.gap_s,
                    args.seconds,
                    stopped,
                )

        else:
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
        if body["faults"].get("command_failures"):
            body["problems"].extend(body["faults"]["command_failures"])
            body["ok"], body["exit_status"] = False, 2
        if not body["agents_not_restarted"]:
            body["ok"], body["exit_status"] = False, max(1, body["exit_status"])
        body["agent_logs"] = {
            **agents.log_errors(),
            "paths": [str(p) for p in agents.logs()] if args.keep_work_dir or args.work_dir else [],
        }
        config = {
            key: getattr(args, key)
            for key in (
                "lock_s",
                "gap_s",
                "seconds",
                "partitions",
                "producers",
                "rate",
                "metadata",
                "stop_command",
                "start_command",
            )
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
