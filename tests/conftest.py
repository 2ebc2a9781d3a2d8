"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.brokerproc import BrokerProcess, free_ports


@pytest.fixture
def start_broker(tmp_path) -> Iterator[Callable[..., BrokerProcess]]:
    """A factory: start_broker(agents=1, extra_args=[...], data_dir=None) -> running broker."""
    started: list[BrokerProcess] = []

    def start(
        agents: int = 1, extra_args: list[str] | None = None, data_dir=None, env=None, port=None
    ) -> BrokerProcess:
        ports = [port] if port else free_ports(agents)
        broker = BrokerProcess(
            data_dir=data_dir or (tmp_path / "data"),
            port=ports[0],
            agents=agents,
            extra_args=list(extra_args or []),
            env=dict(env or {}),
        )
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(start_broker) -> BrokerProcess:
    """One running agent on the embedded default stores."""
    return start_broker()
