"""Valid kio entities of any API and version, built from the schema, and the places in
their encoding where a length prefix lies.

`sample(cls, rng)` fills every field with a random value its kio type allows (nulls
included where the type is `X | None`). `length_sites(entity)` names every array, string
and bytes field reachable through non-tagged fields (through the first item of arrays)
and rebuilds the entity with another value there; `prefix_of` finds that field's length
prefix in a frame by encoding an empty and a one-item value and comparing the two.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)

SIZED = ("string", "bytes", "records")


def payload_classes(kind: str) -> list[type]:
    """Every request (kind "request") or response class kio knows, of every version."""
    load = load_request_schema if kind == "request" else load_response_schema
    out = []
    for api_key, name in sorted(api_key_map.items()):
        for version in sorted(schema_name_map[name]):
            try:
                out.append(load(api_key, version))
            except KioIndexError:
                continue
    return out


def nullable(field: Any) -> bool:
    return get_origin(field.type) is UnionType and NoneType in get_args(field.type)


def primitive(kafka_type: str, rng: random.Random, can_be_null: bool) -> Any:
    if can_be_null and kafka_type in (*SIZED, "uuid", "datetime_i64") and rng.random() < 0.3:
        return None
    match kafka_type:
        case "int8":
            return rng.randint(-(2**7), 2**7 - 1)
        case "int16":
            return rng.randint(-(2**15), 2**15 - 1)
        case "int32":
            return rng.randint(-(2**31), 2**31 - 1)
        case "int64":
            return rng.randint(-(2**63), 2**63 - 1)
        case "uint8" | "uint16" | "uint32" | "uint64":
            return rng.randint(0, 2 ** int(kafka_type[4:]) - 1)
        case "float64":
            return rng.uniform(-1e9, 1e9)
        case "bool":
            return rng.random() < 0.5
        case "uuid":
            return uuid.UUID(int=rng.getrandbits(128) | 1)  # the zero uuid reads as None
        case "error_code":
            return rng.choice(list(ErrorCode))
        case "timedelta_i32":
            return datetime.timedelta(milliseconds=rng.randint(-(2**31), 2**31 - 1))
        case "timedelta_i64":
            return datetime.timedelta(milliseconds=rng.randint(-(2**40), 2**40))
        case "datetime_i64":
            return datetime.datetime.fromtimestamp(rng.randint(0, 2**41) / 1000, tz=datetime.UTC)
        case "string":
            return rng.choice(["", "t", "orders", "ünïcode-名前", "x" * rng.randint(0, 300)])
        case "bytes" | "records":
            return rng.randbytes(rng.choice([0, 1, 7, 200]))
    raise AssertionError(f"no sample for kafka_type {kafka_type!r}")


def sample(cls: type, rng: random.Random) -> Any:
    """A random valid `cls`: arrays of 0-2 items, nulls where the type allows them."""
    values: dict[str, Any] = {}
    for field in fields(cls):
        kind = classify_field(field)
        can_be_null = nullable(field)
        if isinstance(kind, PrimitiveField):
            values[field.name] = primitive(get_schema_field_type(field), rng, can_be_null)
        elif can_be_null and rng.random() < 0.3:
            values[field.name] = None
        elif isinstance(kind, EntityField):
            values[field.name] = sample(kind.type_, rng)
        elif isinstance(kind, EntityTupleField):
            values[field.name] = tuple(sample(kind.type_, rng) for _ in range(rng.randint(0, 2)))
        else:
            kafka_type = get_schema_field_type(field)
            values[field.name] = tuple(
                primitive(kafka_type, rng, False) for _ in range(rng.randint(0, 3))
            )
    return cls(**values)


@dataclass(frozen=True)
class Site:
    """A length-prefixed field of an entity: `where` is Owner.field, `rebuild(value)` the
    whole entity with that field set to value."""

    where: str
    kind: str  # "array", "string" or "bytes"
    flexible: bool
    nullable: bool
    one: Any  # a one-item (or one-byte) value for the field
    rebuild: Callable[[Any], Any]

    @property
    def empty(self) -> Any:
        return {"array": (), "string": "", "bytes": b""}[self.kind]

    @property
    def legacy_prefix(self) -> int:
        return {"array": 4, "string": 2, "bytes": 4}[self.kind]


def length_sites(
    entity: Any, rng: random.Random, rebuild: Callable[[Any], Any] = lambda e: e
) -> Iterator[Site]:
    cls = type(entity)
    for field in fields(cls):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        value = getattr(entity, field.name)

        def with_value(new: Any, field: Any = field, entity: Any = entity) -> Any:
            return rebuild(replace(entity, **{field.name: new}))

        where = f"{cls.__name__}.{field.name}"
        site = dict(where=where, flexible=cls.__flexible__, nullable=nullable(field))
        if isinstance(kind, PrimitiveField):
            kafka_type = get_schema_field_type(field)
            if kafka_type == "string":
                yield Site(kind="string", one="a", rebuild=with_value, **site)
            elif kafka_type in SIZED:
                yield Site(kind="bytes", one=b"a", rebuild=with_value, **site)
        elif isinstance(kind, PrimitiveTupleField):
            one = (primitive(get_schema_field_type(field), rng, False),)
            yield Site(kind="array", one=one, rebuild=with_value, **site)
        elif isinstance(kind, EntityTupleField):
            yield Site(kind="array", one=(sample(kind.type_, rng),), rebuild=with_value, **site)
            if value:

                def with_first(new: Any, value: Any = value, with_value: Any = with_value) -> Any:
                    return with_value((new, *value[1:]))

                yield from length_sites(value[0], rng, with_first)
        elif isinstance(kind, EntityField) and value is not None:
            yield from length_sites(value, rng, with_value)


def prefix_of(site: Site, encode: Callable[[Any], bytes]) -> tuple[bytes, int, bytes]:
    """The frame with the field empty, cut around the field's length prefix:
    (bytes before it, the prefix's size, bytes after it)."""
    empty = encode(site.rebuild(site.empty))
    one = encode(site.rebuild(site.one))
    differ = next(i for i, (a, b) in enumerate(zip(empty, one, strict=False)) if a != b)
    # Empty and one-item values differ first in the last byte of the length prefix.
    width = 1 if site.flexible else site.legacy_prefix
    start = differ - (width - 1)
    return empty[:start], width, empty[start + width :]
