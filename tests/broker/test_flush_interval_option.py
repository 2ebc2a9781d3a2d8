"""`serve --flush-interval-ms N`: 250 ms on S3; on a local folder 10 ms for the ingest
pipeline (where a flush also goes when no upload is in flight) and 2 ms for the
lightning topics' journal; a value given is what both pipelines use."""

from __future__ import annotations

import anyio
import pytest

from broker.agent import Agent
from broker.cli import build_parser, config_from_args
from broker.config import BrokerConfig


def config_of(*argv: str) -> BrokerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_by_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUCKETLOG_FLUSH_INTERVAL_MS", raising=False)
    local = config_of()
    assert (local.ingest_flush_interval_ms, local.resolved_flush_interval_ms) == (10, 2)
    s3 = config_of("--storage", "s3://bucket/p")
    assert (s3.ingest_flush_interval_ms, s3.resolved_flush_interval_ms) == (250, 250)
    given = config_of("--flush-interval-ms", "7")
    assert (given.ingest_flush_interval_ms, given.resolved_flush_interval_ms) == (7, 7)
    monkeypatch.setenv("BUCKETLOG_FLUSH_INTERVAL_MS", "9")
    assert config_of().ingest_flush_interval_ms == 9


def test_the_agents_pipelines_take_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path / "a")))
    try:
        assert agent.pipeline._interval == 0.010 and agent.pipeline._flush_when_idle
        assert agent.journal._interval == 0.002
    finally:
        anyio.run(agent.aclose)
    given = Agent.open(BrokerConfig(data_dir=str(tmp_path / "b"), flush_interval_ms=7))
    try:
        assert given.pipeline._interval == given.journal._interval == 0.007
    finally:
        anyio.run(given.aclose)
