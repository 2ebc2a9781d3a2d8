"""The supervisor deregisters an agent it sees die (broker.registry), and only such a one.

Real child processes under `supervise` with --on-agent-exit stop, so that it returns by
itself; a real SQLite metadata store that the test reads.
"""

from __future__ import annotations

import logging
import sys

import anyio

from broker.registry import AgentRegistry
from broker.supervisor import OnAgentExit, supervise
from metadata import cluster, keys
from metadata.kv import open_kv

NOW_MS = 1_700_000_000_000
FAR = NOW_MS + 3_600_000
DIES, STOPPED = 47001, 47002  # ports: only names here, nothing listens
COMMANDS = {
    DIES: [sys.executable, "-c", "raise SystemExit(3)"],
    STOPPED: [sys.executable, "-c", "import time; time.sleep(30)"],
}


def registered(url: str, ports: list[int]) -> None:
    kv = open_kv(url)
    sub = keys.cluster_subspace("default")
    for port in ports:
        kv.transact_sync(
            lambda tr, port=port: cluster.register_agent(tr, sub, "127.0.0.1", port, None, FAR)
        )
    anyio.run(kv.aclose)


def live_ports(url: str) -> list[int]:
    kv = open_kv(url)
    sub = keys.cluster_subspace("default")
    try:
        return [a.port for a in kv.transact_sync(lambda tr: cluster.live_agents(tr, sub, NOW_MS))]
    finally:
        anyio.run(kv.aclose)


def test_an_agent_that_dies_is_deregistered_and_one_that_is_stopped_is_not(tmp_path):
    url = f"sqlite://{tmp_path}/metadata.db"
    registered(url, [DIES, STOPPED])
    registry = AgentRegistry(url, "default", {p: ("127.0.0.1", p) for p in COMMANDS})
    try:
        status = supervise(COMMANDS, on_exit=OnAgentExit.STOP, grace_s=5, on_death=registry.forget)
    finally:
        registry.close()
    assert status == 1
    # The one stopped by the supervisor deregisters itself (a real agent does).
    assert live_ports(url) == [STOPPED]


def test_a_store_that_cannot_be_reached_leaves_it_to_the_lease(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    registry = AgentRegistry("nosuch://store", "default", {p: ("127.0.0.1", p) for p in COMMANDS})
    try:
        status = supervise(COMMANDS, on_exit=OnAgentExit.STOP, grace_s=5, on_death=registry.forget)
    finally:
        registry.close()
    assert status == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"could not report the exit of the agent on port {DIES}" in w for w in warnings)
    assert not any(r.exc_info for r in caplog.records)
