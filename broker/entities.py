"""Build kio response entities of any version from plain dicts.

Handlers describe a response once, as nested dicts and lists, with the fields of the newest
version they know; `build(cls, data)` keeps the fields that `cls` (one API version) has,
drops the rest, converts milliseconds to the timedeltas kio wants and builds nested
entities from their type hints. A field the version requires but the dict lacks is an
error in the handler, reported loudly.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

_TIMEDELTA_TYPES = {"timedelta_i32", "timedelta_i64"}


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kafka_type: str | None
    nested: type | None  # entity class of a nested entity or of a tuple's items
    is_tuple: bool
    optional: bool


def _nested_type(hint: Any) -> tuple[type | None, bool]:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item, *_rest) = typing.get_args(hint)
        inner, _ = _nested_type(item)
        return inner, True
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _nested_type(arg)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint, False
    return None, False


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    hints = typing.get_type_hints(cls)
    plans = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nested, is_tuple = _nested_type(hint)
        optional = type(None) in typing.get_args(hint)
        plans.append(_FieldPlan(f.name, f.metadata.get("kafka_type"), nested, is_tuple, optional))
    return tuple(plans)


def build(cls: type, data: Mapping[str, Any], *, strict: bool = False) -> Any:
    """The entity `cls` from `data`; with strict, a key `cls` has no field for is an error
    (tests use it to catch misspelt fields) instead of being dropped."""
    if strict:
        extra = set(data) - {p.name for p in _plan(cls)}
        if extra:
            raise TypeError(f"{cls.__qualname__} v{cls.__version__} has no fields {sorted(extra)}")  # type: ignore[attr-defined]
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):
        if plan.name not in data:
            continue
        value = data[plan.name]
        if value is None:
            kwargs[plan.name] = None
        elif plan.kafka_type in _TIMEDELTA_TYPES and not isinstance(value, datetime.timedelta):
            kwargs[plan.name] = datetime.timedelta(milliseconds=value)
        elif plan.nested is not None and plan.is_tuple:
            kwargs[plan.name] = tuple(
                v if not isinstance(v, Mapping) else build(plan.nested, v, strict=strict)
                for v in value
            )
        elif plan.nested is not None and isinstance(value, Mapping):
            kwargs[plan.name] = build(plan.nested, value, strict=strict)
        elif plan.is_tuple:
            kwargs[plan.name] = tuple(value)
        elif plan.kafka_type == "datetime_i64" and isinstance(value, int):
            kwargs[plan.name] = (
                None
                if value < 0 and plan.optional
                else datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
            )
        elif plan.kafka_type == "error_code" and not isinstance(value, ErrorCode):
            kwargs[plan.name] = ErrorCode(value)
        elif plan.kafka_type == "uuid" and isinstance(value, bytes):
            kwargs[plan.name] = uuid.UUID(bytes=value)
        else:
            kwargs[plan.name] = value
    return cls(**kwargs)


def has_field(cls: type, name: str) -> bool:
    return any(p.name == name for p in _plan(cls))


def ms(value: datetime.timedelta | int | None) -> int:
    """Milliseconds from a kio timedelta field (or a plain int)."""
    if value is None:
        return 0
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)
