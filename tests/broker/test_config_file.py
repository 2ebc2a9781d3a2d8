"""`bucketlog serve --config FILE`: a TOML file of options under the environment and
the command line; a bad value names the option and its source, without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import config_from_args, parse_serve_args
from broker.config import BrokerConfig
from tests.support.brokerproc import free_ports


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONFIG", "FLUSH_INTERVAL_MS", "DEFAULT_PARTITIONS", "RIPCORD", "RACK", "ZONE"):
        monkeypatch.delenv(f"BUCKETLOG_{name}", raising=False)


def config_of(*argv: str) -> BrokerConfig:
    _parser, args = parse_serve_args(["serve", *argv])
    return config_from_args(args)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bucketlog.toml"
    path.write_text(text)
    return str(path)


def test_the_file_sets_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'flush-interval-ms = 40\ndefault_partitions = 3\nripcord = true\nrack = "eu-1a"\n'
        'inject-put-latency-ms = "5,15"\nauto-create-topics = false\n',
    )
    config = config_of("--config", path)
    assert config.flush_interval_ms == 40
    assert config.default_partitions == 3
    assert config.ripcord is True
    assert config.zone == "eu-1a"
    assert config.inject_put_latency_ms == (5.0, 15.0)
    assert config.auto_create_topics is False


def test_flags_win_over_the_environment_which_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "flush-interval-ms = 40\ndefault-partitions = 3\n")
    monkeypatch.setenv("BUCKETLOG_FLUSH_INTERVAL_MS", "60")
    config = config_of("--config", path)
    assert (config.flush_interval_ms, config.default_partitions) == (60, 3)
    config = config_of("--config", path, "--flush-interval-ms", "80", "--default-partitions", "5")
    assert (config.flush_interval_ms, config.default_partitions) == (80, 5)
    monkeypatch.setenv("BUCKETLOG_CONFIG", path)  # the file named by the environment
    monkeypatch.delenv("BUCKETLOG_FLUSH_INTERVAL_MS")
    assert config_of().flush_interval_ms == 40


def _serve(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """Start `bucketlog serve` expecting it to refuse its configuration; its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--port", str(free_ports(1)[0]), *argv],
        capture_output=True, text=True, timeout=20, env={**_clean_env(), **(env or {})},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("BUCKETLOG_")}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('flush-interval-ms = "soon"\n', ["flush-interval-ms", "invalid value 'soon'"]),
        ("flush-interval-ms = 1.5\n", ["flush-interval-ms", "invalid value 1.5"]),
        ("no-such-option = 1\n", ["no-such-option", "not an option"]),
        ("flush-interval-ms = \n", ["not valid TOML"]),
    ],
)
def test_a_bad_file_names_the_option_and_the_file(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    path = write(tmp_path, text)
    stderr = _serve(["--config", path], tmp_path)
    assert path in stderr
    for word in words:
        assert word in stderr


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    stderr = _serve(["--config", str(tmp_path / "nowhere.toml")], tmp_path)
    assert "nowhere.toml: cannot read it" in stderr


def test_a_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    stderr = _serve([], tmp_path, {"BUCKETLOG_FLUSH_INTERVAL_MS": "soon"})
    assert "environment BUCKETLOG_FLUSH_INTERVAL_MS: flush-interval-ms: invalid value" in stderr


def test_the_zone_is_set_by_zone_or_by_its_older_name_rack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config_of().zone is None
    assert config_of("--zone", "us-east-1a").zone == "us-east-1a"
    assert config_of("--rack", "us-east-1b").zone == "us-east-1b"
    assert config_of("--zone", "b", "--rack", "b").zone == "b"
    assert config_of("--zone", "").zone is None
    assert config_of("--config", write(tmp_path, 'zone = "eu-1c"\n')).zone == "eu-1c"
    monkeypatch.setenv("BUCKETLOG_ZONE", "eu-1a")
    assert config_of().zone == "eu-1a"


def test_zone_and_rack_with_different_values_are_refused(tmp_path: Path) -> None:
    stderr = _serve(["--zone", "a", "--rack", "b"], tmp_path)
    assert "--zone 'a' and --rack 'b' differ" in stderr
    stderr = _serve(["--rack", "b"], tmp_path, {"BUCKETLOG_ZONE": "a"})
    assert "--zone 'a' and --rack 'b' differ" in stderr
