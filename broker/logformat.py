"""The agent's log lines: `--log-format text` (default: time, level, logger, message),
`logfmt` (key=value pairs) or `json` (one object per line). One line per event; a
traceback, where one is logged, is a field of that line (`exc`), not lines of its own.
Events counted by broker.eventlog carry their kind as `event`."""

from __future__ import annotations

import json
import logging
import time

FORMATS = ("text", "logfmt", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    event = getattr(record, "event", None)
    if event is not None:
        fields["event"] = event
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in _fields(record).items())


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\t'):
        return text
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    )
    return f'"{escaped}"'


# As configured last (the agent's processes of its own log the same way).
configured: tuple[str, str] = ("INFO", "text")


def configure(level: str, form: str) -> None:
    """The root logger's one handler, on stderr, in this format."""
    global configured
    configured = (level, form)
    handler = logging.StreamHandler()
    if form == "json":
        handler.setFormatter(JsonFormatter())
    elif form == "logfmt":
        handler.setFormatter(LogfmtFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
