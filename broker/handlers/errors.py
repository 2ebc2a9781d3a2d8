"""The answer to a request whose handler failed unexpectedly: UNKNOWN_SERVER_ERROR.

Built from the response schema: a top-level error code where the API has one, every
other required field at its zero value. APIs without a top-level error code get None
and the connection is closed instead, which every client handles by reconnecting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from broker.entities import build, has_field
from broker.handlers import response_class

_ZERO: dict[str | None, Any] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": -1,
    "string": "",
    "bool": False,
    "timedelta_i32": 0,
    "bytes": b"",
}


def error_response(request: Any, code: ErrorCode = ErrorCode.unknown_server_error) -> Any | None:
    cls = response_class(request)
    if not has_field(cls, "error_code"):
        return None
    data: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kafka_type = f.metadata.get("kafka_type")
        if f.name == "error_code":
            data[f.name] = code
        elif kafka_type in _ZERO:
            data[f.name] = _ZERO[kafka_type]
        else:
            data[f.name] = ()
    data["error_code"] = code
    return build(cls, data)
