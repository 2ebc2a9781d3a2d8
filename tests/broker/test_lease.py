"""The agent lease: its options, the combinations refused at start, and the renewals of a
real agent (SQLite metadata, in this process)."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import time

import anyio
import anyio.to_thread
import pytest

from broker.agent import Agent
from broker.cli import build_parser, config_from_args
from broker.config import BrokerConfig
from metadata import cluster
from tests.support.brokerproc import free_ports


def config_of(*argv: str) -> BrokerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_fail_over_within_three_seconds(monkeypatch):
    monkeypatch.delenv("BUCKETLOG_LEASE_MS", raising=False)
    monkeypatch.delenv("BUCKETLOG_LEASE_RENEW_MS", raising=False)
    config = config_of()
    assert (config.lease_ms, config.lease_renew_ms) == (2_500, 500)


def test_options_from_the_command_line_and_the_environment(monkeypatch):
    monkeypatch.setenv("BUCKETLOG_LEASE_MS", "6000")
    monkeypatch.setenv("BUCKETLOG_LEASE_RENEW_MS", "1500")
    assert (config_of().lease_ms, config_of().lease_renew_ms) == (6_000, 1_500)
    config = config_of("--lease-renew-ms", "1000")  # the command line wins
    assert (config.lease_ms, config.lease_renew_ms) == (6_000, 1_000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--lease-ms", "2000", "--lease-renew-ms", "2000"],
            "--lease-renew-ms (2000) must be shorter than --lease-ms (2000)",
        ),
        (["--lease-ms", "400"], "--lease-renew-ms (500) must be shorter than --lease-ms (400)"),
        (["--lease-renew-ms", "0"], "expected a positive number, got '0'"),
    ],
)
def test_a_renewal_not_shorter_than_the_lease_is_refused_at_start(tmp_path, argv, message):
    # `serve --agents 2` too: the supervisor refuses before it starts any agent.
    serve = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d")]
    port = str(free_ports(2)[0])
    result = subprocess.run(
        [*serve, "--port", port, "--agents", "2", *argv], capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()


async def lease_expiry(agent: Agent) -> int:
    def read(tr):  # type: ignore[no-untyped-def]
        (expires,) = [a.lease_expires_ms for a in cluster.live_agents(tr, agent.sub, 0)]
        return expires

    return await agent.kv.read(read)


def test_the_lease_is_renewed_every_lease_renew_ms(tmp_path):
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path), lease_ms=2_000, lease_renew_ms=100))
    seen: set[int] = set()

    async def run() -> None:
        await agent.register()
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.lease_loop)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                seen.add(await lease_expiry(agent))
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        await agent.aclose()

    anyio.run(run)
    # Ten renewals in a second, give or take a slow one; each a whole lease from its time.
    assert 8 <= len(seen) - 1 <= 11, sorted(seen)
    steps = [b - a for a, b in zip(sorted(seen), sorted(seen)[1:], strict=False)]
    assert all(50 <= step <= 400 for step in steps), steps


def test_an_agent_says_so_when_its_lease_ran_out_before_a_renewal(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path), lease_ms=300, lease_renew_ms=100))

    async def run() -> None:
        await agent.register()
        await agent.renew_lease()  # in time: nothing to say
        assert not caplog.records
        await anyio.sleep(0.5)  # as if renewals had stalled
        await agent.renew_lease()
        await agent.aclose()

    anyio.run(run)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "the other agents saw this one gone" in record.getMessage()


def hold_write_lock(db: str, seconds: float) -> None:
    """Keep the SQLite store's write lock for `seconds`, as a busy writer elsewhere would."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        conn.rollback()
    finally:
        conn.close()


def test_a_renewal_slower_than_the_interval_neither_stops_the_renewals_nor_drops_the_agent(
    tmp_path, caplog
):
    caplog.set_level(logging.WARNING)
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path), lease_ms=1_500, lease_renew_ms=100))
    expiries: list[int] = []

    async def run() -> None:
        await agent.register()
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.lease_loop)
            await anyio.sleep(0.3)
            # A renewal waits 0.6 s for the lock: six intervals, well within the lease.
            await anyio.to_thread.run_sync(hold_write_lock, str(tmp_path / "metadata.db"), 0.6)
            stalled_until = int(time.time() * 1000)
            await anyio.sleep(0.3)
            expiries.append(await lease_expiry(agent))
            tg.cancel_scope.cancel()
        await agent.aclose()
        expiries.append(stalled_until)

    anyio.run(run)
    renewed, stalled_until = expiries
    assert renewed > stalled_until + 1_500 - 300  # renewed again right after the stall
    assert caplog.records == []  # neither dropped out nor failed
