"""The ports test brokers are given (tests.support.brokerproc.free_ports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import brokerproc


def test_test_brokers_ports_are_below_the_ephemeral_range_one_slice_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    seen = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(brokerproc, "_next", None)
        ports = [p for _ in range(50) for p in brokerproc.free_ports(3)]
        assert len(set(ports)) == len(ports)  # none handed out twice
        assert all(p in brokerproc.PORT_RANGE and p < low for p in ports)
        seen[worker] = set(ports)
    assert not seen["gw0"] & seen["gw1"]
