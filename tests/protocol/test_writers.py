"""protocol.writers writes kio's bytes: every request and response class of every
version, on random entities, with their tagged fields set and left at their defaults."""

from __future__ import annotations

import io
import random
from dataclasses import MISSING, fields, replace
from typing import Any

import pytest
from kio.serial import entity_writer as kio_entity_writer
from kio.serial._introspect import get_field_tag

from protocol import writers
from protocol.codec import Gathered, encode_response_parts
from tests.protocol.kio_samples import payload_classes, sample

CLASSES = payload_classes("request") + payload_classes("response")


def ours(entity: Any) -> bytes:
    parts = writers.Parts()
    writers.entity_writer(type(entity))(parts, entity)
    return b"".join(parts)


def kios(entity: Any) -> bytes:
    buffer = io.BytesIO()
    kio_entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def untagged(entity: Any) -> Any:
    """The entity with each tagged field that has a default at it, at every depth."""
    changes: dict[str, Any] = {}
    for field in fields(entity):
        value = getattr(entity, field.name)
        if get_field_tag(field) is not None and field.default is not MISSING:
            changes[field.name] = field.default
        elif isinstance(value, tuple) and value and hasattr(value[0], "__dataclass_fields__"):
            changes[field.name] = tuple(untagged(v) for v in value)
        elif hasattr(value, "__dataclass_fields__"):
            changes[field.name] = untagged(value)
    return replace(entity, **changes)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__.split('.')[-2:]}")
def test_the_bytes_are_kios(cls: type) -> None:
    rng = random.Random(f"{cls.__module__}.{cls.__name__}")
    for _ in range(8):
        entity = sample(cls, rng)
        assert ours(entity) == kios(entity)
        plain = untagged(entity)
        assert ours(plain) == kios(plain)


def test_a_fixed_width_run_is_packed_in_one_part() -> None:
    # PartitionProduceResponse v9: index, error_code, base_offset, log_append_time and
    # log_start_offset follow each other: one part, not five.
    from kio.schema.errors import ErrorCode
    from kio.schema.produce.v9.response import PartitionProduceResponse

    entity = PartitionProduceResponse(
        index=3, error_code=ErrorCode.none, base_offset=7, log_start_offset=0, record_errors=()
    )
    parts = writers.Parts()
    writers.entity_writer(PartitionProduceResponse)(parts, entity)
    assert parts[0] == (3).to_bytes(4, "big") + bytes(2) + (7).to_bytes(
        8, "big"
    ) + b"\xff" * 8 + bytes(8)
    assert b"".join(parts) == kios(entity)


def test_records_pieces_stay_in_place() -> None:
    # A Gathered records value is handed on as it is: the frame lays its pieces out.
    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v12 import response as v12

    pieces = [b"a" * 70_000, b"b" * 10, b"c" * 70_000]
    partition = v12.PartitionData(
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=5,
        last_stable_offset=5,
        log_start_offset=0,
        aborted_transactions=None,
        records=Gathered(pieces),
    )
    response = v12.FetchResponse(
        throttle_time=__import__("datetime").timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(v12.FetchableTopicResponse(topic="t", partitions=(partition,)),),
    )
    parts = encode_response_parts(9, response)
    assert any(part is pieces[0] for part in parts) and any(part is pieces[2] for part in parts)
    joined = replace(partition, records=b"".join(pieces))
    whole = replace(response, responses=(replace(response.responses[0], partitions=(joined,)),))
    # After the size, the correlation id and the header's empty tag section:
    assert b"".join(parts)[4 + 4 + 1 :] == kios(whole)
