"""What every chaos scenario needs: agents to run and kill, and a report to write.

Agents, one of three ways (`add_agent_arguments`, `open_agents`):

- `--restart harness` (default): N agent processes of one broker on consecutive ports,
  sharing one data dir (the embedded stores, or those the test session chose), each
  started as `bucketlog serve --agents 1` would be by the supervisor; the harness kills
  one with SIGKILL and starts it again on its port at once. Kills are as fast as an agent
  starts (about 0.7 s here).
- `--restart supervisor`: `bucketlog serve --agents N`; the supervisor (broker/supervisor.py)
  restarts a killed agent, after its back-off: 0.5 s, doubling for each exit within a
  minute of the last start, up to 30 s. Kills many times a minute soon meet that back-off.
- `--bootstrap HOST:PORT[,...]`: an agent set the harness did not start; `--kill-command`
  (run by the shell) kills one of them, and their own supervisor restarts it. Without
  it, nothing is killed.

An agent is killed only while it is up (its port accepts connections); the time from its
SIGKILL until it listens again is noted for each kill. Agents listen on ports below the
kernel's ephemeral range: while an agent is down, a client's outgoing connection could
otherwise take its port and keep it from listening again.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.brokerproc import (  # noqa: E402
    BrokerProcess,
    free_ports,
    listening,
    pid_alive,
    port_free,
)


def machine() -> dict[str, Any]:
    """The machine a report was measured on."""
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory_gb = round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1)
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gb": memory_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }


def write_report(path: str | Path, report: dict[str, Any]) -> Path:
    """Write a scenario's report as JSON (its folder created if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=1, default=str)
    # Lists of plain values on one line each, so that 1,000 kills are 1,000 lines. JSON
    # strings hold no raw newline: each item of such a list ends at ",\n".
    text = re.sub(
        r"\[\n([^\[\]{}]*?)\n\s*\]",
        lambda m: "[" + ", ".join(item.strip() for item in m[1].split(",\n")) + "]",
        text,
    )
    path.write_text(text + "\n")
    return path


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def agent_ports(count: int) -> list[int]:
    """`count` consecutive free ports below the ephemeral range (if it leaves room)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_ports(count)
    rng = random.Random()
    for _ in range(200):
        if low - count <= 20_000:
            break
        base = rng.randrange(20_000, low - count)
        ports = list(range(base, base + count))
        if all(port_free(port) for port in ports):
            return ports
    return free_ports(count)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "max": round(ordered[-1], 3)}


@dataclass
class Kill:
    at_s: float  # seconds since the agents started
    agent: str  # port, or what the kill command printed
    pid: int | None
    down_s: float | None = None  # SIGKILL until it listened again (None: not seen)

    def as_row(self) -> list[Any]:
        """[at_s, agent, pid, down_s]"""
        down_s = None if self.down_s is None else round(self.down_s, 3)
        return [round(self.at_s, 3), self.agent, self.pid, down_s]


class Agents:
    """A set of agents that can be killed one at a time."""

    bootstrap: str = ""
    restart: str = ""
    can_kill = True

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.kills: list[Kill] = []
        self.notes: list[str] = []  # agent starts and kill commands that failed

    def start(self) -> Agents:
        return self

    def kill_one(self, rng: random.Random) -> Kill | None:
        """SIGKILL to a random agent that is up; None if none is up now."""
        raise NotImplementedError

    def kill_port(self, port: int) -> Kill | None:
        """SIGKILL to the agent listening on `port` if it is up; None if it is not (or
        agents cannot be told apart: an external set)."""
        return None

    def all_up(self) -> bool:
        return True

    def wait_all_up(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.all_up():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        pass

    def logs(self) -> list[Path]:
        return []

    def log_errors(self) -> dict[str, int]:
        """Lines logged at ERROR and tracebacks, over every agent log."""
        errors = tracebacks = 0
        for path in self.logs():
            with contextlib.suppress(OSError), open(path, errors="replace") as log:
                for line in log:
                    errors += " ERROR " in line
                    tracebacks += line.startswith("Traceback")
        return {"error_lines": errors, "tracebacks": tracebacks}

    def describe(self) -> dict[str, Any]:
        return {"restart": self.restart, "bootstrap": self.bootstrap}

    def _since_start(self) -> float:
        return time.monotonic() - self.began


RESTART_ATTEMPTS = 3


class HarnessRestarted(Agents):
    """N agents of one broker, each its own `bucketlog serve --agents 1`, on consecutive
    ports sharing a data dir; a killed one is started again at once."""

    restart = "harness"

    def __init__(
        self, count: int, work_dir: Path, extra_args: list[str], env: dict[str, str]
    ) -> None:
        super().__init__()
        data_dir = work_dir / "data"
        self.brokers = [
            BrokerProcess(data_dir=data_dir, port=port, extra_args=extra_args, env=env)
            for port in agent_ports(count)
        ]
        self.bootstrap = ",".join(b.bootstrap for b in self.brokers)
        self._up = {b.port: False for b in self.brokers}
        self._lock = threading.Lock()
        self._restarts: list[threading.Thread] = []
        self._stopping = False

    def start(self) -> HarnessRestarted:
        for broker in self.brokers:
            broker.start()
            self._up[broker.port] = True
        self.began = time.monotonic()
        return self

    def all_up(self) -> bool:
        with self._lock:
            return all(self._up.values())

    def kill_one(self, rng: random.Random) -> Kill | None:
        with self._lock:
            up = [b for b in self.brokers if self._up[b.port]]
            if not up:
                return None
            broker = rng.choice(up)
            self._up[broker.port] = False
        return self._kill(broker)

    def kill_port(self, port: int) -> Kill | None:
        with self._lock:
            chosen = [b for b in self.brokers if b.port == port and self._up[b.port]]
            if not chosen:
                return None
            broker = chosen[0]
            self._up[broker.port] = False
        return self._kill(broker)

    def _kill(self, broker: BrokerProcess) -> Kill:
        """SIGKILL to an agent marked down by the caller; it is started again at once."""
        assert broker.proc is not None
        pid = broker.proc.pid
        broker.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        broker.proc.wait()
        kill = Kill(killed_at - self.began, str(broker.port), pid)
        self.kills.append(kill)
        thread = threading.Thread(
            target=self._start_again, args=(broker, kill, killed_at), daemon=True
        )
        self._restarts.append(thread)
        thread.start()
        return kill

    def _start_again(self, broker: BrokerProcess, kill: Kill, killed_at: float) -> None:
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            if self._stopping:
                return
            try:
                broker.start()
                break
            except Exception as exc:  # noted in the report; tried again
                self.notes.append(f"agent on port {broker.port}: {exc}")
                if attempt == RESTART_ATTEMPTS:
                    return  # it stays down: the run fails
                time.sleep(1.0)
        kill.down_s = time.monotonic() - killed_at
        with self._lock:
            self._up[broker.port] = True

    def stop(self) -> None:
        self._stopping = True
        for thread in self._restarts:
            thread.join(timeout=60)
        for broker in self.brokers:
            broker.stop()

    def logs(self) -> list[Path]:
        return [b.log_path for b in self.brokers if b.log_path is not None]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "agents": len(self.brokers)}


class SupervisorRestarted(Agents):
    """`bucketlog serve --agents N`: the supervisor restarts a killed agent."""

    restart = "supervisor"

    def __init__(
        self, count: int, work_dir: Path, extra_args: list[str], env: dict[str, str]
    ) -> None:
        super().__init__()
        self.broker = BrokerProcess(
            data_dir=work_dir / "data",
            port=agent_ports(count)[0],
            agents=count,
            extra_args=extra_args,
            env=env,
        )
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.broker.ports)
        self._down: dict[int, int] = {}  # port -> pid killed, until its successor listens
        self._lock = threading.Lock()
        self._watchers: list[threading.Thread] = []
        self._stopping = False

    def start(self) -> SupervisorRestarted:
        self.broker.start()
        self.began = time.monotonic()
        return self

    def _pids_up(self) -> dict[int, int]:
        with self._lock:
            down = set(self._down)
        return {
            port: pid
            for port, pid in self.broker.agent_pids().items()
            if port not in down and listening(port)
        }

    def all_up(self) -> bool:
        with self._lock:
            if self._down:
                return False
        return len(self._pids_up()) == self.broker.agents

    def kill_one(self, rng: random.Random) -> Kill | None:
        up = self._pids_up()
        if not up:
            return None
        port = rng.choice(sorted(up))
        return self._kill(port, up[port])

    def kill_port(self, port: int) -> Kill | None:
        pid = self._pids_up().get(port)
        return None if pid is None else self._kill(port, pid)

    def _kill(self, port: int, pid: int) -> Kill | None:
        with self._lock:
            self._down[port] = pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it died on its own since: not our kill
            with self._lock:
                del self._down[port]
            return None
        killed_at = time.monotonic()
        kill = Kill(killed_at - self.began, str(port), pid)
        self.kills.append(kill)
        watcher = threading.Thread(
            target=self._watch_restart, args=(port, pid, kill, killed_at), daemon=True
        )
        self._watchers.append(watcher)
        watcher.start()
        return kill

    def _watch_restart(self, port: int, old_pid: int, kill: Kill, killed_at: float) -> None:
        while not self._stopping:
            pid = self.broker.agent_pids().get(port)
            if pid is not None and pid != old_pid and pid_alive(pid) and listening(port):
                kill.down_s = time.monotonic() - killed_at
                with self._lock:
                    del self._down[port]
                return
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopping = True
        for watcher in self._watchers:
            watcher.join(timeout=5)
        self.broker.stop()

    def logs(self) -> list[Path]:
        return [self.broker.log_path] if self.broker.log_path else []

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "agents": self.broker.agents}


class External(Agents):
    """Agents the harness did not start; `kill_command`, if any, kills one of them."""

    restart = "external"

    def __init__(self, bootstrap: str, kill_command: str | None) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.kill_command = kill_command
        self.can_kill = bool(kill_command)

    def kill_one(self, rng: random.Random) -> Kill | None:
        if not self.kill_command:
            return None
        done = subprocess.run(
            self.kill_command, shell=True, capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            self.notes.append(
                f"kill command exited with {done.returncode}: {done.stderr.strip()[:200]}"
            )
            return None
        kill = Kill(self._since_start(), done.stdout.strip()[:100] or "?", None)
        self.kills.append(kill)
        return kill

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kill_command": self.kill_command}


def add_agent_arguments(parser: argparse.ArgumentParser, agents: int = 3) -> None:
    group = parser.add_argument_group("agents")
    group.add_argument("--agents", type=int, default=agents, help="agent processes to start")
    group.add_argument(
        "--restart",
        choices=("harness", "supervisor"),
        default="harness",
        help="who starts a killed agent again: the harness at once, or bucketlog's "
        "supervisor after its back-off",
    )
    group.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        help="an argument for every agent started (repeat)",
    )
    group.add_argument(
        "--bootstrap", help="use these agents instead of starting some (HOST:PORT[,...])"
    )
    group.add_argument(
        "--kill-command",
        help="with --bootstrap: a shell command that kills one agent (SIGKILL)",
    )
    group.add_argument(
        "--work-dir", help="where started agents keep their stores and logs (default: a temp dir)"
    )
    group.add_argument(
        "--keep-work-dir", action="store_true", help="keep the temp dir (logs, stores) after"
    )


@contextlib.contextmanager
def open_agents(args: argparse.Namespace, env: dict[str, str] | None = None) -> Iterator[Agents]:
    """The agents `add_agent_arguments` describes, started; stopped (and the temp dir
    removed unless kept) on leaving."""
    if args.bootstrap:
        agents: Agents = External(args.bootstrap, args.kill_command)
        try:
            yield agents.start()
        finally:
            agents.stop()
        return
    temp = args.work_dir is None
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="bucketlog-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    kind = HarnessRestarted if args.restart == "harness" else SupervisorRestarted
    agents = kind(args.agents, work_dir, list(args.agent_arg), dict(env or {}))
    try:
        yield agents.start()
    finally:
        agents.stop()
        if temp and not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
