"""Lengths and nulls of a kio entity's bytes, checked before kio's reader sees them.

kio's native reader reserves room for as many items as an array length read from the
wire announces, before it reads one: a 20-byte Metadata request announcing 2**32-2 topics
makes it ask for 34 GB, and the process aborts. It also reads a null array as None
whatever the schema says, and handlers then fail on it. ``check`` reads the same bytes
first, without building anything.

Rules:

- ``check(entity_type, data, offset)`` walks one ``entity_type`` at ``data[offset]`` as
  kio's reader does and returns the offset after it. It raises ``ValueError`` when:
  a length (array, string, bytes, tagged field) is longer than the bytes left in
  ``data``, or negative other than -1; a null stands where the field's kio type is not
  ``X | None`` (Apache Kafka's generated readers refuse it too: "non-nullable field ...
  was serialized as null"); a varint runs over 5 bytes; a known tagged field's value
  does not fill its size exactly; or the data ends inside the entity.
- An array's items take at least one byte each on the wire, so its length is checked
  against the bytes left times the fewest bytes one item takes.
- Fields map to wire types as kio maps them (``kio.serial._introspect``): int16/int32
  lengths before an API's first flexible version, an unsigned varint of length + 1 from
  it; uuids 16 bytes; a nullable struct (KIP-893) an int8 marker, -1 for null;
  ``RequestHeader.client_id`` always a nullable int16-length string. A known tagged
  field's value is read after its size, as kio does; unknown tags are skipped.
- A checker is built once per entity class, as closures; a run of fixed-width fields
  is one addition. Nothing is allocated for a length read from the wire.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)
from kio.static.protocol import Entity

__all__ = ["check"]

Data = bytes | memoryview
# Walks one value at data[pos] and returns the offset after it; the int is len(data).
Walk = Callable[[Data, int, int], int]

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from

_FIXED_WIDTHS = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float64": 8,
    "bool": 1,
    "uuid": 16,
    "error_code": 2,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
}


@dataclass(frozen=True, slots=True)
class _Layout:
    """How a field or entity lies on the wire: ``walk`` is None when it always takes
    exactly ``size`` bytes; otherwise ``size`` is the fewest bytes it takes."""

    walk: Walk | None
    size: int
    # For an entity of one step and tagged fields: (skip, step, tail, tagged fields' walk),
    # which an array walks in its own loop, one call an item fewer (a Produce partition:
    # 256 of them took 69 us, and 56 so).
    inline: tuple[int, Walk, int, Walk] | None = None


_checkers: dict[type[Entity], Walk] = {}
_entities: dict[tuple[type[Entity], bool], _Layout] = {}


def check(entity_type: type[Entity], data: Data, offset: int) -> int:
    """The offset just after the ``entity_type`` at ``data[offset]``.

    :raises ValueError: a length over the bytes left, a null the schema does not allow,
        or the data ends inside the entity.
    """
    walk = _checkers.get(entity_type)
    if walk is None:
        walk = _checkers[entity_type] = _top(entity_type)
    end = len(data)
    try:
        position = walk(data, offset, end)
    except (IndexError, struct.error):
        # A read past the end: the walk indexes the data directly rather than test every read.
        position = end + 1
    if position > end:
        raise ValueError(f"{entity_type.__name__} ends past the {end - offset} bytes given")
    return position


def _top(entity_type: type[Entity]) -> Walk:
    layout = _entity(entity_type, nullable=False)
    if layout.walk is not None:
        return layout.walk
    size = layout.size
    return lambda _data, position, _end: position + size


def _nullable(field: Field[Any]) -> bool:
    """Whether the field's kio type is ``X | None``. (kio's ``is_optional`` also says so
    of ``tuple[X | None, ...]``, whose array Kafka does not let be null.)"""
    return get_origin(field.type) in (UnionType, Union) and NoneType in get_args(field.type)


def _entity(entity_type: type[Entity], nullable: bool) -> _Layout:
    key = (entity_type, nullable)
    layout = _entities.get(key)
    if layout is None:
        layout = _entities[key] = _build_entity(entity_type, nullable)
    return layout


def _build_entity(entity_type: type[Entity], nullable: bool) -> _Layout:
    name = entity_type.__name__
    flexible = bool(entity_type.__flexible__)
    request_header = name == "RequestHeader"
    steps: list[tuple[int, Walk]] = []  # (fixed bytes before it, a field's walk)
    fixed = 0
    size = 0
    tagged: dict[int, tuple[str, _Layout]] = {}
    for field in fields(entity_type):
        tag = get_field_tag(field)
        layout = _field(entity_type, field, request_header, tagged=tag is not None)
        if tag is not None:
            tagged[int(tag)] = (f"{name}.{field.name}", layout)
        elif layout.walk is None:
            fixed += layout.size
            size += layout.size
        else:
            steps.append((fixed, layout.walk))
            fixed = 0
            size += layout.size
    if flexible:
        size += 1  # the count of tagged fields
        walk_tags = _tagged_fields(name, tagged)
        walk = _sequence(tuple(steps), fixed, walk_tags)
        if len(steps) == 1 and not nullable:
            ((skip, step),) = steps
            return _Layout(walk, size, (skip, step, fixed, walk_tags))
    elif steps:
        walk = _sequence(tuple(steps), fixed, None)
    else:
        entity = _Layout(None, size)
        return _null_marker(entity) if nullable else entity
    entity = _Layout(walk, size)
    return _null_marker(entity) if nullable else entity


def _sequence(steps: tuple[tuple[int, Walk], ...], tail: int, walk_tags: Walk | None) -> Walk:
    """The walk of an entity: each step after the fixed bytes before it, the fixed bytes
    after the last, then its tagged fields if it has them (flexible versions).

    One entity with a step or none is most of a request (a Fetch or Produce partition),
    so those are written out instead of looped over: a loop costs 50 ns an entity more.
    """
    if walk_tags is None:
        if len(steps) == 1:
            ((skip, step),) = steps

            def walk_one(data: Data, position: int, end: int) -> int:
                return step(data, position + skip, end) + tail

            return walk_one

        def walk_all(data: Data, position: int, end: int) -> int:
            for skip, step in steps:
                position = step(data, position + skip, end)
            return position + tail

        return walk_all

    tags = walk_tags
    if not steps:

        def walk_none_tagged(data: Data, position: int, end: int) -> int:
            position += tail
            if data[position]:
                return tags(data, position, end)
            return position + 1

        return walk_none_tagged

    if len(steps) == 1:
        ((first_skip, first),) = steps

        def walk_one_tagged(data: Data, position: int, end: int) -> int:
            position = first(data, position + first_skip, end) + tail
            if data[position]:
                return tags(data, position, end)
            return position + 1

        return walk_one_tagged

    def walk_all_tagged(data: Data, position: int, end: int) -> int:
        for skip, step in steps:
            position = step(data, position + skip, end)
        position += tail
        if data[position]:
            return tags(data, position, end)
        return position + 1

    return walk_all_tagged


def _null_marker(entity: _Layout) -> _Layout:
    """A nullable struct (KIP-893): an int8 marker, -1 for null, before the struct."""
    inner = entity.walk
    size = entity.size

    def walk(data: Data, position: int, end: int) -> int:
        if data[position] == 0xFF:
            return position + 1
        if inner is None:
            return position + 1 + size
        return inner(data, position + 1, end)

    return _Layout(walk, 1)


def _tagged_fields(name: str, tagged: dict[int, tuple[str, _Layout]]) -> Walk:
    def walk(data: Data, position: int, end: int) -> int:
        count, position = _uvarint(data, position)
        # A tag and a size take a byte each at least.
        if 2 * count > end - position:
            raise ValueError(f"{name} has {count} tagged fields, in {end - position} bytes")
        for _ in range(count):
            tag, position = _uvarint(data, position)
            size, position = _uvarint(data, position)
            if size > end - position:
                raise ValueError(
                    f"{name} has a tagged field {tag} of {size} bytes, "
                    f"over the {end - position} bytes left"
                )
            known = tagged.get(tag)
            if known is None:
                position += size
                continue
            field_name, layout = known
            stop = position + size
            if layout.walk is None:
                position += layout.size
            else:
                position = layout.walk(data, position, end)
            if position != stop:
                raise ValueError(
                    f"tagged field {field_name} has a size of {size} bytes, "
                    f"and its value takes {size + position - stop}"
                )
        return position

    return walk


def _field(
    owner: type[Entity], field: Field[Any], request_header: bool, *, tagged: bool
) -> _Layout:
    where = f"{owner.__name__}.{field.name}"
    flexible = bool(owner.__flexible__)
    nullable = _nullable(field)
    if request_header and field.name == "client_id":
        return _legacy_sized(where, _I16, 2, nullable=True)
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        return _primitive(where, get_schema_field_type(field), flexible, nullable)
    if isinstance(kind, PrimitiveTupleField):
        item = _primitive(where, get_schema_field_type(field), flexible, nullable=False)
    elif isinstance(kind, EntityField):
        # As kio writes them: a tagged struct has no null marker, its tag's absence is null.
        return _entity(kind.type_, nullable=nullable and not tagged)
    elif isinstance(kind, EntityTupleField):
        item = _entity(kind.type_, nullable=False)
    else:
        raise NotImplementedError(f"{where}: no wire layout for {kind!r}")
    if flexible:
        return _compact_array(where, item, nullable)
    return _legacy_array(where, item, nullable)


def _primitive(where: str, kafka_type: str, flexible: bool, nullable: bool) -> _Layout:
    width = _FIXED_WIDTHS.get(kafka_type)
    if width is not None:
        return _Layout(None, width)
    if kafka_type not in ("string", "bytes", "records"):
        raise NotImplementedError(f"{where}: no wire layout for kafka_type {kafka_type!r}")
    if flexible:
        return _compact_sized(where, nullable)
    if kafka_type == "string":
        return _legacy_sized(where, _I16, 2, nullable)
    return _legacy_sized(where, _I32, 4, nullable)


def _legacy_sized(
    where: str, unpack: Callable[[Data, int], tuple[Any, ...]], prefix: int, nullable: bool
) -> _Layout:
    """A string (int16 length) or bytes (int32 length) before flexible versions."""

    def walk(data: Data, position: int, end: int) -> int:
        length: int
        (length,) = unpack(data, position)
        position += prefix
        if length < 0:
            if length == -1 and nullable:
                return position
            raise _null_or_negative(where, length)
        if length > end - position:
            raise _too_long(where, length, end - position)
        return position + length

    return _Layout(walk, prefix)


def _compact_sized(where: str, nullable: bool) -> _Layout:
    """A compact string or bytes: an unsigned varint of length + 1, 0 for null."""

    def walk(data: Data, position: int, end: int) -> int:
        # Lengths of two or three bytes (under 2 MiB, as records are) are read here: a
        # call for them made 256 partitions of 17 KB take 142 us to check, against 110.
        length = data[position]
        if length < 0x80:
            position += 1
        elif (second := data[position + 1]) < 0x80:
            length = length & 0x7F | second << 7
            position += 2
        elif (third := data[position + 2]) < 0x80:
            length = length & 0x7F | (second & 0x7F) << 7 | third << 14
            position += 3
        else:
            length, position = _uvarint(data, position)
        if not length:
            if nullable:
                return position
            raise _null_or_negative(where, -1)
        length -= 1
        if length > end - position:
            raise _too_long(where, length, end - position)
        return position + length

    return _Layout(walk, 1)


def _legacy_array(where: str, item: _Layout, nullable: bool) -> _Layout:
    item_walk = item.walk
    item_size = item.size
    least = max(item_size, 1)

    def walk(data: Data, position: int, end: int) -> int:
        count: int
        (count,) = _I32(data, position)
        position += 4
        if count < 0:
            if count == -1 and nullable:
                return position
            raise _null_or_negative(where, count)
        if count * least > end - position:
            raise _too_long(where, count, end - position, item_size)
        if item_walk is None:
            return position + count * item_size
        for _ in range(count):
            position = item_walk(data, position, end)
        return position

    return _Layout(walk, 4)


def _compact_array(where: str, item: _Layout, nullable: bool) -> _Layout:
    item_size = item.size
    least = max(item_size, 1)
    if item.inline is not None:
        return _Layout(_compact_array_inline(where, item.inline, least, item_size, nullable), 1)
    item_walk = item.walk

    def walk(data: Data, position: int, end: int) -> int:
        count = data[position]
        if count < 0x80:
            position += 1
        else:
            count, position = _uvarint(data, position)
        if not count:
            if nullable:
                return position
            raise _null_or_negative(where, -1)
        count -= 1
        if count * least > end - position:
            raise _too_long(where, count, end - position, item_size)
        if item_walk is None:
            return position + count * item_size
        for _ in range(count):
            position = item_walk(data, position, end)
        return position

    return _Layout(walk, 1)


def _compact_array_inline(
    where: str, inline: tuple[int, Walk, int, Walk], least: int, item_size: int, nullable: bool
) -> Walk:
    """A compact array of entities of one step each, walked in the array's own loop."""
    skip, step, tail, tags = inline

    def walk(data: Data, position: int, end: int) -> int:
        count = data[position]
        if count < 0x80:
            position += 1
        else:
            count, position = _uvarint(data, position)
        if not count:
            if nullable:
                return position
            raise _null_or_negative(where, -1)
        count -= 1
        if count * least > end - position:
            raise _too_long(where, count, end - position, item_size)
        for _ in range(count):
            position = step(data, position + skip, end) + tail
            if data[position]:
                position = tags(data, position, end)
            else:
                position += 1
        return position

    return walk


def _uvarint(data: Data, position: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes, as kio reads Kafka's lengths and counts.

    Written out byte by byte: half the time of a loop (200 ns against 420 for two bytes).
    """
    byte = data[position]
    if byte < 0x80:
        return byte, position + 1
    value = byte & 0x7F
    byte = data[position + 1]
    if byte < 0x80:
        return value | byte << 7, position + 2
    value |= (byte & 0x7F) << 7
    byte = data[position + 2]
    if byte < 0x80:
        return value | byte << 14, position + 3
    value |= (byte & 0x7F) << 14
    byte = data[position + 3]
    if byte < 0x80:
        return value | byte << 21, position + 4
    value |= (byte & 0x7F) << 21
    byte = data[position + 4]
    if byte < 0x80:
        return value | byte << 28, position + 5
    raise ValueError(f"a varint longer than 5 bytes ends at byte {position + 5}")


def _null_or_negative(where: str, length: int) -> ValueError:
    if length == -1:
        # Apache Kafka's generated readers say it in these words.
        return ValueError(f"non-nullable field {where} was serialized as null")
    return ValueError(f"{where} has a negative length ({length})")


def _too_long(where: str, length: int, left: int, item_size: int = 0) -> ValueError:
    if item_size > 1:
        return ValueError(
            f"{where} has {length} items of {item_size} bytes at least, over the {left} bytes left"
        )
    return ValueError(f"{where} has a length of {length}, over the {left} bytes left")
