"""Fault points: named places where a test makes the agent fail on purpose. Test-only.

`BUCKETLOG_FAULT_POINTS` lists point names, comma-separated; `name@n` arms a point for
the n-th time this process reaches it (plain `name`: the first time). Nothing else arms
a point (no option, no config), and it is never set in production. Unset, a point costs
one dict lookup. Two kinds:

- `point(name)`: the process sends itself SIGKILL there (no clean-up, no flush, nothing
  deregistered), as kill -9 would. Used by the tests of steps that must survive a crash
  anywhere (the object lifecycle). In the agent's compaction process
  (broker.compactor) a point kills the agent first, as kill -9 of the agent does: the
  process dies with it.
- `misbehave(name)`: True when armed; the caller then does the wrong thing the point is
  named after, once, logged as a warning. Used to show that a checker catches a broken
  promise: `ingest.ack_without_commit` answers one produced batch (of a producer
  without idempotence) with success and an offset but never commits it
  (integration/chaos).
"""

from __future__ import annotations

import os
import signal

ENV = "BUCKETLOG_FAULT_POINTS"


def parse(value: str) -> dict[str, int]:
    """Point name -> the time it fires (1 = the first time it is reached)."""
    armed: dict[str, int] = {}
    for item in value.split(","):
        name, at, nth = item.strip().partition("@")
        if not name:
            continue
        if at and not (nth.isdigit() and int(nth) > 0):
            raise ValueError(f"{ENV}: {item.strip()!r}: expected name or name@n with n >= 1")
        armed[name] = int(nth) if at else 1
    return armed


_armed = parse(os.environ.get(ENV, ""))
_reached: dict[str, int] = {}
_agent_pid: int | None = None  # set in a process of the agent's that dies with it


def kill_agent_too(agent_pid: int) -> None:
    """In a process of the agent's: a point reached here kills the agent too."""
    global _agent_pid
    _agent_pid = agent_pid


def _fires(name: str) -> bool:
    nth = _armed.get(name)
    if nth is None:
        return False
    count = _reached[name] = _reached.get(name, 0) + 1
    return count == nth


def point(name: str) -> None:
    if _fires(name):
        if _agent_pid is not None:
            os.kill(_agent_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def misbehave(name: str) -> bool:
    return _fires(name)
