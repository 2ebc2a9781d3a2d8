"""Disk full: the agents' local object store (or, with `--store metadata`, their SQLite
metadata store) on a small volume that is filled to the last byte, again and again, while producers write with acks=all and a consumer reads;
then the volume is freed, recovery is timed (no agent restarted), everything is read
back and checked.

    sudo .venv/bin/python -m integration.chaos.diskfull --full-s 5 --gap-s 3 --seconds 60 \\
        --report integration/chaos/results/disk-full.json

1. The volume: `--volume DIR` (a folder on a small file system of your own), or else a
   tmpfs of `--volume-mb` mounted here (that needs root; without it the run stops with
   exit status 3, not run, and says why).
2. Starts `--agents` agents whose object store is `file://<volume>/objects` (the
   metadata store stays in the work dir, on another volume), or whose metadata store is
   `sqlite:///<volume>/metadata.db` (the objects stay in the work dir), and a topic of
   `--partitions` partitions.
3. Runs the clients of the S3 scenario (s3faults.run_with_faults: the kill loop's
   producers, a probe producer that never retries, a re-reading consumer).
4. For `--seconds`: writes a ballast file until the volume answers ENOSPC, keeps it
   full for `--full-s` (space an agent frees, deleting objects after a compaction, is
   taken again at once), deletes the ballast, waits `--gap-s`, and again. An upload or
   a commit that fails fails its produce with KAFKA_STORAGE_ERROR, which clients retry;
   nothing of it is committed.
5. Recovery (a new producer's record acknowledged and read back), read-back and check,
   as in the S3 scenario; the same exit status. No temp file may be left on the volume.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
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

from integration.chaos import harness, metafaults, s3faults
from storage.local import TEMP_PREFIX

SCENARIO = "disk-full"
NOT_RUN = 3  # exit status: no volume to fill here
CHUNK = 1 << 20  # the ballast grows by this much, then by 4 KiB at the end


class VolumeUnavailable(Exception):
    """No small volume to fill: none given and no tmpfs could be mounted."""


@contextlib.contextmanager
def small_volume(given: str | None, size_mb: int) -> Iterator[Path]:
    """The folder to fill: `given`, or a tmpfs of size_mb mounted for the run."""
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    mount_point = Path(tempfile.mkdtemp(prefix="bucketlog-diskfull-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        reason = (mounted.stderr or mounted.stdout).strip()
        raise VolumeUnavailable(
            f"could not mount a {size_mb} MiB tmpfs ({reason or 'mount failed'}); "
            "run as root or give --volume DIR on a small file system"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        with contextlib.suppress(OSError):
            mount_point.rmdir()


def _top_up(fd: int) -> int:
    """Append to the ballast until the volume is full; the bytes written."""
    written = 0
    for size in (CHUNK, 4096, 512):
        block = b"\0" * size
        while True:
            try:
                n = os.write(fd, block)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                break
            written += n
            if n < size:
                break
    return written


def fill_volume(
    volume: Path, full_s: float, gap_s: float, seconds: float, stopped: Callable[[], bool]
) -> dict[str, Any]:
    """Keep `volume` full for full_s, free it for gap_s, over `seconds`: what was done
    (each fill: bytes of ballast, bytes taken again while full, seconds held)."""
    fills: list[list[float]] = []  # [ballast_bytes, retaken_bytes, held_s]
    began = time.monotonic()
    ballast = volume / "ballast"
    while time.monotonic() - began < seconds and not stopped():
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            first = _top_up(fd)
            got = time.monotonic()
            retaken = 0
            while time.monotonic() - got < full_s and not stopped():
                time.sleep(0.05)
                retaken += _top_up(fd)
        finally:
            os.close(fd)
            ballast.unlink()
        fills.append([first, retaken, round(time.monotonic() - got, 3)])
        pause_until = time.monotonic() + gap_s
        while time.monotonic() < pause_until and not stopped():
            time.sleep(0.05)
    held = sum(f[2] for f in fills)
    return {
        "volume": str(volume),
        "fills": len(fills),
        "held_s": round(held, 1),
        "fields": ["ballast_bytes", "retaken_bytes", "held_s"],
        "list": fills,
        "summary": f"{len(fills)} fills of the volume, full for {held:.0f} s",
    }


def temp_files(volume: Path) -> list[str]:
    """Temp files of unfinished uploads under the volume's objects folder."""
    root = volume / "objects"
    return sorted(
        str(Path(folder, name).relative_to(root))
        for folder, _dirs, names in os.walk(root)
        for name in names
        if name.startswith(TEMP_PREFIX)
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diskfull", description=__doc__.splitlines()[0].rstrip(",")
    )
    harness.add_agent_arguments(parser, agents=2)
    parser.add_argument(
        "--volume", help="a folder on a small file system to fill (default: mount a tmpfs)"
    )
    parser.add_argument("--volume-mb", type=int, default=64, help="size of the tmpfs mounted")
    parser.add_argument(
        "--store",
        choices=("objects", "metadata"),
        default="objects",
        help="the store put on the volume: the local object store or the SQLite metadata store",
    )
    parser.add_argument("--full-s", type=float, default=5.0, help="each fill held this long")
    parser.add_argument("--gap-s", type=float, default=3.0, help="between two fills")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the fills go on")
    s3faults.add_workload_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run the scenario; `env`: extra environment of every agent started (tests)."""
    args = build_parser().parse_args(argv)
    if args.bootstrap:
        raise SystemExit("diskfull starts its own agents, on its own volume: no --bootstrap")
    started = harness.now_iso()
    wall = time.monotonic()
    machine = harness.machine()
    try:
        with small_volume(args.volume, args.volume_mb) as volume:
            if args.store == "objects":
                args.agent_arg = [*args.agent_arg, "--storage", f"file://{volume}/objects"]
            else:
                args.agent_arg = [*args.agent_arg, "--metadata", f"sqlite:///{volume}/metadata.db"]
            with harness.open_agents(args, env) as agents:

                def fault_phase(stopped: Callable[[], bool]) -> dict[str, Any]:
                    return fill_volume(volume, args.full_s, args.gap_s, args.seconds, stopped)

                pids = metafaults.agent_pids(agents)
                body = s3faults.run_with_faults(args, agents, SCENARIO, fault_phase)
                alive = all(harness.pid_alive(pid) for pid in pids)
                body["agents_not_restarted"] = metafaults.agent_pids(agents) == pids and alive
                body["temp_files_left"] = temp_files(volume)
                if not body["agents_not_restarted"] or body["temp_files_left"]:
                    body["ok"], body["exit_status"] = False, max(1, body["exit_status"])
                body["agent_logs"] = {
                    **agents.log_errors(),
                    "paths": [str(p) for p in agents.logs()]
                    if args.keep_work_dir or args.work_dir
                    else [],
                }
                config = {
                    key: getattr(args, key)
                    for key in (
                        "store",
                        "volume_mb",
                        "full_s",
                        "gap_s",
                        "seconds",
                        "partitions",
                        "producers",
                        "rate",
                    )
                }
                report = {
                    "scenario": SCENARIO,
                    "label": args.label,
                    "started_at": started,
                    "duration_s": None,
                    "run_id": uuid.uuid4().hex[:8],
                    "machine": {**machine, "loadavg_at_end": os.getloadavg()},
                    "agents": {
                        **agents.describe(),
                        "args": args.agent_arg,
                        "env": dict(env or {}),
                    },
                    "config": config,
                    **body,
                }
    except VolumeUnavailable as exc:
        print(f"{SCENARIO}: not run: {exc}", file=sys.stderr)
        return NOT_RUN
    report["duration_s"] = round(time.monotonic() - wall, 1)
    s3faults.print_summary(report)
    if report["temp_files_left"]:
        print(f"  temp files left on the volume: {report['temp_files_left'][:5]}")
    if args.report:
        print(f"  report: {harness.write_report(args.report, report)}")
    return int(report["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
