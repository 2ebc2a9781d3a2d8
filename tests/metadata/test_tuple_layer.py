"""metadata.tuple_layer packs and unpacks exactly as FoundationDB's own tuple layer."""

from __future__ import annotations

import uuid

import fdb.tuple as fdb_tuple
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import tuple_layer

# The fast path's types, with the edges of its ints (8 bytes either way) and beyond.
edge_ints = st.sampled_from(
    [0, 1, -1, 255, 256, -255, -256, 2**63, 2**64 - 2, 2**64 - 1, 2**64]
    + [-(2**64) + 2, -(2**64) + 1, -(2**64), 2**70]
)
fast_items = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.text(max_size=10),
    st.integers(min_value=-(2**70), max_value=2**70),
    edge_ints,
)
# Tuples inside tuples, of the same types, nulls and nesting within nesting included.
nested_items = st.recursive(
    fast_items, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12
)
other_items = st.one_of(
    st.booleans(),
    st.floats(allow_nan=False),
    st.uuids(),
    st.tuples(st.one_of(fast_items, st.booleans(), st.uuids())),
)


@settings(max_examples=800)
@given(st.lists(nested_items, max_size=8))
def test_the_same_bytes_and_tuples_as_fdb(items: list) -> None:
    t = tuple(items)
    packed = fdb_tuple.pack(t)
    assert tuple_layer.pack(t) == packed
    assert tuple_layer.unpack(packed) == fdb_tuple.unpack(packed)
    assert [type(x) for x in tuple_layer.unpack(packed)] == [type(x) for x in t]


def test_a_producer_state_is_packed_and_read_here(monkeypatch: pytest.MonkeyPatch) -> None:
    # (epoch, ((first sequence, last sequence, offset), ...)): written by every flush of
    # an idempotent producer; fdb.tuple's pure Python took 26 us a flush to pack and read.
    value = (3, tuple((i * 16, i * 16 + 15, 1000 + i) for i in range(5)))
    packed = fdb_tuple.pack(value)

    def refused(_arg: object) -> None:
        raise AssertionError("went to fdb.tuple")

    monkeypatch.setattr(tuple_layer, "_fdb_pack", refused)
    monkeypatch.setattr(tuple_layer, "_fdb_unpack", refused)
    assert tuple_layer.pack(value) == packed
    assert tuple_layer.unpack(packed) == value
    assert tuple_layer.unpack(tuple_layer.pack((None, (None, b"\x00"), ()))) == (
        None,
        (None, b"\x00"),
        (),
    )


@settings(max_examples=300)
@given(st.lists(st.one_of(fast_items, other_items), min_size=1, max_size=6))
def test_other_types_go_to_fdb_whole(items: list) -> None:
    t = tuple(items)
    packed = fdb_tuple.pack(t)
    assert tuple_layer.pack(t) == packed
    assert tuple_layer.unpack(packed) == fdb_tuple.unpack(packed)


def test_nul_bytes_inside_bytes_and_strings_are_escaped() -> None:
    t = (b"\x00", b"a\x00\xffb\x00", "x\x00y", b"", "")
    assert tuple_layer.pack(t) == fdb_tuple.pack(t)
    assert tuple_layer.unpack(tuple_layer.pack(t)) == t
    assert tuple_layer.unpack(memoryview(tuple_layer.pack(t))) == t


def test_a_bool_is_not_packed_as_an_int() -> None:
    assert tuple_layer.pack((True, 1)) == fdb_tuple.pack((True, 1)) != fdb_tuple.pack((1, 1))
    assert tuple_layer.unpack(tuple_layer.pack((True, uuid.UUID(int=5)))) == (
        True,
        uuid.UUID(int=5),
    )


@pytest.mark.parametrize(
    "packed",
    [b"\x15", b"\x1c\x01\x02", b"\x13", b"\x01abc", b"\x02ab", b"\x01a\x00\xff"]
    + [b"\x05", b"\x05\x15\x01", b"\x05\x00\xff", b"\x05\x05\x14\x00", b"\x05\x15"],
)
def test_truncated_input_unpacks_or_fails_as_with_fdb(packed: bytes) -> None:
    try:
        expected: object = fdb_tuple.unpack(packed)
    except Exception as exc:
        expected = type(exc)
    try:
        got: object = tuple_layer.unpack(packed)
    except Exception as exc:
        got = type(exc)
    assert got == expected
