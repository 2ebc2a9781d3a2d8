"""Keep N agent processes running on one host (`bucketlog serve --agents N`).

Rules:
- Each agent is a child process on its own port. Whichever agent exits, the others keep
  serving; the supervisor waits for any of them, not for each in turn.
- An agent that exits while the supervisor is not stopping is logged in one line (port,
  pid, exit status or signal) and then, by `OnAgentExit`: RESTART starts it again on its
  port after a back-off; STOP stops every agent and exits, for containers whose
  orchestrator restarts the whole host.
- A clean exit (status 0) is restarted too. The supervisor's promise is N agents on N
  ports, and one agent is not a service an operator could start again by itself: SIGTERM
  to one agent's pid is how to restart just that agent (like deleting a pod under
  restartPolicy: Always); stopping agents for good is stopping the supervisor.
- An agent that exits while the supervisor is not stopping is reported to `on_death`
  (its port) before its restart is scheduled: `broker.registry` deregisters it there, so
  the other agents stop naming it at once instead of when its lease runs out. A failure
  there is logged; the lease still runs out.
- Back-off: 0.5 s before the first restart, doubling with each exit up to 30 s, back to
  0.5 s once the agent had stayed up 60 s. An agent that dies at once is started 7 times
  in its first minute, then twice a minute: it cannot keep a core busy.
- An agent gets SIGTERM when the supervisor dies, however it dies (Linux's
  PR_SET_PDEATHSIG): a supervisor killed with SIGKILL leaves no agent behind.
- SIGTERM or SIGINT to the supervisor: pending restarts are dropped, every agent gets
  SIGTERM and up to the grace (default 10 s) to exit, then SIGKILL. Exit status 0 means
  it was told to stop and every agent stopped cleanly within the grace; 1 otherwise.
  Dying of SIGTERM or SIGINT counts as clean, as systemd counts it: an agent receives
  both from before it serves until it has deregistered, so it only dies of one while it
  is still starting or once its clean-up is over.

The decisions are pure functions (`restart_delay`, `exit_status`); `supervise` is the
shell around them: one loop that sleeps in select() on a pipe that SIGCHLD, SIGTERM and
SIGINT write to (signal.set_wakeup_fd), with the earliest pending restart as timeout.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import FrameType, TracebackType

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_STOP_GRACE_S = 10.0


class OnAgentExit(StrEnum):
    RESTART = "restart"
    STOP = "stop"


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5
    cap_s: float = 30.0
    reset_after_s: float = 60.0  # an agent up this long starts over at first_s


BACKOFF = Backoff()


def restart_delay(
    on_exit: OnAgentExit,
    uptime_s: float,
    previous_delay_s: float | None,
    backoff: Backoff = BACKOFF,
) -> float | None:
    """Seconds to wait before starting again an agent that exited after `uptime_s`, or
    None to stop every agent. `previous_delay_s` is the delay before its current run
    (None if it never restarted)."""
    if on_exit is OnAgentExit.STOP:
        return None
    if previous_delay_s is None or uptime_s >= backoff.reset_after_s:
        return backoff.first_s
    return min(previous_delay_s * 2, backoff.cap_s)


def stopped_cleanly(returncode: int) -> bool:
    return returncode == 0 or -returncode in STOP_SIGNALS


def exit_status(told_to_stop: bool, agent_returncodes: Iterable[int]) -> int:
    """The supervisor's exit status: 0 for a clean stop, 1 otherwise."""
    return 0 if told_to_stop and all(map(stopped_cleanly, agent_returncodes)) else 1


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class _Agent:
    port: int
    argv: Sequence[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    delay_s: float | None = None  # the back-off before the current run
    restart_at: float | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, preexec_fn=_die_with_parent(os.getpid()))
        self.started_at = time.monotonic()
        self.restart_at = None
        logger.info("agent on port %d started (pid %d)", self.port, self.proc.pid)

    def ended(self) -> subprocess.Popen[bytes] | None:
        """The process of the current run if it has just ended (each end is seen once)."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return None
        self.proc = None
        return proc

    def where(self, pid: int) -> str:
        return f"agent on port {self.port} (pid {pid})"


class _Wakeups:
    """SIGCHLD, SIGTERM and SIGINT as bytes on a pipe, so that one select() waits for any
    of them and for a timeout, and none is lost between a check and the wait."""

    SIGNALS = (signal.SIGCHLD, *STOP_SIGNALS)

    def __enter__(self) -> _Wakeups:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        # The wakeup fd only hears signals that have a Python handler.
        self.previous = {s: signal.signal(s, _ignore) for s in self.SIGNALS}
        return self

    def wait(self, timeout_s: float | None) -> set[int]:
        """The signals received, after waiting up to `timeout_s` for one."""
        ready, _, _ = select.select([self.read_fd], [], [], timeout_s)
        if not ready:
            return set()
        try:
            return set(os.read(self.read_fd, 1024))
        except BlockingIOError:
            return set()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self.previous_fd)
        os.close(self.read_fd)
        os.close(self.write_fd)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    pass


def supervise(
    commands: Mapping[int, Sequence[str]],
    on_exit: OnAgentExit = OnAgentExit.RESTART,
    grace_s: float = DEFAULT_STOP_GRACE_S,
    backoff: Backoff = BACKOFF,
    on_death: Callable[[int], None] | None = None,
) -> int:
    """Run one agent process per port (`commands`: port -> argv) until told to stop or,
    with OnAgentExit.STOP, until one exits; return the exit status. `on_death(port)` is
    called when an agent exits unbidden, before its restart is scheduled."""
    agents = [_Agent(port, argv) for port, argv in commands.items()]
    with _Wakeups() as wakeups:
        try:
            told_to_stop = _serve(agents, on_exit, backoff, wakeups, on_death)
        finally:
            returncodes = _stop(agents, grace_s, wakeups)
    return exit_status(told_to_stop, returncodes)


def _serve(
    agents: list[_Agent],
    on_exit: OnAgentExit,
    backoff: Backoff,
    wakeups: _Wakeups,
    on_death: Callable[[int], None] | None,
) -> bool:
    """Keep the agents running; True once told to stop, False when an agent's exit stops all."""
    for agent in agents:
        agent.start()
    while True:
        now = time.monotonic()
        for agent in agents:
            if agent.restart_at is not None and agent.restart_at <= now:
                agent.start()
        due = [agent.restart_at for agent in agents if agent.restart_at is not None]
        received = wakeups.wait(max(0.0, min(due) - now) if due else None)
        stop_signal = next((s for s in STOP_SIGNALS if s in received), None)
        if stop_signal is not None:
            logger.info("received %s, stopping every agent", signal.Signals(stop_signal).name)
            return True
        now = time.monotonic()
        for agent in agents:
            proc = agent.ended()
            if proc is None:
                continue
            uptime_s = now - agent.started_at
            delay_s = restart_delay(on_exit, uptime_s, agent.delay_s, backoff)
            what = (
                f"{agent.where(proc.pid)} {describe_exit(proc.returncode)} after {uptime_s:.1f} s"
            )
            if delay_s is None:
                logger.error("%s; stopping every agent (--on-agent-exit %s)", what, on_exit)
            else:
                logger.warning("%s; restarting it in %.1f s", what, delay_s)
            if on_death is not None:
                _report_death(on_death, agent.port)
            if delay_s is None:
                return False
            agent.delay_s = delay_s
            agent.restart_at = now + delay_s


def _report_death(on_death: Callable[[int], None], port: int) -> None:
    try:
        on_death(port)
    except Exception as exc:  # the store may be down: the agent's lease runs out anyway
        logger.warning("could not report the exit of the agent on port %d: %s", port, exc)


def _stop(agents: list[_Agent], grace_s: float, wakeups: _Wakeups) -> list[int]:
    """SIGTERM to every agent, SIGKILL to those still running after `grace_s`; the return
    codes of all but those already seen to exit (which were waiting for their restart)."""
    procs = [(agent, agent.proc) for agent in agents if agent.proc is not None]
    for _agent, proc in procs:
        proc.send_signal(signal.SIGTERM)  # nothing if it has exited already
    deadline = time.monotonic() + grace_s
    while any(proc.poll() is None for _agent, proc in procs):
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            break
        wakeups.wait(left_s)  # woken by SIGCHLD; another SIGTERM changes nothing
    for agent, proc in procs:
        if proc.poll() is None:
            logger.error(
                "%s did not stop within %.1f s of SIGTERM; sending SIGKILL",
                agent.where(proc.pid),
                grace_s,
            )
            proc.kill()
            proc.wait()
        elif not stopped_cleanly(proc.returncode):
            logger.warning(
                "%s %s while stopping", agent.where(proc.pid), describe_exit(proc.returncode)
            )
    return [proc.returncode for _agent, proc in procs]


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """For the child, before it runs the agent: SIGTERM when the parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arrange() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange
