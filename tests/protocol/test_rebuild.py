"""The log cleaner's batches: rebuilt with fewer records, or emptied to a header."""

from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import (
    HEADER_SIZE,
    NO_TIMESTAMP,
    Record,
    RecordBatchError,
    RecordBatchView,
    RecordSpec,
    build_batch,
    control_record_type,
    empty_batch,
    end_txn_marker,
    iter_batches,
    iter_records,
    rebase_batches,
    rebuild_batch,
    validate_batches,
    validate_produce_records,
)

T0 = 1_700_000_000_000
HORIZON = T0 + 86_400_000
DELETE_HORIZON_BIT = 0x40  # attributes bit 6, Kafka's DELETE_HORIZON_FLAG_MASK

# Timestamps out of order, headers, null keys and values (a tombstone at delta 2).
RECORDS: list[RecordSpec] = [
    (b"k0", b"v0", [], T0 + 50),
    (None, b"v1", [("trace", b"abc"), ("none", None)], T0),
    (b"k2", None, [], T0 + 100),
    (b"k3", b"v3" * 300, [("h", b"\x00\xff")], T0 - 30),
    (b"k4", b"", [], T0 + 7),
]

CODECS = list(Compression)
CODEC_IDS = [Compression(c).name.lower() for c in CODECS]


def one(data: bytes) -> RecordBatchView:
    [view] = validate_batches(data, from_client=False)
    return view


def original(
    codec: int = Compression.NONE,
    *,
    transactional: bool = False,
    control: bool = False,
    log_append_time: int | None = None,
) -> RecordBatchView:
    return one(
        build_batch(
            RECORDS,
            base_offset=1000,
            compression=codec,
            producer_id=4000,
            producer_epoch=3,
            base_sequence=17,
            transactional=transactional,
            control=control,
            partition_leader_epoch=5,
            log_append_time=log_append_time,
        )
    )


def header(view: RecordBatchView) -> dict[str, object]:
    """The header fields a rebuilt or emptied batch keeps."""
    return {
        "base_offset": view.base_offset,
        "last_offset_delta": view.last_offset_delta,
        "last_offset": view.last_offset,
        "partition_leader_epoch": view.partition_leader_epoch,
        "timestamp_type": view.timestamp_type,
        "producer_id": view.producer_id,
        "producer_epoch": view.producer_epoch,
        "base_sequence": view.base_sequence,
        "is_transactional": view.is_transactional,
        "is_control": view.is_control,
    }


# (kept offset deltas, delete horizon)
SUBSETS = [
    ((1, 2, 3), None),  # the first and the last record removed
    ((0,), None),
    ((4,), HORIZON),
    ((0, 2, 4), HORIZON),
    ((0, 1, 2, 3, 4), HORIZON),  # all kept, a horizon to set
]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@pytest.mark.parametrize(("deltas", "horizon"), SUBSETS)
def test_rebuild_keeps_header_and_records(
    codec: int, deltas: tuple[int, ...], horizon: int | None
) -> None:
    source = original(codec, transactional=True)
    records = list(iter_records(source))
    kept = [records[d] for d in deltas]

    rebuilt = one(rebuild_batch(source, kept, delete_horizon_ms=horizon))

    assert rebuilt.crc_valid
    assert header(rebuilt) == header(source)
    assert rebuilt.last_offset == 1004  # unchanged even when the last record went
    assert rebuilt.compression == codec  # compressed again with its own codec
    assert rebuilt.record_count == len(deltas)
    assert list(iter_records(rebuilt)) == kept  # deltas, timestamps, keys, values, headers
    assert rebuilt.max_timestamp == max(RECORDS[d][3] for d in deltas)
    assert rebuilt.delete_horizon_ms == horizon
    if horizon is None:
        assert rebuilt.base_timestamp == RECORDS[deltas[0]][3]
        assert rebuilt.attributes & DELETE_HORIZON_BIT == 0
    else:
        assert rebuilt.base_timestamp == horizon
        assert rebuilt.attributes & DELETE_HORIZON_BIT
    assert rebuilt.attributes & ~DELETE_HORIZON_BIT == source.attributes


def test_rebuild_with_every_record_and_no_horizon_is_the_same_batch() -> None:
    source = original()
    assert rebuild_batch(source, list(iter_records(source))) == bytes(source.data)


def test_rebuild_keeps_a_horizon_already_set() -> None:
    first = one(rebuild_batch(original(), list(iter_records(original())), delete_horizon_ms=T0))
    again = one(rebuild_batch(first, list(iter_records(first))[1:], delete_horizon_ms=T0))
    assert again.delete_horizon_ms == T0
    assert [r.timestamp for r in iter_records(again)] == [r[3] for r in RECORDS[1:]]


@pytest.mark.parametrize("horizon", [None, HORIZON])
def test_rebuild_of_a_log_append_time_batch(horizon: int | None) -> None:
    appended = T0 + 5_000
    source = original(Compression.LZ4, log_append_time=appended)
    kept = list(iter_records(source))[2:4]
    rebuilt = one(rebuild_batch(source, kept, delete_horizon_ms=horizon))
    assert rebuilt.timestamp_type == 1
    assert rebuilt.max_timestamp == appended
    assert rebuilt.delete_horizon_ms == horizon
    assert [r.timestamp for r in iter_records(rebuilt)] == [appended, appended]
    assert [r.offset_delta for r in iter_records(rebuilt)] == [2, 3]


def test_rebuild_of_a_control_batch() -> None:
    key, value = end_txn_marker(commit=False, coordinator_epoch=9)
    source = one(
        build_batch(
            [(key, value, [], T0)],
            base_offset=77,
            producer_id=4000,
            producer_epoch=3,
            base_sequence=17,
            transactional=True,
            control=True,
        )
    )
    rebuilt = one(rebuild_batch(source, list(iter_records(source)), delete_horizon_ms=HORIZON))
    assert header(rebuilt) == header(source)
    assert rebuilt.is_control and rebuilt.is_transactional
    assert rebuilt.delete_horizon_ms == HORIZON
    [record] = iter_records(rebuilt)
    assert control_record_type(record.key) is not None
    assert (record.key, record.value, record.timestamp) == (key, value, T0)


BAD_RECORDS = [
    ("none", []),
    ("out of order", [Record(2, T0, b"a", b"a"), Record(1, T0, b"b", b"b")]),
    ("repeated", [Record(1, T0, b"a", b"a"), Record(1, T0, b"b", b"b")]),
    ("past the batch", [Record(5, T0, b"a", b"a")]),
    ("negative", [Record(-1, T0, b"a", b"a")]),
]


@pytest.mark.parametrize(("name", "records"), BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_rebuild_refuses_records_that_are_not_the_batch_s(name: str, records: list[Record]) -> None:
    with pytest.raises(ValueError):
        rebuild_batch(original(), records)


# --- empty batches -------------------------------------------------------------


# (name, codec, transactional, control, log append time)
EMPTIED = [
    ("plain", Compression.NONE, False, False, None),
    ("gzip, transactional", Compression.GZIP, True, False, None),
    ("zstd, log append time", Compression.ZSTD, False, False, T0 + 9),
    ("snappy control", Compression.SNAPPY, True, True, None),
]


@pytest.mark.parametrize(
    ("name", "codec", "transactional", "control", "log_append_time"),
    EMPTIED,
    ids=[case[0] for case in EMPTIED],
)
def test_empty_batch_is_a_header_with_the_batch_s_offsets_and_producer(
    name: str, codec: int, transactional: bool, control: bool, log_append_time: int | None
) -> None:
    source = original(
        codec, transactional=transactional, control=control, log_append_time=log_append_time
    )
    data = empty_batch(source)

    assert len(data) == HEADER_SIZE
    [view] = iter_batches(data)  # the fetch path reads it
    assert view.crc_valid
    assert header(view) == header(source)
    assert view.last_offset == 1004
    assert view.record_count == 0
    assert view.compression == Compression.NONE
    assert view.max_timestamp == source.max_timestamp
    assert view.base_timestamp == NO_TIMESTAMP  # as Kafka's writeEmptyHeader
    assert view.delete_horizon_ms is None
    assert list(iter_records(view)) == []
    assert validate_batches(data, from_client=False)[0].record_count == 0


def test_empty_batch_drops_a_delete_horizon() -> None:
    source = one(rebuild_batch(original(), list(iter_records(original())), delete_horizon_ms=T0))
    assert source.delete_horizon_ms == T0
    emptied = one(empty_batch(source))
    assert emptied.delete_horizon_ms is None
    assert emptied.attributes & DELETE_HORIZON_BIT == 0


def test_an_empty_batch_emptied_again_is_the_same_bytes() -> None:
    data = empty_batch(original(Compression.GZIP, transactional=True))
    assert empty_batch(one(data)) == data


def test_empty_batches_keep_their_offsets_when_rebased() -> None:
    data = empty_batch(original()) + build_batch(RECORDS[:1])
    views = list(iter_batches(rebase_batches(data, 50)))
    assert [(v.base_offset, v.last_offset, v.record_count) for v in views] == [
        (50, 54, 0),
        (55, 55, 1),
    ]


def test_clients_may_not_produce_an_empty_batch() -> None:
    data = bytearray(empty_batch(original()))
    struct.pack_into(">q", data, 0, 0)  # a client's baseOffset; outside the CRC
    with pytest.raises(RecordBatchError) as info:
        validate_batches(bytes(data))
    assert info.value.error_code == ErrorCode.invalid_record
    with pytest.raises(RecordBatchError) as info:
        validate_produce_records(bytes(data), 9)
    assert info.value.error_code == ErrorCode.invalid_record


def test_ordinary_batches_have_no_delete_horizon() -> None:
    view = original()
    assert view.delete_horizon_ms is None
    assert view.base_timestamp == T0 + 50
