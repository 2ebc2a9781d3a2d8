"""Benchmarks: Apache Kafka and bucketlog on the same machine, the same workloads.

Usage: integration/bench/run.py [--systems kafka,bucketlog-1,bucketlog-2]
                                [--extras pinned,s3] [--runs 2] [--scale 1.0]
                                [--out integration/bench/results]

Starts each system in turn (Apache Kafka single-node KRaft from the Maven jars, then
`bucketlog serve --agents 1`, then `--agents 2`, each in a fresh temp dir, listening on
127.0.0.1 only), runs every workload `--runs` times against it and stops it; then the
extra sections: `pinned_rows` (the clients on one core, each agent pinned to the
others) and `s3_rows` (one agent on the local store, then one on the S3 store against
moto's server). Writes `results/<date>.md` and `.json`. Every child process has a
deadline. The Kafka classes run as integration/bin/kafka-run-class runs them, from a
private copy of the jars.

Broker cost: CPU seconds (utime + stime of the broker's process tree, from /proc) per GB
moved, peak RSS (sum of VmHWM over the tree). bucketlog's object PUTs, GETs and
metadata transactions come from the `stats-<port>.json` files each agent writes under
its data dir once a second (see broker/stats.py).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INTEGRATION = HERE.parent
REPO = INTEGRATION.parent
VENV_BIN = Path(sys.executable).parent

sys.path.insert(0, str(REPO))
from tests.support.brokerproc import listening, port_free  # noqa: E402

RECORD_SIZE = 1024
BATCH_SIZE = 262144  # producer batch.size in bytes (the Java default is 16 KiB)
LINGER_MS = 5
TOOL_TIMEOUT = 180  # seconds any one tool run may take
# Before each system of the main table starts: a sync, then this long for the disk to
# settle. The system before it removed its folder on stopping, and on a file system
# mounted with `discard` the freed blocks are discarded in the journal commits that
# follow, which every fsync waits for: one agent started right after a Kafka run made
# 12.1-69.8 MB/s on produce-1p, and 53.7-87.3 after a sync and 20 s (after_kafka.py).
SETTLE_S = 20.0
KAFKA_HEAP = "-Xmx1G -Xms1G"  # kafka-server-start.sh's default


def print_line(line: dict[str, Any], out: str | None) -> None:
    """Print a result as one JSON line, and append it to the file `out` if given."""
    text = json.dumps(line)
    print(text, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


# -- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if listening(port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def proc_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    return tree_cpu_split(root)[0]


def cpu_ticks(pid: int) -> tuple[int, int] | None:
    """User and system CPU of one process in clock ticks (utime, stime); None: gone."""
    return stat_ticks(f"/proc/{pid}/stat")


def stat_ticks(path: str) -> tuple[int, int] | None:
    """utime and stime in clock ticks from a /proc stat file (a process's or, under
    /proc/PID/task, one thread's); None: the process or thread is gone."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]), int(fields[12])


def machine_cpu() -> tuple[float, float]:
    """Seconds the machine's CPUs ran anything (user, nice, system, irq, softirq) and
    seconds the hypervisor gave to others while this machine had work (steal), since
    boot, from /proc/stat's first line."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def large_objects(data_dir: Path) -> list[str]:
    """A local store's files over 1 MiB outside its segment folder: compaction's outputs."""
    out = []
    for root, _dirs, files in os.walk(data_dir):
        if ".segments" in root:
            continue
        for name in files:
            path = os.path.join(root, name)
            if os.path.getsize(path) > 1 << 20:
                out.append(path)
    return out


def page_cache_bytes(paths: list[str]) -> tuple[int, int]:
    """(bytes in the page cache, bytes) of the files, by util-linux's fincore."""
    if not paths:
        return 0, 0
    found = subprocess.run(
        ["fincore", "-b", "-n", "-o", "RES,SIZE", *paths], capture_output=True, text=True
    ).stdout.split()
    values = list(map(int, found))
    return sum(values[0::2]), sum(values[1::2])


def tree_cpu_split(root: int) -> tuple[float, float]:
    """CPU seconds of the process tree under root, and of it the seconds of its
    multiprocessing children: a bucketlog agent's compaction workers (broker.workers),
    which build level-1 and level-2 objects from data written before, in whatever
    workload's window they run."""
    total = workers = 0
    for pid in proc_tree(root):
        ticks = cpu_ticks(pid)
        worker = is_worker(pid)
        if ticks is None or worker is None:
            continue
        used = sum(ticks)
        total += used
        if worker:
            workers += used
    return total / CLK_TCK, workers / CLK_TCK


def is_worker(pid: int) -> bool | None:
    """Whether the process is a multiprocessing child (a bucketlog agent's compaction
    worker); None: it is gone."""
    try:
        return b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def tree_cpu_user_system(root: int) -> tuple[float, float]:
    """User and system CPU seconds of the process tree under root."""
    user = system = 0
    for pid in proc_tree(root):
        ticks = cpu_ticks(pid)
        if ticks is not None:
            user, system = user + ticks[0], system + ticks[1]
    return user / CLK_TCK, system / CLK_TCK


def tree_peak_rss_mb(root: int) -> float:
    total = 0
    for pid in proc_tree(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


_JARS: list[Path] = []


def kafka_class(main_class: str, heap: str = "-Xmx512m") -> list[str]:
    """A java command line for one Kafka class (what integration/bin/kafka-run-class runs).

    The jars are copied once per benchmark run, so a concurrent refresh of
    integration/.cache/jars cannot pull them away mid-run; the copy (about 55 MB) is
    removed when the run's process exits.
    """
    if not _JARS:
        source = INTEGRATION / ".cache" / "jars" / "kafka"
        if not source.is_dir():
            subprocess.run([str(INTEGRATION / "fetch-jars.sh"), "kafka"], check=True, timeout=900)
        folder = tempfile.mkdtemp(prefix="bench-jars-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        copy = Path(folder) / "kafka"
        shutil.copytree(source, copy)
        _JARS.append(copy)
    return [
        os.environ.get("JAVA", "java"),
        *heap.split(),
        f"-Dlog4j2.configurationFile={INTEGRATION / 'log4j2.properties'}",
        "-cp",
        f"{_JARS[0]}/*",
        main_class,
    ]


def run_tool(argv: list[str], timeout: float = TOOL_TIMEOUT) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


# -- systems -----------------------------------------------------------------------------


class System:
    name = ""
    bootstrap = ""
    root_pid = 0

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def counters(self) -> dict[str, int] | None:
        return None


class Kafka(System):
    def __init__(self) -> None:
        self.name = "kafka"
        self.dir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
        self.port, self.controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        props = self.dir / "server.properties"
        # Everything not listed keeps Kafka's default, log.flush.* included.
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={self.dir / 'logs'}",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                ]
            )
            + "\n"
        )
        # A random id, not one starting with "-" (the tool would read it as an option;
        # Kafka's own Uuid.randomUuid draws again for the same reason).
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        run_tool(
            [*kafka_class("kafka.tools.StorageTool"), "format", "-t", cluster_id, "-c", str(props)]
        )
        self.log = open(self.dir / "server.log", "wb")
        self.proc = subprocess.Popen(
            [*kafka_class("kafka.Kafka", KAFKA_HEAP), str(props)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.root_pid = self.proc.pid
        wait_port(self.port, time.monotonic() + 60)
        admin_ready(self.bootstrap)

    def stop(self) -> None:
        stop_proc(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Bucketlog(System):
    def __init__(
        self,
        agents: int,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        command: str | None = None,
    ) -> None:
        self.name = f"bucketlog-{agents}"
        self.agents = agents
        # Another command for `bucketlog` (e.g. an older checkout's); default: the
        # BENCH_BUCKETLOG variable's, else this venv's.
        self.command = command
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.dir = Path(tempfile.mkdtemp(prefix="bench-bucketlog-"))
        self.port = free_port()
        while any(not port_free(self.port + i) for i in range(agents)):
            self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [
                *(
                    self.command or os.environ.get("BENCH_BUCKETLOG", str(VENV_BIN / "bucketlog"))
                ).split(),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--agents",
                str(self.agents),
                "--data-dir",
                str(self.dir / "data"),
                "--log-level",
                "WARNING",
                *self.extra_args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # PYTHONSAFEPATH: `python -m broker` does not put the working directory first
            # on its path, so that a command naming another tree on PYTHONPATH runs that
            # tree's code and not this checkout's (the bench runs from the checkout).
            env={**os.environ, "PYTHONSAFEPATH": "1", **self.env},
        )
        self.root_pid = self.proc.pid
        for i in range(self.agents):
            wait_port(self.port + i, time.monotonic() + 60)
        admin_ready(self.bootstrap)

    def restart(self) -> None:
        """Stop the agents and start them again on the same stores: their caches are empty."""
        stop_proc(self.proc)
        self.log.close()
        self.start()

    def stop(self) -> None:
        stop_proc(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent_pids(self) -> dict[int, int]:
        """Each agent's process by its port (with --agents N, the supervisor's children)."""
        if self.agents == 1:
            return {self.port: self.root_pid}
        out = {}
        for pid in proc_tree(self.root_pid)[1:]:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            ports = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"]
            if ports:  # the last --port is the agent's own (broker/cli.py's _run_many)
                out[int(ports[-1])] = pid
        return out

    def pin(self, agent_cpus: list[set[int]]) -> dict[str, str]:
        """Agent i's threads on agent_cpus[i], the supervisor's on all of them. Returns the
        CPUs each process is allowed, read back from /proc."""
        pids = self.agent_pids()
        if len(pids) != self.agents:
            raise RuntimeError(f"found {len(pids)} of {self.agents} agent processes")
        if self.agents > 1:
            pin_process(self.root_pid, set().union(*agent_cpus))
        for i in range(self.agents):
            pin_process(pids[self.port + i], agent_cpus[i])
        observed = {f"agent {i}": allowed_cpus(pids[self.port + i]) for i in range(self.agents)}
        if self.agents > 1:
            observed["supervisor"] = allowed_cpus(self.root_pid)
        return observed

    def counters(self) -> dict[str, int]:
        """Sum of every agent's counters, as of their last write (at most 1 s old)."""
        total: dict[str, int] = {}
        for i in range(self.agents):
            path = self.dir / "data" / f"stats-{self.port + i}.json"
            try:
                body = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            groups = (
                "pipeline",
                "store",
                "cache",
                "reader",
                "read_ahead",
                "metadata",
                "put_hedge",
                "compaction",
                "disk_cache",
            )
            for group in groups:
                for k, v in body.get(group, {}).items():
                    total[f"{group}.{k}"] = total.get(f"{group}.{k}", 0) + int(v)
        return total


# Made-up credentials for moto (the S3 rows, lightning.py); a developer's own AWS
# profile stays out of it.
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


class Moto:
    """moto's S3 server (`moto_server`) in a process of its own, with one bucket."""

    def __init__(self, bucket: str, tmpdir: str | None = None) -> None:
        self.bucket = bucket
        # moto keeps an object over 5 MB in a temporary file: TMPDIR says on what disk.
        self.tmpdir = tmpdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={
                **os.environ,
                **S3_CREDENTIALS,
                **({"TMPDIR": self.tmpdir} if self.tmpdir else {}),
            },
        )
        wait_port(self.port, time.monotonic() + 30)
        self.client().create_bucket(Bucket=self.bucket)

    def client(self) -> Any:
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=S3_CREDENTIALS["AWS_REGION"],
        )
        return session.client("s3", endpoint_url=self.url)

    def stop(self) -> None:
        stop_proc(self.proc)


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus`; a thread started later inherits its creator's."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


def allowed_cpus(pid: int) -> str:
    """The CPUs `pid`'s threads may run on ("1", "0-1"), or a list of them if they differ."""
    seen = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    seen.add(line.split(":", 1)[1].strip())
    return " | ".join(sorted(seen))


@contextlib.contextmanager
def clients_on(cpus: set[int]) -> Iterator[None]:
    """This thread, and so every thread and tool process it starts, on `cpus`."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def receive_frame(sock: socket.socket) -> bytearray:
    """One Kafka response frame from a blocking socket, without its size prefix."""
    (size,) = struct.unpack(">i", _receive_exactly(sock, 4))
    return _receive_exactly(sock, size)


def _receive_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("the broker closed the connection")
        got += n
    return buffer


def stop_proc(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for pid in reversed(proc_tree(proc.pid)):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        proc.wait(timeout=10)


def admin_ready(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=5)
            if md.brokers:
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{bootstrap} never answered Metadata")


@contextlib.contextmanager
def side_by_side() -> Iterator[list[System]]:
    """Kafka and one bucketlog agent, both running for the block, for measurements that
    take turns between them; each stopped at the end."""
    started: list[System] = []
    try:
        for system in (Kafka(), Bucketlog(1)):
            system.start()
            started.append(system)
        yield started
    finally:
        for system in started:
            system.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], request_timeout=60
    )
    futures[name].result(timeout=90)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until every partition has a leader
        md = admin.list_topics(name, timeout=10).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            if all(p.leader >= 0 for p in md.partitions.values()):
                return
        time.sleep(0.2)
    raise RuntimeError(f"topic {name} has no leaders")


# -- workloads ---------------------------------------------------------------------------

PERF_RE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th"
)
# With --warmup-records the tool adds a line for the records after the warm-up.
STEADY_RE = re.compile(
    r"(\d+) steady state records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), "
    r"[\d.]+ ms avg latency, ([\d.]+) ms max latency, (\d+) ms 50th, \d+ ms 95th, "
    r"(\d+) ms 99th"
)


def producer_perf(
    bootstrap: str,
    topic: str,
    records: int,
    compression: str,
    throughput: int = -1,
    warmup: int = 0,
) -> dict[str, float]:
    """One ProducerPerformance run. With `warmup`, latencies are the tool's steady-state
    figures (records after the first `warmup`); throughput is always the whole run's."""
    out = run_tool(
        [
            *kafka_class("org.apache.kafka.tools.ProducerPerformance"),
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(RECORD_SIZE),
            "--throughput",
            str(throughput),
            *(["--warmup-records", str(warmup)] if warmup else []),
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=all",
            f"batch.size={BATCH_SIZE}",
            f"linger.ms={LINGER_MS}",
            f"compression.type={compression}",
        ]
    )
    matches = PERF_RE.findall(out)
    if not matches:
        raise RuntimeError(f"no summary in producer perf output: {out[-500:]}")
    sent, rps, mbps, _avg, mx, p50, _p95, p99 = (float(x) for x in matches[-1])
    result = {
        "records": sent,
        "records_s": rps,
        "mb_s": mbps,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": mx,
    }
    if warmup:
        steady = STEADY_RE.findall(out)
        if not steady:
            raise RuntimeError(f"no steady-state summary in producer perf output: {out[-500:]}")
        n, smx, sp50, sp99 = (float(x) for x in steady[-1])
        result.update(
            {
                "warmup_records": warmup,
                "all_p50_ms": p50,
                "all_p99_ms": p99,
                "all_max_ms": mx,
                "p50_ms": sp50,
                "p99_ms": sp99,
                "max_ms": smx,
            }
        )
    return result


def producers_perf(
    bootstrap: str,
    topic: str,
    producers: int,
    records: int,
    compression: str,
    throughput: int = -1,
    warmup: int = 0,
) -> dict[str, float]:
    """`producers` perf tools at once; throughput is the sum, latency the worst."""
    results: list[dict[str, float]] = []
    errors: list[BaseException] = []
    start = time.monotonic()

    def one() -> None:
        try:
            results.append(
                producer_perf(
                    bootstrap, topic, records // producers, compression, throughput, warmup
                )
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TOOL_TIMEOUT + 10)
    if errors:
        raise errors[0]
    wall = time.monotonic() - start

    def latencies(prefix: str) -> dict[str, float]:
        """The producers' latencies: the median p50, the worst p99 and max."""
        return {
            f"{prefix}p50_ms": statistics.median(r[f"{prefix}p50_ms"] for r in results),
            f"{prefix}p99_ms": max(r[f"{prefix}p99_ms"] for r in results),
            f"{prefix}max_ms": max(r[f"{prefix}max_ms"] for r in results),
        }

    return {
        **({"warmup_records": warmup, **latencies("all_")} if warmup else {}),
        "records": sum(r["records"] for r in results),
        "records_s": sum(r["records_s"] for r in results),
        "mb_s": sum(r["mb_s"] for r in results),
        **latencies(""),
        "wall_s": wall,
    }


def consumer_perf(
    bootstrap: str, topic: str, records: int, timeout: float = TOOL_TIMEOUT
) -> dict[str, float]:
    out = run_tool(
        [
            *kafka_class("org.apache.kafka.tools.ConsumerPerformance"),
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--timeout",
            "60000",
        ],
        timeout,
    )
    lines = [line for line in out.splitlines() if line.strip() and line[0].isdigit()]
    if not lines:
        raise RuntimeError(f"no summary in consumer perf output: {out[-500:]}")
    f = [x.strip() for x in lines[-1].split(",")]
    # start, end, MB, MB/s, nMsg, nMsg/s, rebalance ms, fetch ms, fetch MB/s, fetch nMsg/s
    return {"records": float(f[4]), "mb_s": float(f[8]), "records_s": float(f[9])}


def produce_all(
    producer: Any, topic: str, payload: bytes, records: int, report: Any, deadline: float
) -> None:
    """confluent-kafka: hand `records` copies of payload to the producer for partition 0,
    waiting for room in its queue (not for their acks)."""
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, payload, partition=0, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
                if time.monotonic() > deadline:
                    raise RuntimeError("python produce timed out") from None
        producer.poll(0)


def python_workload(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    """confluent-kafka: produce `records` 1 KiB records (acks=all, linger 5 ms), consume them."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    payload = os.urandom(RECORD_SIZE)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "batch.size": 1048576,
        }
    )
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    start = time.monotonic()
    produce_all(producer, topic, payload, records, report, start + TOOL_TIMEOUT)
    if producer.flush(TOOL_TIMEOUT) != 0 or failed[0]:
        raise RuntimeError(f"python produce: {failed[0]} failed")
    produce_s = time.monotonic() - start

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.monotonic()
    deadline = start + TOOL_TIMEOUT
    while got < records and time.monotonic() < deadline:
        for m in consumer.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    consume_s = time.monotonic() - start
    consumer.close()
    mb = records * RECORD_SIZE / 1e6
    return {
        "records": records,
        "produce_mb_s": mb / produce_s,
        "produce_records_s": records / produce_s,
        "consume_mb_s": got * RECORD_SIZE / 1e6 / consume_s,
        "consume_records_s": got / consume_s,
    }


def end_to_end(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[str, float]:
    """A tailing consumer sees records produced at `rate`/s; latency = seen - sent."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 500,
        }
    )
    consumer.assign([TopicPartition(topic, 0, -1)])  # the end: a tailing consumer
    e2e: list[float] = []
    acks: list[float] = []
    stop = threading.Event()

    def tail() -> None:
        while not stop.is_set():
            # poll, not consume(n, timeout): consume waits for n records or the timeout.
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                e2e.append(time.time() - int.from_bytes(m.value()[:8], "big") / 1e9)

    t = threading.Thread(target=tail)
    t.start()
    time.sleep(2)  # the consumer has its assignment and is polling the end
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": LINGER_MS})
    pad = b"x" * (RECORD_SIZE - 8)
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            producer.poll(delay)
        sent = time.time()

        def ack(err: Any, _msg: Any, sent: float = sent) -> None:
            if err is None:
                acks.append(time.time() - sent)

        producer.produce(
            topic, time.time_ns().to_bytes(8, "big") + pad, partition=0, on_delivery=ack
        )
    producer.flush(30)
    deadline = time.monotonic() + 10
    while len(e2e) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    t.join(10)
    consumer.close()
    if not e2e or not acks:
        raise RuntimeError("end-to-end: nothing arrived")
    return {
        "records": n,
        "seen": len(e2e),
        "e2e_p50_ms": pct(e2e, 50) * 1000,
        "e2e_p99_ms": pct(e2e, 99) * 1000,
        "produce_p50_ms": pct(acks, 50) * 1000,
        "produce_p99_ms": pct(acks, 99) * 1000,
    }


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


# -- the run -----------------------------------------------------------------------------


def client_cpu_seconds() -> float:
    """CPU of this process and of its child processes that have ended (the perf tools)."""
    own, ended = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def measure(
    system: System, megabytes: float, fn: Any, others: dict[str, int] | None = None
) -> dict[str, Any]:
    """Run fn(); add broker CPU s/GB and, for bucketlog, request counts per GB and per s.

    Also the clients' CPU (this process and the tools it ran) and that of each process
    tree in `others` (name -> root pid, e.g. moto's server), each apart."""
    time.sleep(1.2)  # counters of the previous workload are on disk
    (before_cpu, before_workers), before = tree_cpu_split(system.root_pid), system.counters()
    named = others or {}
    before_others = {name: tree_cpu_seconds(pid) for name, pid in named.items()}
    before_clients = client_cpu_seconds()
    before_busy, before_steal = machine_cpu()
    start = time.monotonic()
    result: dict[str, Any] = fn()
    wall = time.monotonic() - start
    after_cpu, after_workers = tree_cpu_split(system.root_pid)
    cpu, workers = after_cpu - before_cpu, after_workers - before_workers
    clients = client_cpu_seconds() - before_clients
    used = {name: tree_cpu_seconds(pid) - before_others[name] for name, pid in named.items()}
    after_busy, after_steal = machine_cpu()
    gb = megabytes / 1000
    result["broker_cpu_s"] = round(cpu, 2)
    result["broker_cpu_s_per_gb"] = round(cpu / gb, 1) if gb else None
    # The same without the compaction workers' share (0 for Kafka, which has none).
    result["broker_workers_cpu_s"] = round(workers, 2)
    result["broker_cpu_s_per_gb_without_workers"] = round((cpu - workers) / gb, 1) if gb else None
    # Cores busy on average while the workload ran (1.0: one core all the time).
    result["broker_cores"] = round(cpu / wall, 2)
    result["client_cpu_s"] = round(clients, 2)
    result["client_cores"] = round(clients / wall, 2)
    for name, seconds in used.items():
        result[f"{name}_cpu_s"] = round(seconds, 2)
        result[f"{name}_cpu_s_per_gb"] = round(seconds / gb, 1) if gb else None
    result["wall_s"] = round(wall, 2)
    # What else the machine did meanwhile: the CPU of every process that is neither the
    # broker, nor a client, nor one of `others` (a run whose figures moved with it was
    # shared), and the time the hypervisor ran other guests while this one had work.
    other = max(after_busy - before_busy - cpu - clients - sum(used.values()), 0.0)
    result["machine_other_cpu_s"] = round(other, 2)
    # The broker's CPU and that other CPU per GB: what the machine spent but the clients'.
    result["with_machine_cpu_s_per_gb"] = round((cpu + other) / gb, 2) if gb else None
    result["machine_steal_s"] = round(after_steal - before_steal, 2)
    if before is not None:
        time.sleep(1.2)
        after = system.counters() or {}
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        for name, key in (
            ("puts", "store.puts"),
            ("gets", "store.gets"),
            ("metadata_commits", "metadata.commits"),
            ("metadata_reads", "metadata.reads"),
            ("cache_reads", "reader.cache_reads"),
            ("hedged_puts", "put_hedge.hedged"),
        ):
            result[name] = delta.get(key, 0)
            result[f"{name}_per_gb"] = round(delta.get(key, 0) / gb, 1) if gb else None
            result[f"{name}_per_s"] = round(delta.get(key, 0) / wall, 1)
        # The GETs the reads made (Fetches and their read-ahead), without those of the
        # agent's background work (compaction, cleaning) that store.gets counts too.
        reads = (
            delta.get("reader.gets", 0)
            + sum(
                delta.get(f"read_ahead.{key}", 0) for key in ("objects", "ranges", "streams_opened")
            )
            - delta.get("read_ahead.streamed_ranges", 0)
            # (ranges read from the disk cache: no GET; a fill's GET is one of its ranges)
            - delta.get("read_ahead.disk_reads", 0)
        )
        result["read_gets"] = reads
        result["read_gets_per_gb"] = round(reads / gb, 1) if gb else None
        # Where they came from: the Fetches' own GETs (a Fetch that found its bytes
        # neither cached nor being read ahead) and read-ahead's counters.
        result["read_path"] = {
            key: delta.get(key, 0)
            for key in sorted(delta)
            if key
            in (
                "reader.gets",
                "reader.waits",
                "reader.wait_ms",
                "reader.wait_timeouts",
                "reader.disk_reads",
            )
            or key.startswith(("read_ahead.", "disk_cache."))
        }
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        out[key] = round(statistics.median(values), 2) if values else runs[0][key]
    out["runs"] = runs
    return out


# name, partitions, producers, compression
PRODUCE_MATRIX = [
    ("produce-1p-1x-none", 1, 1, "none"),
    ("produce-1p-1x-zstd", 1, 1, "zstd"),
    ("produce-64p-1x-none", 64, 1, "none"),
    ("produce-64p-3x-none", 64, 3, "none"),
    ("produce-64p-3x-zstd", 64, 3, "zstd"),
]


class _Run:
    """One system's measurements: fresh topic names, and each result kept and logged."""

    def __init__(self, system: System, log: Any) -> None:
        self.system = system
        self.log = log
        self.results: dict[str, Any] = {}
        self._made = 0

    def topic(self, prefix: str, partitions: int) -> str:
        self._made += 1
        name = f"bench-{prefix}-{self._made}"
        create_topic(self.system.bootstrap, name, partitions)
        return name

    def record(self, name: str, result: dict[str, Any]) -> None:
        self.results[name] = result
        shown = {k: v for k, v in result.items() if k != "runs"}
        self.log(f"{self.system.name} {name}: " + json.dumps(shown))

    @contextlib.contextmanager
    def row(self, name: str) -> Iterator[_Row]:
        """A row of the main table: its runs' medians, and its CPU per GB from before its
        first run until the broker is idle after its last (until_idle), recorded."""
        row = _Row(self.system)
        yield row
        result = median_of(row.runs)
        result.update(until_idle(self.system, row.before, row.gb))
        self.record(name, result)


class _Row:
    """The runs of one row, the GB they moved, and the broker's CPU before the first."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.runs: list[dict[str, Any]] = []
        self.gb = 0.0
        self.before = tree_cpu_split(system.root_pid)

    def measure(self, megabytes: float, fn: Any) -> None:
        self.runs.append(measure(self.system, megabytes, fn))
        self.gb += megabytes / 1000


def settle_disk(log: Any) -> None:
    """A sync, then SETTLE_S for what the last system freed to be discarded."""
    began = time.monotonic()
    os.sync()
    log(f"sync took {time.monotonic() - began:.1f} s; settling for {SETTLE_S:g} s")
    time.sleep(SETTLE_S)


def bench_system(
    system: System, runs: int, scale: float, warm_up_records: int, log: Any
) -> dict[str, Any]:
    records = int(150_000 * scale)
    mb = records * RECORD_SIZE / 1e6
    run = _Run(system, log)
    results, topic = run.results, run.topic
    settle_disk(log)
    system.start()
    try:
        # Warm-up, not reported in the tables: a JVM broker compiles its hot paths during
        # its first workloads, so without it the first measured runs of a system are
        # slower than the later ones (Kafka's single-partition produce rose from 61 to
        # 102 MB/s over its three runs). Every system gets the same warm-up.
        if warm_up_records:
            t = topic("warmup", 1)
            warm = producers_perf(system.bootstrap, t, 1, warm_up_records, "none")
            warm["consume_mb_s"] = consumer_perf(system.bootstrap, t, warm_up_records)["mb_s"]
            results["warmup"] = warm
            log(f"{system.name} warm-up: {json.dumps(warm)}")

        # Each row starts with the broker idle and ends when it is idle again: what a row
        # leaves to do (bucketlog's compaction of what it wrote) is counted in its own
        # until-idle figure rather than in the next row's window, as far as a quiet window
        # tells: a level-2 job that waits on purpose may still start in a later row.
        until_idle(system, tree_cpu_split(system.root_pid), 0)

        consume_topics = []
        for name, partitions, producers, compression in PRODUCE_MATRIX:
            with run.row(name) as row:
                for _ in range(runs):
                    t = topic(name, partitions)
                    row.measure(
                        mb,
                        lambda t=t, n=producers, c=compression: producers_perf(
                            system.bootstrap, t, n, records, c
                        ),
                    )
                    if name == "produce-1p-1x-none":
                        consume_topics.append(t)

        half = int(results["produce-1p-1x-none"]["records_s"] / 2)
        with run.row("produce-1p-1x-none-half-load") as row:
            for _ in range(runs):
                t = topic("half", 1)
                n = max(half * 12, 1000)  # about twelve seconds
                warmup = max(half * 2, 100)  # the first two: connecting, JIT, catching up
                row.measure(
                    n * RECORD_SIZE / 1e6,
                    lambda t=t, n=n, w=warmup: producers_perf(
                        system.bootstrap, t, 1, n, "none", half, w
                    ),
                )

        with run.row("consume-1p") as row:
            for t in consume_topics:
                row.measure(mb, lambda t=t: consumer_perf(system.bootstrap, t, records))

        # 500,000 (was 100,000): at 500 MB/s the shorter run was over in a fifth of a
        # second, connecting included, and its figures were the least steady of all.
        py_records = int(500_000 * scale)
        with run.row("python-confluent-kafka") as row:
            for _ in range(runs):
                t = topic("python", 1)
                row.measure(
                    2 * py_records * RECORD_SIZE / 1e6,
                    lambda t=t: python_workload(system.bootstrap, t, py_records),
                )

        rate, seconds = 1000, 10 * min(scale, 1.0) + 2
        with run.row("end-to-end-1000-per-s") as row:
            for _ in range(runs):
                t = topic("e2e", 1)
                row.measure(
                    rate * seconds * RECORD_SIZE / 1e6,
                    lambda t=t: end_to_end(system.bootstrap, t, rate, seconds),
                )

        # bucketlog's own row comes last: the compaction of its 3,000 partitions goes on
        # for a minute after it (measured until the agent is idle again, as every row).
        if isinstance(system, Bucketlog):
            with run.row("produce-1000p-1x-none") as row:
                for _ in range(runs):
                    t = topic("p1000", 1000)
                    row.measure(
                        mb, lambda t=t: producers_perf(system.bootstrap, t, 1, records, "none")
                    )
        results["peak_rss_mb"] = round(tree_peak_rss_mb(system.root_pid), 1)
        results["whole_run"] = whole_run(system)
    finally:
        system.stop()
    return results


IDLE_WINDOW_S = 5.0
IDLE_CPU_S = 0.25  # in a window: 5% of a core (an idle agent uses 1-3%)
IDLE_CAP_S = 240.0


def until_idle(system: System, before_runs: tuple[float, float], gb: float) -> dict[str, Any]:
    """The broker's CPU after the runs until a window of IDLE_WINDOW_S uses at most
    IDLE_CPU_S (or IDLE_CAP_S passed), and its CPU per GB from before the first run
    (`before_runs`, its tree_cpu_split then) until then: the runs, the pauses between
    them and what came after."""
    began = time.monotonic()
    cpu0, workers0 = tree_cpu_split(system.root_pid)
    last = cpu0
    while time.monotonic() - began < IDLE_CAP_S:
        time.sleep(IDLE_WINDOW_S)
        now = tree_cpu_split(system.root_pid)[0]
        if now - last <= IDLE_CPU_S:
            break
        last = now
    cpu1, workers1 = tree_cpu_split(system.root_pid)
    whole = cpu1 - before_runs[0]
    return {
        "after_s": round(time.monotonic() - began, 1),
        "after_cpu_s": round(cpu1 - cpu0, 2),
        "after_workers_cpu_s": round(workers1 - workers0, 2),
        "until_idle_cpu_s": round(whole, 2),
        "until_idle_workers_cpu_s": round(workers1 - before_runs[1], 2),
        "broker_cpu_s_per_gb_until_idle": round(whole / gb, 1) if gb else None,
    }


def whole_run(system: System) -> dict[str, float]:
    """The broker's CPU over its whole life so far, the compaction workers' part of it,
    and (bucketlog) the bytes its agents took in and compaction wrote."""
    total, workers = tree_cpu_split(system.root_pid)
    out = {"broker_cpu_s": round(total, 1), "workers_cpu_s": round(workers, 1)}
    time.sleep(1.2)  # the counters' last write is at most a second old
    counters = system.counters()
    if counters:
        out["produced_gb"] = round(counters.get("pipeline.bytes", 0) / 1e9, 3)
        out["compaction_written_gb"] = round(counters.get("compaction.bytes_written", 0) / 1e9, 3)
    return out


# -- the extra sections: agents pinned to cores, and the S3 store -------------------------

# The workloads of both extra sections: (name, partitions); one producer each, no
# compression. consume-1p reads the produce-1p-1x-none topics.
CORE_WORKLOADS = [("produce-1p-1x-none", 1), ("produce-64p-1x-none", 64)]


def core_workloads(
    system: Bucketlog,
    runs: int,
    scale: float,
    warm_up_records: int,
    log: Any,
    others: dict[str, int] | None = None,
    cold: bool = False,
    after_restart: Any = None,
) -> dict[str, Any]:
    """CORE_WORKLOADS and consume-1p on a started system; with `cold`, consume-1p again
    after the agents restarted (their caches empty: every byte comes from the store).
    `after_restart()` runs once the agents are back (to pin them again)."""
    records = int(150_000 * scale)
    mb = records * RECORD_SIZE / 1e6
    run = _Run(system, log)
    results, topic, record = run.results, run.topic, run.record

    if warm_up_records:
        t = topic("warmup", 1)
        results["warmup"] = producers_perf(system.bootstrap, t, 1, warm_up_records, "none")
        results["warmup"]["consume_mb_s"] = consumer_perf(system.bootstrap, t, warm_up_records)[
            "mb_s"
        ]
    consume_topics = []
    for name, partitions in CORE_WORKLOADS:
        rs = []
        for _ in range(runs):
            t = topic(name, partitions)
            rs.append(
                measure(
                    system,
                    mb,
                    lambda t=t: producers_perf(system.bootstrap, t, 1, records, "none"),
                    others,
                )
            )
            if partitions == 1:
                consume_topics.append(t)
        record(name, median_of(rs))

    def consume() -> dict[str, Any]:
        return median_of(
            [
                measure(system, mb, lambda t=t: consumer_perf(system.bootstrap, t, records), others)
                for t in consume_topics
            ]
        )

    record("consume-1p", consume())
    if cold:
        system.restart()
        if after_restart is not None:
            after_restart()
        record("consume-1p-cold", consume())
    return results


def pinned_layouts(cores: list[int]) -> list[dict[str, Any]]:
    """The clients on the first core, the agents on the others: one agent on the second
    core; two agents on the second and third (both on the second when there are only
    two cores)."""
    client, rest = cores[0], cores[1:]
    return [
        {
            "system": f"bucketlog-{n}",
            "agents": n,
            "client_cpus": [client],
            "agent_cpus": [[rest[i % len(rest)]] for i in range(n)],
        }
        for n in (1, 2)
    ]


def pinned_rows(runs: int, scale: float, warm_up_records: int, log: Any) -> dict[str, Any]:
    """CORE_WORKLOADS and consume-1p with the clients and each agent pinned to cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return {
            "error": f"needs 2 cores to keep clients and agents apart; this process has {cores}"
        }
    out: dict[str, Any] = {"cores": cores, "layouts": {}}
    for layout in pinned_layouts(cores):
        client = set(layout["client_cpus"])
        agent_cpus = [set(c) for c in layout["agent_cpus"]]
        key = (
            f"{layout['system']} on core{'s' if len(set().union(*agent_cpus)) > 1 else ''} "
            + ",".join(str(c) for c in sorted(set().union(*agent_cpus)))
            + f", clients on {layout['client_cpus'][0]}"
        )
        log(f"starting {key}")
        system = Bucketlog(layout["agents"])
        result: dict[str, Any] = {"layout": layout}
        try:
            system.start()
            result["affinity"] = system.pin(agent_cpus)
            log(f"{key}: allowed CPUs {result['affinity']}")
            with clients_on(client):
                result.update(core_workloads(system, runs, scale, warm_up_records, log))
            result["peak_rss_mb"] = round(tree_peak_rss_mb(system.root_pid), 1)
        except Exception as exc:
            log(f"{key} failed: {exc!r}")
            result["error"] = repr(exc)
        finally:
            system.stop()
        out["layouts"][key] = result
    return out


S3_BUCKET = "bench-s3"


def s3_rows(runs: int, scale: float, warm_up_records: int, log: Any) -> dict[str, Any]:
    """CORE_WORKLOADS, consume-1p and a cold consume-1p on one agent, with the local store
    and with the S3 store on moto's server (each with its default flush policy)."""
    out: dict[str, Any] = {}
    for store in ("local", "s3"):
        moto = Moto(S3_BUCKET) if store == "s3" else None
        result: dict[str, Any] = {}
        system: Bucketlog | None = None
        try:
            if moto is None:
                system = Bucketlog(1)
                others = None
            else:
                moto.start()
                assert moto.proc is not None
                system = Bucketlog(
                    1,
                    [
                        "--storage",
                        f"s3://{S3_BUCKET}/run-{uuid.uuid4().hex[:8]}",
                        "--s3-endpoint-url",
                        moto.url,
                    ],
                    env=S3_CREDENTIALS,
                )
                others = {"moto": moto.proc.pid}
            system.name = f"bucketlog-1 {store}"
            log(f"starting {system.name}")
            system.start()
            result.update(
                core_workloads(system, runs, scale, warm_up_records, log, others, cold=True)
            )
            result["peak_rss_mb"] = round(tree_peak_rss_mb(system.root_pid), 1)
            if moto is not None and moto.proc is not None:
                result["moto_peak_rss_mb"] = round(tree_peak_rss_mb(moto.proc.pid), 1)
        except Exception as exc:
            log(f"{store} failed: {exc!r}")
            result["error"] = repr(exc)
        finally:
            if system is not None:
                system.stop()
            if moto is not None:
                moto.stop()
        out[store] = result
    return out


def machine() -> dict[str, Any]:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30).stderr
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": java.splitlines()[0] if java else "?",
        "loadavg_at_start": os.getloadavg(),
        "kafka": "4.3.1 (Maven jars)",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--systems",
        default="kafka,bucketlog-1,bucketlog-2",
        help="systems of the main table ('' or --systems=: none)",
    )
    parser.add_argument(
        "--extras",
        default="pinned,s3",
        help="sections after the main table: pinned (clients and agents on their own"
        " cores), s3 (the local store against the S3 store on moto); '': none",
    )
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies record counts")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--label", default="", help="suffix of the result file names")
    parser.add_argument("--note", default="", help="what else ran on the machine, if known")
    parser.add_argument(
        "--warmup",
        type=int,
        default=300_000,
        help="records produced and consumed once per system before measuring (0: none)",
    )
    args = parser.parse_args()

    started = datetime.datetime.now(datetime.UTC)
    report: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "machine": {**machine(), **({"note": args.note} if args.note else {})},
        "settings": {
            "record_size": RECORD_SIZE,
            "batch_size": BATCH_SIZE,
            "linger_ms": LINGER_MS,
            "acks": "all",
            "records_per_produce_run": int(150_000 * args.scale),
            "runs": args.runs,
            "warmup_records": args.warmup,
            "settle_s": SETTLE_S,
        },
        "systems": {},
    }

    def log(line: str) -> None:
        print(f"[{datetime.datetime.now():%H:%M:%S}] {line}", flush=True)

    for name in [n for n in args.systems.split(",") if n]:
        system: System = Kafka() if name == "kafka" else Bucketlog(int(name.split("-")[1]))
        log(f"starting {name}")
        try:
            report["systems"][name] = bench_system(system, args.runs, args.scale, args.warmup, log)
        except Exception as exc:
            log(f"{name} failed: {exc!r}")
            report["systems"][name] = {"error": repr(exc)}
    extras = [e for e in args.extras.split(",") if e]
    unknown = set(extras) - {"pinned", "s3"}
    if unknown:
        parser.error(f"unknown extras {sorted(unknown)}; known: pinned, s3")
    for extra, rows in (("pinned", pinned_rows), ("s3", s3_rows)):
        if extra in extras:
            log(f"starting the {extra} rows")
            try:
                report[extra] = rows(args.runs, args.scale, args.warmup, log)
            except Exception as exc:
                log(f"the {extra} rows failed: {exc!r}")
                report[extra] = {"error": repr(exc)}
    report["duration_s"] = round((datetime.datetime.now(datetime.UTC) - started).total_seconds())
    report["machine"]["loadavg_at_end"] = os.getloadavg()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = started.strftime("%Y-%m-%d") + (f"-{args.label}" if args.label else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    sys.path.insert(0, str(HERE))
    from report import markdown

    (out / f"{stem}.md").write_text(markdown(report))
    log(f"wrote {out / stem}.md and .json")
    for jars in _JARS:
        shutil.rmtree(jars.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
