"""The listener and security options: Kafka's forms, refused with a clear message when
wrong, each agent's ports and advertised ports moved by its index."""

from __future__ import annotations

import pytest

from broker import cli
from broker.config import BrokerConfig
from broker.listeners import Listener, SecurityProtocol, format_listeners, parse_listeners


def config(*argv: str, env: dict[str, str] | None = None, monkeypatch=None) -> BrokerConfig:
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    args = cli.build_parser().parse_args(["serve", *argv])
    return cli.config_from_args(args)


def test_listeners_in_kafkas_form():
    listeners = parse_listeners("PLAINTEXT://127.0.0.1:9092, sasl_ssl://[::1]:9094,SSL://:9093")
    assert listeners == (
        Listener(SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),
        Listener(SecurityProtocol.SASL_SSL, "::1", 9094),
        Listener(SecurityProtocol.SSL, "", 9093),
    )
    assert format_listeners(listeners) == (
        "PLAINTEXT://127.0.0.1:9092,SASL_SSL://[::1]:9094,SSL://:9093"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("CLIENT://127.0.0.1:9092", "custom listener names"),
        ("PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093", "more than once"),
        ("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092", "more than one listener"),
        ("PLAINTEXT://127.0.0.1", "no port"),
        ("127.0.0.1:9092", "NAME://HOST:PORT"),
    ],
)
def test_bad_listeners_are_refused(text, why):
    with pytest.raises(ValueError, match=why):
        parse_listeners(text)


def test_host_and_port_stay_one_plaintext_listener():
    cfg = config("--host", "127.0.0.1", "--port", "9500", "--advertised-host", "kafka-1")
    assert format_listeners(cfg.bound_listeners) == "PLAINTEXT://127.0.0.1:9500"
    assert format_listeners(cfg.advertised_endpoints) == "PLAINTEXT://kafka-1:9500"


def test_each_agent_serves_every_listener_on_ports_moved_by_its_index(monkeypatch):
    cfg = config(
        "--listeners",
        "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9192",
        "--advertised-listeners",
        "SASL_SSL://broker.example:19192",
        env={"BUCKETLOG_SSL_CERTFILE": "/certs/server.pem"},
        monkeypatch=monkeypatch,
    )
    assert (cfg.host, cfg.port) == ("127.0.0.1", 9092)
    second = cfg.with_port(9093)
    assert format_listeners(second.bound_listeners) == (
        "PLAINTEXT://127.0.0.1:9093,SASL_SSL://0.0.0.0:9193"
    )
    assert format_listeners(second.advertised_endpoints) == (
        "PLAINTEXT://127.0.0.1:9093,SASL_SSL://broker.example:19193"
    )
    assert (second.advertised, second.advertised_port) == ("127.0.0.1", 9093)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--listeners", "SSL://127.0.0.1:9093"], "needs --ssl-certfile"),
        (
            ["--listeners", "SSL://127.0.0.1:9093", "--ssl-certfile", "c.pem",
             "--ssl-client-auth", "required"],
            "needs --ssl-cafile",
        ),
        (["--ssl-client-auth", "sometimes"], "must be one of"),
        (["--sasl-enabled-mechanisms", "GSSAPI"], "not supported"),
        (["--sasl-enabled-mechanisms", "PLAIN,SCRAM-SHA-256"], "needs --sasl-plain-users"),
        (
            ["--listeners", "PLAINTEXT://127.0.0.1:9092",
             "--advertised-listeners", "SSL://h:9093"],
            "names no listener",
        ),
        (["--listeners", "PLAINTEXT://:9092"], "give an advertised host"),
    ],
)  # fmt: skip
def test_inconsistent_security_options_are_refused(argv, why):
    with pytest.raises(ValueError, match=why):
        config(*argv)


def test_a_bad_option_stops_the_command_with_its_reason(capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["serve", "--data-dir", str(tmp_path), "--listeners", "CLIENT://h:1"])
    assert stopped.value.code == 2
    assert "custom listener names" in capsys.readouterr().err
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(SystemExit):
        cli.main(
            ["serve", "--data-dir", str(tmp_path), "--listeners", "SSL://127.0.0.1:1",
             "--ssl-certfile", str(missing)]
        )  # fmt: skip
    assert "cannot load the TLS certificate" in capsys.readouterr().err
