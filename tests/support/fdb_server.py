"""A FoundationDB cluster for tests: a throwaway `fdbserver` on 127.0.0.1, or a given one.

`fdb_cluster(workdir)` yields the path of a cluster file:
- BUCKETLOG_TEST_FDB_CLUSTER_FILE, if set (a cluster someone runs for the tests);
- otherwise a fresh single-process, in-memory cluster: `fdbserver` on a free port with its
  data and logs under `workdir`, configured with `configure new single memory`, stopped
  when the block ends.
Either way the client library libfdb_c must load in this process (the broker processes
and the KV tests use it). When something is missing, `FDBUnavailable` says what, and the
tests skip with FDB_MISSING.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

FDB_MISSING = "FoundationDB client library libfdb_c and fdbserver are not installed on this machine"
FDB_CLUSTER_FILE_ENV = "BUCKETLOG_TEST_FDB_CLUSTER_FILE"

# Where the foundationdb-server/-clients packages put their programs (often off PATH).
_SEARCH = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/local/libexec")


class FDBUnavailable(Exception):
    """No FoundationDB cluster can be had on this machine."""


@functools.cache
def libfdb_c_loads() -> bool:
    try:
        # Importing fdb.impl loads libfdb_c (fdb.tuple alone does not); it selects no
        # API version, so the backend can still select its own.
        import fdb.impl  # noqa: F401
    except Exception:
        return False
    return True


def _program(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in _SEARCH:
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def available() -> bool:
    """True if fdb_cluster() can yield a cluster here (without starting anything)."""
    if not libfdb_c_loads():
        return False
    if os.environ.get(FDB_CLUSTER_FILE_ENV):
        return True
    return _program("fdbserver") is not None and _program("fdbcli") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fdbcli(fdbcli: str, cluster_file: Path, command: str, timeout: int = 10) -> str:
    done = subprocess.run(
        [fdbcli, "-C", str(cluster_file), "--timeout", str(timeout), "--exec", command],
        capture_output=True,
        text=True,
        timeout=timeout + 20,
    )
    return done.stdout + done.stderr


@contextlib.contextmanager
def fdb_cluster(workdir: Path, startup_timeout: float = 60.0) -> Iterator[str]:
    """Yield a cluster file path; raises FDBUnavailable if FoundationDB is not here."""
    if not available():
        raise FDBUnavailable(FDB_MISSING)
    given = os.environ.get(FDB_CLUSTER_FILE_ENV)
    if given:
        yield given
        return
    fdbserver, fdbcli = _program("fdbserver"), _program("fdbcli")
    assert fdbserver is not None and fdbcli is not None
    port = _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cluster_file = workdir / "fdb.cluster"
    cluster_file.write_text(f"bucketlog:{secrets.token_hex(8)}@127.0.0.1:{port}\n")
    (workdir / "data").mkdir(exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    server = subprocess.Popen(
        [
            fdbserver,
            # Short flags: the long ones are spelled with "_" or "-" depending on version.
            "-C",
            str(cluster_file),
            "-p",
            f"127.0.0.1:{port}",
            "-l",
            f"127.0.0.1:{port}",
            "-d",
            str(workdir / "data"),
            "-L",
            str(workdir / "logs"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + startup_timeout
        configured = False
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"fdbserver exited with {server.returncode}")
            if not configured:
                out = _fdbcli(fdbcli, cluster_file, "configure new single memory")
                # A retry after a timed-out first answer finds the database made.
                configured = "Database created" in out or "already exists" in out
            if configured:
                out = _fdbcli(fdbcli, cluster_file, "status minimal")
                if "The database is available" in out:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"FoundationDB on 127.0.0.1:{port} did not come up: {out}")
            time.sleep(0.2)
        yield str(cluster_file)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
