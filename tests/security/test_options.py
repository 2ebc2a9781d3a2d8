"""The authorization options: off by default, each also a BUCKETLOG_* variable, and
refused at start where they would take no effect."""

from __future__ import annotations

import anyio
import pytest

from broker.agent import Agent
from broker.cli import build_parser, config_from_args, main

ENV = (
    "BUCKETLOG_AUTHORIZER",
    "BUCKETLOG_SUPER_USERS",
    "BUCKETLOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
)


def config(*argv: str):
    return config_from_args(build_parser().parse_args(["serve", *argv]))


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_off_by_default_and_no_agent_authorizer(tmp_path):
    cfg = config("--data-dir", str(tmp_path))
    assert (cfg.authorizer, cfg.super_users, cfg.allow_everyone_if_no_acl_found) == (
        False,
        frozenset(),
        False,
    )
    agent = Agent.open(cfg)
    assert agent.authorizer is None
    anyio.run(agent.aclose)


def test_options_and_their_environment_variables(monkeypatch, tmp_path):
    cfg = config("--authorizer", "--super-users", "User:admin;User:ops")
    assert cfg.authorizer and cfg.super_users == {"User:admin", "User:ops"}
    assert not cfg.allow_everyone_if_no_acl_found
    monkeypatch.setenv("BUCKETLOG_AUTHORIZER", "true")
    monkeypatch.setenv("BUCKETLOG_SUPER_USERS", "User:root")
    monkeypatch.setenv("BUCKETLOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "1")
    cfg = config("--data-dir", str(tmp_path))
    assert cfg.authorizer and cfg.allow_everyone_if_no_acl_found
    assert cfg.super_users == {"User:root"}
    agent = Agent.open(cfg)
    authorizer = agent.authorizer
    assert authorizer is not None and authorizer.super_users == {"User:root"}
    assert authorizer.allow_everyone_if_no_acl_found
    anyio.run(agent.aclose)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--super-users", "User:admin"], "take effect only with --authorizer"),
        (["--allow-everyone-if-no-acl-found"], "take effect only with --authorizer"),
        (["--authorizer", "--super-users", "admin"], "not a principal of the form"),
    ],
)
def test_options_without_effect_are_refused_at_start(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--data-dir", str(tmp_path), *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
