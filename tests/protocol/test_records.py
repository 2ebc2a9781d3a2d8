from __future__ import annotations

import struct
import time
import warnings
from collections.abc import Sequence

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AiokafkaBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import (
    HEADER_SIZE,
    ControlRecordType,
    Record,
    RecordBatchError,
    RecordBatchView,
    RecordSpec,
    build_batch,
    control_record_type,
    end_txn_marker,
    iter_batches,
    iter_records,
    rebase_batches,
    rebase_parts,
    set_base_offset,
    set_log_append_time,
    validate_batches,
    validate_produce_records,
    with_log_append_time,
)

with warnings.catch_warnings():
    # kafka-python loads its schemas with deprecated importlib.resources calls.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec
    from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

T0 = 1_700_000_000_000

# Timestamps out of order within the batch, headers, null key and value.
RECORDS: list[RecordSpec] = [
    (b"key-0", b"value-0", [], T0 + 50),
    (None, b"value-1", [("trace", b"abc"), ("empty", b""), ("none", None)], T0),
    (b"key-2", None, [], T0 + 100),
    (None, None, [("h", b"\x00\xff")], T0 - 30),
    (b"", b"", [], T0 + 7),
    (b"k" * 300, b"v" * 5000, [("big", b"x" * 200)], T0 + 100),
]


def expected_records(records: Sequence[RecordSpec]) -> list[Record]:
    return [
        Record(delta, timestamp, key, value, tuple(headers))
        for delta, (key, value, headers, timestamp) in enumerate(records)
    ]


def client_batch(
    builder_class: type, codec: int, records: Sequence[RecordSpec] = RECORDS, **producer: int
) -> bytes:
    """A batch written by a real client library's record builder."""
    builder = builder_class(
        magic=2,
        compression_type=codec,
        is_transactional=producer.get("transactional", 0),
        producer_id=producer.get("producer_id", -1),
        producer_epoch=producer.get("producer_epoch", -1),
        base_sequence=producer.get("base_sequence", -1),
        batch_size=1 << 20,
    )
    for delta, (key, value, headers, timestamp) in enumerate(records):
        builder.append(
            offset=delta, timestamp=timestamp, key=key, value=value, headers=list(headers)
        )
    return bytes(builder.build())


def kafka_python_codecs() -> list[int]:
    available = {
        Compression.NONE: True,
        Compression.GZIP: kafka_codec.has_gzip(),
        Compression.SNAPPY: kafka_codec.has_snappy(),
        Compression.LZ4: kafka_codec.has_lz4(),
        Compression.ZSTD: kafka_codec.has_zstd(),
    }
    return [codec for codec, present in available.items() if present]


CLIENT_BATCHES = [
    *[("aiokafka", AiokafkaBuilder, codec) for codec in Compression],
    *[("kafka-python", KafkaPythonBuilder, codec) for codec in kafka_python_codecs()],
]


@pytest.mark.parametrize(
    ("library", "builder", "codec"),
    CLIENT_BATCHES,
    ids=[f"{lib}-{Compression(codec).name.lower()}" for lib, _, codec in CLIENT_BATCHES],
)
def test_batches_from_client_libraries(library: str, builder: type, codec: int) -> None:
    data = client_batch(builder, codec, producer_id=4000, producer_epoch=3, base_sequence=17)
    [view] = validate_batches(data, max_batch_bytes=1 << 20)
    assert view.compression == codec
    assert view.magic == 2
    assert view.size == len(data)
    assert view.base_offset == 0
    assert view.partition_leader_epoch in (-1, 0)
    assert view.record_count == len(RECORDS)
    assert view.last_offset_delta == len(RECORDS) - 1
    assert view.base_timestamp == T0 + 50  # the first record's, as Java does
    assert view.max_timestamp == T0 + 100
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (4000, 3, 17)
    assert view.timestamp_type == 0
    assert not view.is_transactional
    assert not view.is_control
    assert view.crc_valid
    assert list(iter_records(view)) == expected_records(RECORDS)


@pytest.mark.parametrize("codec", list(Compression))
def test_build_batch_matches_a_client_library(codec: int) -> None:
    ours = build_batch(RECORDS, compression=codec)
    theirs = client_batch(AiokafkaBuilder, codec)
    [ours_view] = validate_batches(ours)
    [their_view] = validate_batches(theirs)
    assert list(iter_records(ours_view)) == list(iter_records(their_view))
    if codec == Compression.NONE:
        assert ours == theirs  # byte for byte, CRC included


# (build_batch keyword arguments, expected view properties)
BUILT = [
    ({}, {"producer_id": -1, "producer_epoch": -1, "base_sequence": -1, "attributes": 0}),
    (
        {"producer_id": 9, "producer_epoch": 2, "base_sequence": 100},
        {"producer_id": 9, "producer_epoch": 2, "base_sequence": 100, "has_producer_id": True},
    ),
    (
        {"producer_id": 9, "producer_epoch": 2, "base_sequence": 0, "transactional": True},
        {"is_transactional": True, "is_control": False, "attributes": 0x10},
    ),
    ({"compression": Compression.ZSTD}, {"compression": 4, "attributes": 4}),
    (
        {"base_offset": 1234, "partition_leader_epoch": 7},
        {"base_offset": 1234, "partition_leader_epoch": 7, "last_offset": 1234 + 5},
    ),
    (
        {"log_append_time": T0 + 999},
        {"timestamp_type": 1, "max_timestamp": T0 + 999, "attributes": 0x08},
    ),
]


@pytest.mark.parametrize(("options", "expected"), BUILT)
def test_build_batch_fields(options: dict[str, int], expected: dict[str, object]) -> None:
    data = build_batch(RECORDS, **options)  # type: ignore[arg-type]
    [view] = iter_batches(data)
    assert view.crc_valid
    assert view.record_count == 6
    for name, value in expected.items():
        assert getattr(view, name) == value, name


def test_log_append_time_gives_every_record_the_batch_time() -> None:
    data = build_batch(RECORDS, log_append_time=T0 + 999)
    [view] = iter_batches(data)
    assert {record.timestamp for record in iter_records(view)} == {T0 + 999}


def test_set_log_append_time_rewrites_in_place() -> None:
    buffer = bytearray(client_batch(AiokafkaBuilder, Compression.LZ4))
    set_log_append_time(buffer, 0, T0 + 12345)
    [view] = validate_batches(bytes(buffer))
    assert view.timestamp_type == 1
    assert view.compression == Compression.LZ4
    assert [r.timestamp for r in iter_records(view)] == [T0 + 12345] * len(RECORDS)


# The header bytes a LOG_APPEND_TIME rewrite may change: crc, attributes, maxTimestamp.
REWRITTEN = {*range(17, 23), *range(35, 43)}


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: Compression(c).name.lower())
def test_with_log_append_time_rewrites_the_header_of_a_copy(codec: int) -> None:
    original = build_batch(
        RECORDS,
        compression=codec,
        producer_id=4000,
        producer_epoch=3,
        base_sequence=17,
        transactional=True,
    )
    source = bytearray(original)  # writable, as a copy would be
    [view] = validate_batches(source)
    stamped = with_log_append_time(view, T0 + 12345)

    assert stamped.attributes == view.attributes | 0x08  # compression and transactional kept
    assert (stamped.timestamp_type, stamped.compression) == (1, codec)
    assert stamped.is_transactional
    assert stamped.max_timestamp == T0 + 12345
    assert stamped.base_timestamp == view.base_timestamp == T0 + 50
    assert stamped.crc_valid and stamped.crc != view.crc
    [checked] = validate_batches(bytes(stamped.data))
    assert checked.timestamp_type == 1
    # Only the crc, attributes and maxTimestamp change; the records are the same bytes.
    assert len(stamped.data) == len(original)
    changed = {i for i in range(HEADER_SIZE) if stamped.data[i] != original[i]}
    assert changed <= REWRITTEN, sorted(changed)
    assert bytes(stamped.records_data) == original[HEADER_SIZE:]
    assert source == original  # the batch it was given is left alone
    records = list(iter_records(stamped))
    assert records == [
        Record(r.offset_delta, T0 + 12345, r.key, r.value, r.headers)
        for r in expected_records(RECORDS)
    ]


def test_control_batch() -> None:
    key, value = end_txn_marker(commit=True, coordinator_epoch=5)
    data = build_batch(
        [(key, value, [], T0)],
        producer_id=77,
        producer_epoch=1,
        transactional=True,
        control=True,
    )
    [view] = validate_batches(data, from_client=False)
    assert view.is_control and view.is_transactional
    [record] = iter_records(view)
    assert control_record_type(record.key) is ControlRecordType.COMMIT
    assert record.value == struct.pack(">hi", 0, 5)
    abort_key, _ = end_txn_marker(commit=False, coordinator_epoch=5)
    assert control_record_type(abort_key) is ControlRecordType.ABORT
    assert control_record_type(None) is None
    assert control_record_type(b"\x00") is None


def test_header_key_not_utf8_is_read_as_kafka_reads_it() -> None:
    """DefaultRecord.readHeaders reads a key with new String(bytes, UTF_8), which
    replaces malformed bytes with U+FFFD: such a record is no corrupt one."""
    data = bytearray(build_batch([(b"k", b"v", [("h\u00e9", b"x")], T0)]))
    at = data.index("h\u00e9".encode())
    data[at + 1 : at + 3] = b"\xff\xa9"
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    [view] = validate_batches(bytes(data), from_client=True)
    [record] = iter_records(view)
    assert record.headers == (("h\ufffd\ufffd", b"x"),)
    assert (record.key, record.value) == (b"k", b"v")


def test_build_batch_needs_a_record() -> None:
    with pytest.raises(ValueError):
        build_batch([])


# --- validation ------------------------------------------------------------


def tampered(data: bytes, offset: int, fmt: str, value: int, *, fix_crc: bool = True) -> bytes:
    """``data`` with one header field replaced, CRC recomputed unless told not to."""
    buffer = bytearray(data)
    struct.pack_into(fmt, buffer, offset, value)
    if fix_crc:
        struct.pack_into(">I", buffer, 17, crc32c.crc32c(bytes(buffer[21:])))
    return bytes(buffer)


GOOD = build_batch(RECORDS[:3], producer_id=5, producer_epoch=0, base_sequence=0)
GOOD_LAST_DELTA = 2

# (name, data, max_batch_bytes, expected error code)
INVALID = [
    ("empty", b"", None, ErrorCode.invalid_record),
    ("eleven bytes", GOOD[:11], None, ErrorCode.corrupt_message),
    ("sixteen bytes", GOOD[:16], None, ErrorCode.corrupt_message),
    ("truncated header", GOOD[:40], None, ErrorCode.corrupt_message),
    ("truncated records", GOOD[:-1], None, ErrorCode.corrupt_message),
    ("truncated second batch", GOOD + GOOD[:70], None, ErrorCode.corrupt_message),
    ("batchLength 13", tampered(GOOD, 8, ">i", 13), None, ErrorCode.corrupt_message),
    ("batchLength 30", tampered(GOOD, 8, ">i", 30), None, ErrorCode.corrupt_message),
    ("batchLength past the end", tampered(GOOD, 8, ">i", 10_000), None, ErrorCode.corrupt_message),
    ("magic 3", tampered(GOOD, 16, ">b", 3), None, ErrorCode.corrupt_message),
    ("magic -1", tampered(GOOD, 16, ">b", -1), None, ErrorCode.corrupt_message),
    ("magic 1", tampered(GOOD, 16, ">b", 1), None, ErrorCode.invalid_record),
    ("magic 0", tampered(GOOD, 16, ">b", 0), None, ErrorCode.invalid_record),
    ("crc", tampered(GOOD, 17, ">I", 12345, fix_crc=False), None, ErrorCode.corrupt_message),
    ("flipped record byte", GOOD[:-2] + b"\x7f" + GOOD[-1:], None, ErrorCode.corrupt_message),
    (
        "flipped producer id",
        tampered(GOOD, 43, ">q", 6, fix_crc=False),
        None,
        ErrorCode.corrupt_message,
    ),
    ("unknown compression", tampered(GOOD, 21, ">h", 5), None, ErrorCode.invalid_record),
    (
        "baseOffset not 0",
        tampered(GOOD, 0, ">q", 10, fix_crc=False),
        None,
        ErrorCode.invalid_record,
    ),
    ("too large", GOOD, len(GOOD) - 1, ErrorCode.message_too_large),
    ("count mismatch", tampered(GOOD, 57, ">i", 2), None, ErrorCode.invalid_record),
    ("count zero", tampered(GOOD, 57, ">i", 0), None, ErrorCode.invalid_record),
    ("lastOffsetDelta -1", tampered(GOOD, 23, ">i", -1), None, ErrorCode.invalid_record),
    ("control from a client", tampered(GOOD, 21, ">h", 0x30), None, ErrorCode.invalid_record),
    ("producer id without sequence", tampered(GOOD, 53, ">i", -1), None, ErrorCode.invalid_record),
]


@pytest.mark.parametrize(
    ("name", "data", "max_batch_bytes", "code"), INVALID, ids=[case[0] for case in INVALID]
)
def test_validation_answers_what_kafka_answers(
    name: str, data: bytes, max_batch_bytes: int | None, code: ErrorCode
) -> None:
    with pytest.raises(RecordBatchError) as info:
        validate_batches(data, max_batch_bytes)
    assert info.value.error_code == code, info.value.message


def test_size_limit_is_inclusive() -> None:
    assert len(validate_batches(GOOD, len(GOOD))) == 1


def test_none_records_are_invalid() -> None:
    with pytest.raises(RecordBatchError) as info:
        validate_batches(None)
    assert info.value.error_code == ErrorCode.invalid_record


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_batches_from_a_client_library(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 16)
    builder.append(0, T0, b"key", b"value")
    builder.append(1, T0, None, b"value")
    with pytest.raises(RecordBatchError) as info:
        validate_batches(bytes(builder.build()))
    assert info.value.error_code == ErrorCode.invalid_record


def test_every_truncation_of_a_real_batch_is_refused() -> None:
    data = client_batch(AiokafkaBuilder, Compression.GZIP)
    for cut in range(1, len(data)):
        with pytest.raises(RecordBatchError) as info:
            validate_batches(data[:cut])
        assert info.value.error_code == ErrorCode.corrupt_message
        with pytest.raises(RecordBatchError):
            list(iter_batches(data[:cut]))


def test_stored_batches_skip_the_client_only_checks() -> None:
    # Compaction leaves fewer records than offsets, and offsets are assigned.
    stored = tampered(tampered(GOOD, 57, ">i", 1), 0, ">q", 500, fix_crc=False)
    [view] = validate_batches(stored, from_client=False)
    assert view.base_offset == 500
    with pytest.raises(RecordBatchError):
        validate_batches(stored)


def test_validate_accepts_memoryviews_and_keeps_positions() -> None:
    data = GOOD + GOOD
    views = validate_batches(memoryview(data), from_client=True)
    assert [v.position for v in views] == [0, len(GOOD)]
    assert bytes(views[1].data) == GOOD
    assert bytes(views[0].records_data) == GOOD[HEADER_SIZE:]


# (name, records, api_version, expected error code or None)
PRODUCE = [
    ("one batch", GOOD, 9, None),
    ("zstd at v7", build_batch(RECORDS, compression=Compression.ZSTD), 7, None),
    (
        "zstd at v6",
        build_batch(RECORDS, compression=Compression.ZSTD),
        6,
        ErrorCode.unsupported_compression_type,
    ),
    ("two batches", GOOD + GOOD, 9, ErrorCode.invalid_record),
    ("no records", None, 9, ErrorCode.invalid_record),
    ("corrupt", GOOD[:-1] + bytes([GOOD[-1] ^ 0xFF]), 3, ErrorCode.corrupt_message),
]


@pytest.mark.parametrize(
    ("name", "records", "api_version", "code"), PRODUCE, ids=[case[0] for case in PRODUCE]
)
def test_produce_records(
    name: str, records: bytes | None, api_version: int, code: ErrorCode | None
) -> None:
    if code is None:
        view = validate_produce_records(records, api_version, max_batch_bytes=1 << 20)
        assert view.size == len(records or b"")
    else:
        with pytest.raises(RecordBatchError) as info:
            validate_produce_records(records, api_version)
        assert info.value.error_code == code


# --- offsets -----------------------------------------------------------------


def test_rebase_batches_numbers_them_consecutively() -> None:
    batches = [
        build_batch(RECORDS[:1]),
        client_batch(AiokafkaBuilder, Compression.SNAPPY),
        build_batch(RECORDS[:3], compression=Compression.GZIP),
    ]
    data = b"".join(batches)
    rebased = rebase_batches(data, 1000)
    assert type(rebased) is bytes
    assert len(rebased) == len(data)
    views = validate_batches(rebased, from_client=False)
    assert [v.base_offset for v in views] == [1000, 1001, 1007]
    assert [v.next_offset for v in views] == [1001, 1007, 1010]
    assert all(v.crc_valid for v in views)
    assert all(v.partition_leader_epoch == -1 for v in views)
    # The input is untouched.
    assert [v.base_offset for v in iter_batches(data)] == [0, 0, 0]


def test_rebase_batches_can_stamp_the_leader_epoch() -> None:
    data = GOOD + GOOD
    rebased = rebase_batches(memoryview(data), 7, partition_leader_epoch=0)
    views = list(iter_batches(rebased))
    assert [(v.base_offset, v.partition_leader_epoch) for v in views] == [(7, 0), (10, 0)]
    assert all(v.crc_valid for v in views)


def test_rebase_parts_number_batches_without_copying_them() -> None:
    first = GOOD + GOOD
    second = build_batch(RECORDS[:3], compression=Compression.GZIP)
    cache = bytes(b"junk" + first + second)
    view = memoryview(cache)
    parts = rebase_parts(view[4 : 4 + len(first)], 100, partition_leader_epoch=0)
    parts += rebase_parts(view[4 + len(first) :], 500, partition_leader_epoch=0)
    # Per batch: a new head, then the rest of the batch where it is.
    assert [len(p) for p in parts[0::2]] == [16, 16, 16]
    bodies = parts[1::2]
    assert all(isinstance(p, memoryview) and p.obj is cache for p in bodies)
    out = b"".join(parts)
    views = list(iter_batches(out))
    assert [(v.base_offset, v.partition_leader_epoch) for v in views] == [
        (100, 0),
        (100 + GOOD_LAST_DELTA + 1, 0),
        (500, 0),
    ]
    assert all(v.crc_valid for v in views)
    assert out == rebase_batches(first, 100, partition_leader_epoch=0) + rebase_batches(
        second, 500, partition_leader_epoch=0
    )


def test_rebase_parts_keep_the_epoch_unless_told() -> None:
    data = bytearray(GOOD)
    struct.pack_into(">i", data, 12, 9)  # a leader epoch already set
    (head, _body) = rebase_parts(data, 40)
    assert struct.unpack(">qii", head) == (40, len(GOOD) - 12, 9)


def test_rebase_parts_check_framing_first() -> None:
    with pytest.raises(RecordBatchError):
        rebase_parts(GOOD + GOOD[:30], 0)


def test_rebase_uses_offset_deltas_not_record_counts() -> None:
    compacted = tampered(GOOD, 57, ">i", 1)  # 3 offsets, 1 record left
    views = list(iter_batches(rebase_batches(compacted + GOOD, 0)))
    assert [v.base_offset for v in views] == [0, GOOD_LAST_DELTA + 1]


def test_rebase_refuses_broken_data() -> None:
    with pytest.raises(RecordBatchError):
        rebase_batches(GOOD + GOOD[:30], 0)


def test_rebase_is_fast() -> None:
    small = build_batch([(None, b"v" * 100, [], T0)])
    data = small * 20_000
    start = time.perf_counter()
    rebased = rebase_batches(data, 0)
    elapsed = time.perf_counter() - start
    views = list(iter_batches(rebased))
    assert views[-1].base_offset == 19_999
    assert elapsed < 1.0


@pytest.mark.parametrize("kind", [bytearray, lambda b: memoryview(bytearray(b))])
def test_set_base_offset_in_place(kind: object) -> None:
    assert callable(kind)
    buffer = kind(GOOD + GOOD)
    set_base_offset(buffer, len(GOOD), 2**40)
    views = list(iter_batches(buffer))
    assert views[1].base_offset == 2**40
    assert views[0].base_offset == 0
    assert views[1].crc_valid


def test_views_read_through_to_the_buffer() -> None:
    buffer = bytearray(GOOD)
    view = RecordBatchView(buffer, 0)
    set_base_offset(buffer, 0, 55)
    assert view.base_offset == 55
    assert "base_offset=55" in repr(view)


# --- records -----------------------------------------------------------------


def test_iter_records_with_out_of_order_timestamps() -> None:
    [view] = iter_batches(build_batch(RECORDS))
    timestamps = [record.timestamp for record in iter_records(view)]
    assert timestamps == [T0 + 50, T0, T0 + 100, T0 - 30, T0 + 7, T0 + 100]
    assert view.max_timestamp == T0 + 100


def test_iter_records_refuses_garbage() -> None:
    # A valid header whose records section is cut short.
    data = bytearray(build_batch(RECORDS[:2]))
    del data[-5:]
    struct.pack_into(">i", data, 8, len(data) - 12)
    [view] = iter_batches(bytes(data))
    with pytest.raises(RecordBatchError) as info:
        list(iter_records(view))
    assert info.value.error_code == ErrorCode.corrupt_message


def test_iter_records_refuses_a_wrong_record_length() -> None:
    data = bytearray(build_batch(RECORDS[:1]))
    data[HEADER_SIZE] += 2  # the first record claims two more bytes
    [view] = iter_batches(bytes(data))
    with pytest.raises(RecordBatchError):
        list(iter_records(view))


def test_iter_records_of_corrupt_compressed_data() -> None:
    data = bytearray(build_batch(RECORDS, compression=Compression.LZ4))
    data[HEADER_SIZE + 10 : HEADER_SIZE + 30] = b"\x00" * 20
    [view] = iter_batches(bytes(data))
    with pytest.raises(RecordBatchError) as info:
        list(iter_records(view))
    assert info.value.error_code == ErrorCode.corrupt_message


def test_iter_batches_refuses_non_v2_data() -> None:
    with pytest.raises(RecordBatchError):
        list(iter_batches(tampered(GOOD, 16, ">b", 1)))
    assert list(iter_batches(b"")) == []
