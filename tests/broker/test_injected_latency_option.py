"""`serve --inject-put-latency-ms MEDIAN,P99` / `--inject-get-latency-ms` (benchmarks and
tests only): parsed and checked at start, and the agent's object store is wrapped in
storage.injected only when one is given."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from broker.agent import Agent
from broker.cli import build_parser, config_from_args
from broker.config import BrokerConfig
from storage.injected import InjectedLatencyStore
from storage.local import LocalObjectStore
from tests.support.brokerproc import free_ports


def config_of(*argv: str) -> BrokerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_options_give_median_and_p99(monkeypatch, tmp_path):
    monkeypatch.delenv("BUCKETLOG_INJECT_PUT_LATENCY_MS", raising=False)
    monkeypatch.delenv("BUCKETLOG_INJECT_GET_LATENCY_MS", raising=False)
    assert config_of().inject_put_latency_ms is None
    config = config_of("--inject-put-latency-ms", "5,15", "--inject-get-latency-ms", "2.5,8")
    assert config.inject_put_latency_ms == (5.0, 15.0)
    assert config.inject_get_latency_ms == (2.5, 8.0)
    monkeypatch.setenv("BUCKETLOG_INJECT_PUT_LATENCY_MS", "40,200")
    assert config_of().inject_put_latency_ms == (40.0, 200.0)


def _open(tmp_path, config: BrokerConfig):  # type: ignore[no-untyped-def]
    agent = Agent.open(config)
    store = agent.store
    anyio.run(agent.aclose)
    return store


def test_the_store_is_wrapped_only_when_asked(tmp_path):
    plain = _open(tmp_path, BrokerConfig(data_dir=str(tmp_path / "a")))
    assert isinstance(plain, LocalObjectStore)  # no wrapper at all
    wrapped = _open(
        tmp_path, BrokerConfig(data_dir=str(tmp_path / "b"), inject_put_latency_ms=(5.0, 15.0))
    )
    assert isinstance(wrapped, InjectedLatencyStore)
    assert isinstance(wrapped.inner, LocalObjectStore)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("5", "expected MEDIAN,P99 in milliseconds"),
        ("15,5", "need 0 <= median <= p99"),
        ("a,b", "expected two numbers MEDIAN,P99"),
    ],
)
def test_a_malformed_value_is_refused_at_start(tmp_path, value, message):
    port = str(free_ports(1)[0])
    result = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"),
            "--port", port, "--inject-put-latency-ms", value,
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )  # fmt: skip
    assert result.returncode == 2
    assert "argument --inject-put-latency-ms" in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
