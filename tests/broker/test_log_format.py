"""`--log-format`: text, logfmt or json lines; one line per event, a traceback inside it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from broker import logformat
from broker.eventlog import EventLog
from tests.support.brokerproc import free_ports


@pytest.fixture
def lines(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    saved = logging.getLogger().handlers[:], logging.getLogger().level

    def configured(form: str) -> list[str]:
        logformat.configure("INFO", form)
        log = logging.getLogger("broker.test")
        log.info('a "quoted" value and a\\nsecond line')
        EventLog(log).record("client_disconnect", "connection from %s went away", "1.2.3.4:5")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
        return capsys.readouterr().err.splitlines()

    yield configured
    logging.getLogger().handlers[:], level = saved
    logging.getLogger().setLevel(level)


def test_json_lines(lines) -> None:  # type: ignore[no-untyped-def]
    out = [json.loads(line) for line in lines("json")]
    assert len(out) == 3  # one line each, the traceback inside its line
    assert out[0]["msg"] == 'a "quoted" value and a\\nsecond line'
    assert out[0]["level"] == "info" and out[0]["logger"] == "broker.test"
    assert out[1]["event"] == "client_disconnect" and "1.2.3.4:5" in out[1]["msg"]
    assert out[2]["level"] == "error" and "ValueError: boom" in out[2]["exc"]


def test_logfmt_lines(lines) -> None:  # type: ignore[no-untyped-def]
    out = lines("logfmt")
    assert len(out) == 3
    assert out[0].split(" ", 1)[0].startswith("time=")
    assert 'level=info logger=broker.test msg="a \\"quoted\\" value' in out[0]
    assert "event=client_disconnect" in out[1]
    assert "exc=" in out[2] and "ValueError: boom" in out[2]


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path),
         "--port", str(free_ports(1)[0]), "--log-format", "xml"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--log-format: expected text, logfmt, json, got 'xml'" in result.stderr
