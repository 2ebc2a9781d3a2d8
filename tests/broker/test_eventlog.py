"""The rate limit of expected connection events, with a clock the test moves."""

from __future__ import annotations

import logging

import pytest

from broker.eventlog import CLIENT_DISCONNECT, MALFORMED_REQUEST, EventLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_per_window_then_a_count_of_what_was_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    events = EventLog(logging.getLogger("t"), burst=3, window_seconds=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        logged = [events.record(MALFORMED_REQUEST, "bad %d", i) for i in range(7)]
        assert logged == [True, True, True, False, False, False, False]
        # Another kind has a window of its own.
        assert events.record(CLIENT_DISCONNECT, "gone")
        clock.now += 10
        assert events.record(MALFORMED_REQUEST, "bad again")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "bad 0"),
        (logging.WARNING, "bad 1"),
        (logging.WARNING, "bad 2"),
        (logging.INFO, "gone"),
        (logging.WARNING, "4 more lines like the next were left out in 10 s"),
        (logging.WARNING, "bad again"),
    ]
    assert events.counts[MALFORMED_REQUEST] == 8
    assert events.counts[CLIENT_DISCONNECT] == 1


def test_a_window_with_nothing_left_out_writes_no_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    events = EventLog(logging.getLogger("t"), burst=3, window_seconds=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        events.record(MALFORMED_REQUEST, "one")
        clock.now += 60
        events.record(MALFORMED_REQUEST, "two")
    assert [r.getMessage() for r in caplog.records] == ["one", "two"]
