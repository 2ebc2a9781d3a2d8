"""Writers of kio entities, compiled once per entity class: kio's bytes, with less Python.

kio's own writer (``kio.serial.entity_writer``) calls a function per field, packs every
integer with its own ``struct.pack``, builds each compact length through a checked
integer type and opens a ``BytesIO`` for the tagged fields of every flexible entity,
even when none is set. Encoding the answers was the largest single part of the event
loop's Python at low rates (a Produce and a Fetch answer for each record batch a
tailing consumer sees).

Rules:
- The bytes are kio's, byte for byte: which writer each field takes is kio's own choice
  (``get_field_writer``, the same classification of fields, tags and their defaults);
  only how the bytes are made differs. tests/protocol/test_writers.py compares the two
  on random entities of every request and response class kio has.
- Fields of a fixed width that follow each other (integers, error codes, booleans,
  durations, times, UUIDs) are read with one ``attrgetter`` and packed with one
  ``struct``; everything else (strings, bytes, records, arrays, nested entities) is
  written by a function of its own. Values are written as kio writes them: a bytes or
  records value (a ``protocol.codec.Gathered`` too) is handed to ``write`` as it is.
- A flexible entity with no tagged field set writes its empty tag section as one byte.
- A value that does not fit its field fails here (``struct.error``, ``OverflowError``)
  where kio's writer would fail too; the codec reports either as LocalProtocolError.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, fields
from functools import cache
from operator import attrgetter
from typing import Any

from kio.serial import writers as kio_writers
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_writer

Writer = Callable[[Any, Any], None]  # (buffer with write(), value)

_ZERO_UUID = bytes(16)
_SHORT_VARINTS = [bytes((n,)) for n in range(128)]


def _uvarint(n: int) -> bytes:
    """An unsigned varint (Kafka's, as protobuf's)."""
    if n < 128:
        return _SHORT_VARINTS[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _epoch_ms(value: datetime.datetime) -> int:
    return round(value.timestamp() * 1000)


def _nullable_epoch_ms(value: datetime.datetime | None) -> int:
    return -1 if value is None else round(value.timestamp() * 1000)


def _uuid_bytes(value: uuid.UUID | None) -> bytes:
    return _ZERO_UUID if value is None else value.bytes


# kio's fixed-width writers: the struct code of each and how a value becomes packable
# (None: as it is; an ErrorCode is an int, a bool packs as "?").
_FIXED: dict[Any, tuple[str, Callable[[Any], Any] | None]] = {
    kio_writers.write_boolean: ("?", None),
    kio_writers.write_int8: ("b", None),
    kio_writers.write_int16: ("h", None),
    kio_writers.write_int32: ("i", None),
    kio_writers.write_int64: ("q", None),
    kio_writers.write_uint8: ("B", None),
    kio_writers.write_uint16: ("H", None),
    kio_writers.write_uint32: ("I", None),
    kio_writers.write_uint64: ("Q", None),
    kio_writers.write_float64: ("d", None),
    kio_writers.write_error_code: ("h", None),
    kio_writers.write_timedelta_i32: ("i", _ms),
    kio_writers.write_timedelta_i64: ("q", _ms),
    kio_writers.write_datetime_i64: ("q", _epoch_ms),
    kio_writers.write_nullable_datetime_i64: ("q", _nullable_epoch_ms),
    kio_writers.write_uuid: ("16s", _uuid_bytes),
}


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _compact_length(n: int) -> bytes:
    return _uvarint(n + 1)  # 0 is null


def _sized(length: Callable[[int], bytes], null: bytes, nullable: bool) -> Writer:
    """A string or bytes value after its length (a str is written as UTF-8)."""

    def write(buffer: Any, value: Any) -> None:
        if value is None:
            if not nullable:
                raise TypeError("Unexpectedly received None value")
            buffer.write(null)
            return
        if isinstance(value, str):
            value = value.encode()
        buffer.write(length(len(value)))
        buffer.write(value)

    return write


_VARIABLE: dict[Any, Writer] = {
    kio_writers.write_compact_string: _sized(_compact_length, b"\x00", False),
    kio_writers.write_nullable_compact_string: _sized(_compact_length, b"\x00", True),
    kio_writers.write_legacy_string: _sized(_I16.pack, b"\xff\xff", False),
    kio_writers.write_nullable_legacy_string: _sized(_I16.pack, b"\xff\xff", True),
    kio_writers.write_legacy_bytes: _sized(_I32.pack, b"\xff\xff\xff\xff", False),
    kio_writers.write_nullable_legacy_bytes: _sized(_I32.pack, b"\xff\xff\xff\xff", True),
}


def _value_writer(kio_writer: Any) -> Writer:
    """Ours for one of kio's primitive writers."""
    found = _VARIABLE.get(kio_writer)
    if found is not None:
        return found
    code, convert = _FIXED[kio_writer]
    packer = struct.Struct(">" + code)
    pack = packer.pack
    if convert is None:
        return lambda buffer, value: buffer.write(pack(value))
    return lambda buffer, value: buffer.write(pack(convert(value)))


def _array(item: Writer, flexible: bool) -> Writer:
    if flexible:

        def write_compact(buffer: Any, items: Sequence[Any] | None) -> None:
            if items is None:
                buffer.write(b"\x00")
                return
            buffer.write(_uvarint(len(items) + 1))
            for value in items:
                item(buffer, value)

        return write_compact

    def write_legacy(buffer: Any, items: Sequence[Any] | None) -> None:
        if items is None:
            buffer.write(b"\xff\xff\xff\xff")
            return
        buffer.write(_I32.pack(len(items)))
        for value in items:
            item(buffer, value)

    return write_legacy


def _nullable_entity(write_entity: Writer) -> Writer:
    # KIP-893: a nullable struct is an int8 marker (-1: null, 1: present) and the struct.
    def write(buffer: Any, value: Any) -> None:
        if value is None:
            buffer.write(b"\xff")
            return
        buffer.write(b"\x01")
        write_entity(buffer, value)

    return write


def _kio_choice(field: Field[Any], flexible: bool, is_request_header: bool, is_tag: bool) -> Any:
    """kio's writer of a plain (not array, not entity) field, as its get_field_writer
    chooses; None for any other field."""
    if is_request_header and field.name == "client_id":
        return kio_writers.write_nullable_legacy_string  # always the legacy string
    if not isinstance(classify_field(field), PrimitiveField):
        return None
    optional = False if is_tag else is_optional(field)
    return get_writer(get_schema_field_type(field), flexible, optional)


def _field_writer(
    field: Field[Any], flexible: bool, is_request_header: bool, is_tag: bool
) -> Writer:
    """As kio's get_field_writer chooses, with ours in place of kio's functions."""
    plain = _kio_choice(field, flexible, is_request_header, is_tag)
    if plain is not None:
        return _value_writer(plain)
    optional = False if is_tag else is_optional(field)
    kind = classify_field(field)
    inner: Writer
    match kind:
        case PrimitiveTupleField():
            inner = _value_writer(get_writer(get_schema_field_type(field), flexible, False))
        case EntityField(entity_type):
            inner = entity_writer(entity_type, optional)
        case EntityTupleField(entity_type):
            inner = entity_writer(entity_type)
        case _:
            raise AssertionError(f"unclassified field {field.name}")
    if kind.is_array:
        return _array(inner, flexible)
    return inner


def _fixed_of(field: Field[Any], flexible: bool, is_request_header: bool) -> tuple[str, Any] | None:
    """(struct code, conversion) of a plain field of a fixed width, else None."""
    return _FIXED.get(_kio_choice(field, flexible, is_request_header, False))


def _run_writer(names: list[str], codes: list[str], converts: list[Any]) -> Writer:
    """One writer for consecutive fixed-width fields: one attrgetter, one struct."""
    pack = struct.Struct(">" + "".join(codes)).pack
    if len(names) == 1:
        get_one = attrgetter(names[0])
        convert = converts[0]
        if convert is None:
            return lambda buffer, entity: buffer.write(pack(get_one(entity)))
        return lambda buffer, entity: buffer.write(pack(convert(get_one(entity))))
    get_all = attrgetter(*names)
    if all(c is None for c in converts):
        return lambda buffer, entity: buffer.write(pack(*get_all(entity)))
    pairs = list(enumerate(converts))

    def write(buffer: Any, entity: Any) -> None:
        values = list(get_all(entity))
        for i, convert in pairs:
            if convert is not None:
                values[i] = convert(values[i])
        buffer.write(pack(*values))

    return write


def _field_step(name: str, write_value: Writer) -> Writer:
    get = attrgetter(name)
    return lambda buffer, entity: write_value(buffer, get(entity))


class Parts(list[Any]):
    """A write target that keeps references instead of copying: the writers only call
    ``write``, and joining the parts at the end copies every byte exactly once."""

    __slots__ = ()

    # list.append itself, not a Python wrapper: write is called once per field or run.
    write = list.append


@cache
def entity_writer(entity_type: type, nullable: bool = False) -> Writer:
    """The writer of entity_type's instances (of None too, with nullable)."""
    flexible = bool(entity_type.__flexible__)  # type: ignore[attr-defined]
    is_request_header = entity_type.__name__ == "RequestHeader"
    steps: list[Writer] = []
    tagged: list[tuple[int, str, Writer, Any, Any]] = []
    names: list[str] = []  # the fixed-width fields since the last other one
    codes: list[str] = []
    converts: list[Any] = []

    def end_run() -> None:
        if names:
            steps.append(_run_writer(list(names), list(codes), list(converts)))
            names.clear()
            codes.clear()
            converts.clear()

    for field in fields(entity_type):
        tag = get_field_tag(field)
        if tag is not None:
            tagged.append(
                (
                    int(tag),
                    field.name,
                    _field_writer(field, flexible, is_request_header, True),
                    field.default,
                    get_tagged_field_default(field),
                )
            )
            continue
        fixed = _fixed_of(field, flexible, is_request_header)
        if fixed is not None:
            names.append(field.name)
            codes.append(fixed[0])
            converts.append(fixed[1])
            continue
        end_run()
        steps.append(
            _field_step(field.name, _field_writer(field, flexible, is_request_header, False))
        )
    end_run()
    if tagged and not flexible:
        raise ValueError("Found tagged fields on a non-flexible model")
    tagged.sort(key=lambda t: t[0])
    body = tuple(steps)

    def write_entity(buffer: Any, entity: Any) -> None:
        for step in body:
            step(buffer, entity)
        if not flexible:
            return
        if not tagged:
            buffer.write(b"\x00")
            return
        present: list[tuple[int, bytes]] = []
        for tag, name, write_value, default, implicit in tagged:
            value = getattr(entity, name)
            if value == default or (default is MISSING and value == implicit):
                continue
            collected = Parts()
            write_value(collected, value)
            present.append((tag, b"".join(collected)))
        buffer.write(_uvarint(len(present)))
        for tag, encoded in present:
            buffer.write(_uvarint(tag))
            buffer.write(_uvarint(len(encoded)))
            buffer.write(encoded)

    return _nullable_entity(write_entity) if nullable else write_entity
