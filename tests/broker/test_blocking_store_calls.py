"""An agent on S3 keeps an HTTP connection for each blocking store call it may make at
once beside the async limit: flush uploads, their hedges, compaction jobs, the cleaner."""

from __future__ import annotations

import pytest

from broker.agent import blocking_store_calls
from broker.cli import build_parser, config_from_args
from broker.config import BrokerConfig
from storage.objectstore import open_store
from storage.s3 import BLOCKING_CALLS


def config_of(*argv: str) -> BrokerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_count_follows_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PUT_HEDGE_PERCENTILE", "COMPACTION_MAX_JOBS", "STORAGE"):
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)
    on_s3 = config_of("--storage", "s3://bucket/p")
    assert blocking_store_calls(on_s3) == 8 + 8 + 1 + 1 == BLOCKING_CALLS
    assert blocking_store_calls(config_of()) == 8 + 1 + 1  # local: no hedges by default
    no_hedge = config_of("--storage", "s3://bucket/p", "--put-hedge-percentile", "0")
    assert blocking_store_calls(no_hedge) == 8 + 1 + 1
    more_jobs = config_of("--storage", "s3://bucket/p", "--compaction-max-jobs", "4")
    assert blocking_store_calls(more_jobs) == 8 + 8 + 4 + 1


async def test_the_s3_pool_holds_the_async_limit_and_the_blocking_calls() -> None:
    store = open_store("s3://bucket/p", s3_endpoint_url="http://127.0.0.1:9", blocking_calls=5)
    try:
        assert store._client.meta.config.max_pool_connections == 16 + 5  # type: ignore[attr-defined]
    finally:
        await store.aclose()
