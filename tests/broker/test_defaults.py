"""A default is written where each layer declares its fields (the command line's options,
BrokerConfig, compaction's settings, the metadata layer's job limits): the layers agree."""

from __future__ import annotations

import pytest

from broker.cli import (
    SERVE_FLAGS,
    SERVE_OPTIONS,
    config_from_args,
    env_name,
    parse_serve_args,
)
from broker.compaction import CompactionSettings
from broker.compactor import compaction_settings
from broker.config import BrokerConfig
from metadata.compaction import Limits


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, *_ in SERVE_OPTIONS + SERVE_FLAGS:
        monkeypatch.delenv(env_name(name), raising=False)
    monkeypatch.delenv(env_name("config"), raising=False)


def test_the_command_line_without_options_is_the_configs_defaults() -> None:
    _parser, args = parse_serve_args(["serve"])
    assert config_from_args(args) == BrokerConfig()


def test_compaction_takes_the_configs_defaults_as_its_own() -> None:
    # The one default that differs on purpose: the agent runs jobs in worker processes,
    # a Compaction built without a config (in tests) in threads.
    config = BrokerConfig(compaction_workers="thread")
    assert compaction_settings(config) == CompactionSettings()
    assert CompactionSettings().limits == Limits()
