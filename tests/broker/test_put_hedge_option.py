"""`serve --put-hedge-percentile P`: on by default on S3 (95), off on the local store,
0 turns it off, out-of-range values are refused; both pipelines share the agent's one."""

from __future__ import annotations

import anyio
import pytest

from broker.agent import Agent
from broker.cli import build_parser, config_from_args
from broker.config import BrokerConfig


def config_of(*argv: str) -> BrokerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_by_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUCKETLOG_PUT_HEDGE_PERCENTILE", raising=False)
    assert config_of().resolved_put_hedge_percentile is None
    assert config_of("--storage", "s3://bucket/p").resolved_put_hedge_percentile == 95.0
    s3_off = config_of("--storage", "s3://bucket/p", "--put-hedge-percentile", "0")
    assert s3_off.resolved_put_hedge_percentile is None
    assert config_of("--put-hedge-percentile", "99").resolved_put_hedge_percentile == 99.0
    monkeypatch.setenv("BUCKETLOG_PUT_HEDGE_PERCENTILE", "90")
    assert config_of().resolved_put_hedge_percentile == 90.0


@pytest.mark.parametrize("value", [-1.0, 100.0, 150.0])
def test_out_of_range_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="--put-hedge-percentile"):
        BrokerConfig(put_hedge_percentile=value)


def test_both_pipelines_hedge_with_the_agents_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path), put_hedge_percentile=95))
    try:
        assert agent.hedge is not None
        assert agent.pipeline._hedge is agent.hedge
        assert agent.journal._hedge is agent.hedge
    finally:
        anyio.run(agent.aclose)
    plain = Agent.open(BrokerConfig(data_dir=str(tmp_path / "b")))
    try:
        assert plain.hedge is None and plain.pipeline._hedge is None
    finally:
        anyio.run(plain.aclose)
