"""Start and stop real `bucketlog serve` processes for end-to-end tests."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.storage.moto_support import TEST_BUCKET, TEST_CREDENTIALS

# Test brokers listen below the kernel's ephemeral range (32768-60999 by default), so that
# a port freed by a killed agent cannot be taken, while the test starts the agent again,
# by another process's bind to port 0 or by an outgoing connection's local port. Each
# pytest-xdist worker of a run takes its own slice of the range (past the fourth, workers
# share slices, from different starting points, as processes outside xdist share the
# first).
PORT_RANGE = range(20000, 32000)
_SLICES = 4
_next: int | None = None


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _SLICES if worker.isdigit() else 0
    size = len(PORT_RANGE) // _SLICES
    start = PORT_RANGE.start + index * size
    return range(start, start + size)


def free_ports(count: int) -> list[int]:
    """`count` consecutive free ports on 127.0.0.1, taken in turn from this process's slice
    of PORT_RANGE (3,000 ports): a port comes round again only after the rest of the slice
    has (a test that asks for a port and then starts a broker, which asks for its own,
    gets two different ones)."""
    global _next
    ports = _slice()
    if _next is None:
        _next = ports.start + os.getpid() % (len(ports) // 2)
    for _ in range(len(ports)):
        base = _next if _next + count <= ports.stop else ports.start
        _next = base + count
        if all(port_free(port) for port in range(base, base + count)):
            return list(range(base, base + count))
    raise RuntimeError(f"no {count} free ports in a row in {ports}")


def port_free(port: int) -> bool:
    """Whether a socket can bind 127.0.0.1:port now (nothing else holds it)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True if something accepts connections on host:port. A connection alone does not
    say so: when nothing listens on a port of the ephemeral range, the kernel may give
    the connecting socket that very port, and TCP joins the socket to itself."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            return bool(sock.getsockname() != sock.getpeername())
    except OSError:
        return False


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening")
        if listening(port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after its last one.
    return stat.rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def child_pids(parent: int) -> list[int]:
    """The live children of `parent`, from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
                children.append(int(entry))
    return children


@dataclass(frozen=True)
class StoreChoice:
    """The stores of every broker the tests start (set by tests/conftest.py's options).

    All None: each broker keeps the embedded stores in its data dir. Otherwise each data
    dir gets its own FoundationDB root and S3 prefix, so brokers on different data dirs
    stay as separate as on the embedded stores, and a restart on the same data dir finds
    its data again. Arguments a test passes itself come later and win.
    """

    fdb_cluster_file: str | None = None
    s3_endpoint_url: str | None = None
    unavailable: str | None = None  # why the chosen stores cannot run here: skip

    @staticmethod
    def tag(data_dir: Path) -> str:
        return "e2e-" + hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]

    def storage_url(self, data_dir: Path) -> str:
        """The object store a broker on data_dir uses (unless a test passes --storage)."""
        if self.s3_endpoint_url:
            return f"s3://{TEST_BUCKET}/{self.tag(data_dir)}"
        return "file://" + str(Path(data_dir).resolve() / "objects")

    def metadata_url(self, data_dir: Path) -> str:
        """The metadata store a broker on data_dir uses (unless a test passes --metadata)."""
        if self.fdb_cluster_file:
            return f"fdb://{self.fdb_cluster_file}?prefix={self.tag(data_dir)}"
        return "sqlite://" + str(Path(data_dir).resolve() / "metadata.db")

    def args(self, data_dir: Path) -> list[str]:
        tag = self.tag(data_dir)
        args: list[str] = []
        if self.fdb_cluster_file:
            args += ["--metadata", f"fdb://{self.fdb_cluster_file}?prefix={tag}"]
        if self.s3_endpoint_url:
            args += [
                "--storage",
                f"s3://{TEST_BUCKET}/{tag}",
                "--s3-endpoint-url",
                self.s3_endpoint_url,
                # These runs test the store, not S3's 250 ms flush policy.
                "--flush-interval-ms",
                "5",
            ]
        return args

    def env(self) -> dict[str, str]:
        if not self.s3_endpoint_url:
            return {}
        return {
            **TEST_CREDENTIALS,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }


_stores = StoreChoice()


@contextlib.contextmanager
def select_stores(choice: StoreChoice) -> Iterator[None]:
    """Start every BrokerProcess inside the block on `choice`'s stores."""
    global _stores
    previous, _stores = _stores, choice
    try:
        yield
    finally:
        _stores = previous


@dataclass
class BrokerProcess:
    data_dir: Path
    port: int
    agents: int = 1
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    stores: StoreChoice = field(default_factory=StoreChoice)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ports(self) -> list[int]:
        return list(range(self.port, self.port + self.agents))

    def start(self) -> BrokerProcess:
        stores = self.stores = _stores
        if stores.unavailable:
            pytest.skip(stores.unavailable)
        self.log_path = self.data_dir.parent / f"broker-{self.port}.log"
        args = [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--agents",
            str(self.agents),
            *stores.args(self.data_dir),
            *self.extra_args,
        ]
        env = {**os.environ, **stores.env(), **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        for port in self.ports:
            wait_for_port(port, proc=self.proc)
        return self

    def object_keys(self, prefix: str = "") -> list[str]:
        """The keys of the objects in the broker's object store, read from the test."""
        from storage.objectstore import open_store

        store = open_store(
            self.stores.storage_url(self.data_dir), s3_endpoint_url=self.stores.s3_endpoint_url
        )

        async def listed() -> list[str]:
            try:
                return [info.key for info in await store.list(prefix)]
            finally:
                await store.aclose()

        return anyio.run(listed)

    def put_object(self, key: str, data: bytes) -> None:
        """Write an object into the broker's object store behind its back."""
        from storage.objectstore import open_store

        store = open_store(
            self.stores.storage_url(self.data_dir), s3_endpoint_url=self.stores.s3_endpoint_url
        )

        async def put() -> None:
            try:
                await store.put(key, data)
            finally:
                await store.aclose()

        anyio.run(put)

    def read_metadata(self, fn: Any) -> Any:
        """fn(transaction) on the broker's metadata store, read from the test."""
        from metadata.kv import open_kv

        kv = open_kv(self.stores.metadata_url(self.data_dir))
        try:
            return kv.transact_sync(fn)
        finally:
            anyio.run(kv.aclose)

    def stats(self, port: int | None = None) -> dict[str, Any]:
        """The agent's counters as of their last write to its stats file (each second)."""
        path = self.data_dir / f"stats-{port or self.port}.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def agent_pids(self) -> dict[int, int]:
        """Port -> pid of each running agent process of a broker started with agents > 1."""
        assert self.proc is not None
        pids = {}
        for pid in child_pids(self.proc.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            # An agent's command line ends with its own --agents 1 --port P; a child that has
            # not yet exec'd still shows the supervisor's.
            last = {name: argv[i + 1] for i, name in enumerate(argv[:-1]) if name.startswith("--")}
            if last.get("--agents") == "1" and "--port" in last:
                pids[int(last["--port"])] = pid
        return pids

    def kill9(self) -> None:
        """Kill the broker (and its agent children) without any chance to clean up."""
        assert self.proc is not None
        if self.agents > 1:
            subprocess.run(["pkill", "-9", "-P", str(self.proc.pid)], check=False)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill9()
