"""The supervisor's decisions, without processes: restart or stop, the back-off, the exit
status; and the options that choose them."""

from __future__ import annotations

import pytest

from broker.cli import build_parser
from broker.supervisor import (
    Backoff,
    OnAgentExit,
    describe_exit,
    exit_status,
    restart_delay,
    stopped_cleanly,
)

RESTART, STOP = OnAgentExit.RESTART, OnAgentExit.STOP
BACKOFF = Backoff(first_s=0.5, cap_s=30.0, reset_after_s=60.0)


@pytest.mark.parametrize(
    ("on_exit", "uptime_s", "previous_delay_s", "delay_s"),
    [
        (RESTART, 0.1, None, 0.5),  # the first restart
        (RESTART, 500.0, None, 0.5),
        (RESTART, 0.1, 0.5, 1.0),  # died again soon: doubled
        (RESTART, 59.9, 8.0, 16.0),
        (RESTART, 0.1, 16.0, 30.0),  # up to the cap
        (RESTART, 0.1, 30.0, 30.0),
        (RESTART, 60.0, 30.0, 0.5),  # stayed up long enough: starts over
        (STOP, 0.1, None, None),
        (STOP, 500.0, 4.0, None),
    ],
)
def test_restart_delay(on_exit, uptime_s, previous_delay_s, delay_s):
    assert restart_delay(on_exit, uptime_s, previous_delay_s, BACKOFF) == delay_s


def test_an_agent_that_dies_at_once_is_started_at_most_twice_a_minute_in_the_end():
    delays, previous = [], None
    for _ in range(12):
        previous = restart_delay(RESTART, 0.0, previous, BACKOFF)
        delays.append(previous)
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30]


@pytest.mark.parametrize(
    ("told_to_stop", "returncodes", "status"),
    [
        (True, [0, 0, 0], 0),
        (True, [], 0),  # every agent had already exited, waiting for its restart
        (True, [0, -15, -2], 0),  # died of SIGTERM or SIGINT: still starting, or cleaned up
        (True, [0, -9, 0], 1),  # one needed SIGKILL after the grace
        (True, [0, 1], 1),
        (True, [-11], 1),
        (False, [0, 0], 1),  # an agent's exit stopped them all (--on-agent-exit stop)
    ],
)
def test_exit_status(told_to_stop, returncodes, status):
    assert exit_status(told_to_stop, returncodes) == status


@pytest.mark.parametrize(
    ("returncode", "clean"),
    [(0, True), (-15, True), (-2, True), (-9, False), (1, False), (-11, False)],
)
def test_stopped_cleanly(returncode, clean):
    assert stopped_cleanly(returncode) is clean


@pytest.mark.parametrize(
    ("returncode", "text"),
    [
        (0, "exited with status 0"),
        (3, "exited with status 3"),
        (-9, "was killed by SIGKILL"),
        (-15, "was killed by SIGTERM"),
        (-200, "was killed by signal 200"),
    ],
)
def test_describe_exit(returncode, text):
    assert describe_exit(returncode) == text


def test_options_default_to_restart_and_a_10_s_grace(monkeypatch):
    monkeypatch.delenv("BUCKETLOG_ON_AGENT_EXIT", raising=False)
    monkeypatch.delenv("BUCKETLOG_AGENT_STOP_GRACE_MS", raising=False)
    args = build_parser().parse_args(["serve"])
    assert args.on_agent_exit is RESTART
    assert args.agent_stop_grace_ms == 10_000


def test_options_from_the_command_line_and_the_environment(monkeypatch):
    monkeypatch.setenv("BUCKETLOG_ON_AGENT_EXIT", "stop")
    monkeypatch.setenv("BUCKETLOG_AGENT_STOP_GRACE_MS", "2500")
    args = build_parser().parse_args(["serve"])
    assert (args.on_agent_exit, args.agent_stop_grace_ms) == (STOP, 2500)
    args = build_parser().parse_args(["serve", "--on-agent-exit", "restart"])
    assert args.on_agent_exit is RESTART  # the command line wins


def test_on_agent_exit_rejects_other_values(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--on-agent-exit", "ignore"])
    assert "expected restart or stop, got 'ignore'" in capsys.readouterr().err
