"""Fault points: named places where a test can have the agent killed, as kill -9 would.

`BUCKETLOG_FAULT_POINTS` lists point names, comma-separated; the first time a listed
point is reached the process sends itself SIGKILL (no clean-up, no flush, nothing
deregistered). Unset, a point costs one set lookup. Used by the tests of steps that must
survive a crash anywhere (the object lifecycle); never set in production.
"""

from __future__ import annotations

import os
import signal

ENV = "BUCKETLOG_FAULT_POINTS"
_armed = frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())


def point(name: str) -> None:
    if name in _armed:
        os.kill(os.getpid(), signal.SIGKILL)
