"""Kafka record batches (magic 2): zero-copy header views, validation, rebasing.

Layout of the 61-byte header, big-endian (offset: field)::

    0 baseOffset int64          27 baseTimestamp int64
    8 batchLength int32         35 maxTimestamp int64
   12 partitionLeaderEpoch i32  43 producerId int64
   16 magic int8                51 producerEpoch int16
   17 crc uint32                53 baseSequence int32
   21 attributes int16          57 recordCount int32
   23 lastOffsetDelta int32     61 records...

Rules:

- A batch occupies ``12 + batchLength`` bytes. The CRC32C covers attributes
  to the end of the batch, so baseOffset, batchLength and the leader epoch can
  be rewritten without recomputing it (``set_base_offset``, ``rebase_parts``).
  Stamping a batch LOG_APPEND_TIME changes attributes and maxTimestamp, and so
  the CRC (``set_log_append_time`` in place, ``with_log_append_time`` on a copy).
  A batch takes ``lastOffsetDelta + 1`` offsets.
- Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
  4 zstd), bit 3 timestamp type (1 = LOG_APPEND_TIME), bit 4 transactional,
  bit 5 control, bit 6 delete horizon. With bit 6 set (only the log cleaner
  sets it), baseTimestamp holds the delete horizon instead of the first
  record's timestamp, and the records' deltas were written against it.
- The hot path (``RecordBatchView``, ``iter_batches``, ``validate_batches``,
  ``rebase_parts``) reads headers only and never decodes or decompresses
  records. ``iter_records`` and ``build_batch`` do, for tools, tests and
  lookups by timestamp.
- ``validate_batches`` answers what Apache Kafka answers (``KafkaApis``
  handleProduceRequest, ``ProduceRequest.validateRecords``,
  ``ByteBufferLogInputStream``, ``UnifiedLog.analyzeAndValidateRecords``,
  ``LogValidator.validateBatch``), checking in the same order:

  ======================================================  =========================
  check                                                    error code
  ======================================================  =========================
  no batch at all                                          INVALID_RECORD
  batchLength < 14, magic not 0..2, truncated batch        CORRUPT_MESSAGE
  magic 0 or 1 (produce v3+ takes magic 2 only)            INVALID_RECORD
  batchLength < 49 (shorter than a v2 header)              CORRUPT_MESSAGE
  compression id over 4                                    INVALID_RECORD (*)
  client batch with baseOffset != 0                        INVALID_RECORD
  batch larger than max_batch_bytes                        MESSAGE_TOO_LARGE
  CRC32C mismatch                                          CORRUPT_MESSAGE
  client batch: lastOffsetDelta < 0, recordCount <= 0,
  recordCount != lastOffsetDelta + 1                       INVALID_RECORD
  client batch: control bit set                            INVALID_RECORD
  client batch: producerId >= 0 and baseSequence < 0       INVALID_RECORD
  ======================================================  =========================

  (*) Kafka fails such a request with UNKNOWN_SERVER_ERROR; the producer's
  batch is at fault, so we say so. Kafka silently drops a truncated *trailing*
  batch; we store batches byte for byte and so refuse them instead.
  ``validate_produce_records`` adds the per-partition produce rules: exactly
  one batch, and no zstd before Produce v7 (UNSUPPORTED_COMPRESSION_TYPE).
  The count checks apply to client batches only: compaction legitimately
  leaves batches with fewer records than offsets.
- Record timestamps are absolute milliseconds: ``baseTimestamp + delta``, or
  ``maxTimestamp`` for every record of a LOG_APPEND_TIME batch.
- The log cleaner's batches (``rebuild_batch``, ``empty_batch``) keep their
  baseOffset and lastOffsetDelta, so a batch keeps its offsets, and its
  producer's last sequence, whatever records go. An empty batch is a header
  with recordCount 0, as Kafka's cleaner writes to keep a producer's last
  batch or the log's next offset: ``iter_batches``, ``iter_records`` and
  ``validate_batches(from_client=False)`` take it; a client's is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

import crc32c
from kio.schema.errors import ErrorCode

from .compression import Compression, compress, decompress
from .errors import RecordBatchError

__all__ = [
    "CREATE_TIME",
    "HEADER_SIZE",
    "LOG_APPEND_TIME",
    "LOG_OVERHEAD",
    "NO_TIMESTAMP",
    "ControlRecordType",
    "Record",
    "RecordBatchError",
    "RecordBatchView",
    "RecordHeader",
    "RecordSpec",
    "build_batch",
    "control_record_type",
    "empty_batch",
    "end_txn_marker",
    "iter_batches",
    "iter_records",
    "rebase_batches",
    "numbered_parts",
    "rebase_parts",
    "rebuild_batch",
    "set_base_offset",
    "set_log_append_time",
    "validate_batches",
    "validate_produce_records",
    "with_log_append_time",
]

BytesLike: TypeAlias = bytes | bytearray | memoryview

LOG_OVERHEAD = 12
"""baseOffset + batchLength: the bytes not counted by batchLength."""
HEADER_SIZE = 61
"""Size of a magic 2 batch header; records follow it."""

_MIN_LEGACY_SIZE = 14  # LegacyRecord.RECORD_OVERHEAD_V0: Kafka's smallest batchLength
_MAGIC_V2 = 2
_CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_DELETE_HORIZON_MASK = 0x40  # Kafka's DELETE_HORIZON_FLAG_MASK
_KEPT_ATTRIBUTES = _COMPRESSION_MASK | _TIMESTAMP_TYPE_MASK | _TRANSACTIONAL_MASK | _CONTROL_MASK

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1
"""Kafka's RecordBatch.NO_TIMESTAMP: the baseTimestamp of an empty batch."""


def _bytes_view(data: BytesLike) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class RecordBatchView:
    """A view of one magic 2 batch header at ``position`` in ``buffer``.

    Every property reads the buffer when asked: nothing is copied, and a
    rewrite of the buffer (``set_base_offset``) shows at once. The
    constructor checks nothing; ``iter_batches`` and ``validate_batches``
    make views only over complete, well-framed batches.
    """

    __slots__ = ("_buffer", "_position")

    def __init__(self, buffer: BytesLike, position: int = 0) -> None:
        self._buffer = buffer
        self._position = position

    def __repr__(self) -> str:
        return (
            f"RecordBatchView(position={self._position}, base_offset={self.base_offset}, "
            f"size={self.size}, record_count={self.record_count}, "
            f"compression={self.compression}, producer_id={self.producer_id})"
        )

    @property
    def buffer(self) -> BytesLike:
        return self._buffer

    @property
    def position(self) -> int:
        """Where this batch starts in ``buffer``."""
        return self._position

    @property
    def base_offset(self) -> int:
        return int(_I64.unpack_from(self._buffer, self._position)[0])

    @property
    def batch_length(self) -> int:
        return int(_I32.unpack_from(self._buffer, self._position + 8)[0])

    @property
    def size(self) -> int:
        """Bytes this batch occupies: ``12 + batch_length``."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def partition_leader_epoch(self) -> int:
        return int(_I32.unpack_from(self._buffer, self._position + 12)[0])

    @property
    def magic(self) -> int:
        return int(_I8.unpack_from(self._buffer, self._position + 16)[0])

    @property
    def crc(self) -> int:
        return int(_U32.unpack_from(self._buffer, self._position + 17)[0])

    @property
    def attributes(self) -> int:
        return int(_I16.unpack_from(self._buffer, self._position + 21)[0])

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CREATE_TIME, 1 LOG_APPEND_TIME."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def last_offset_delta(self) -> int:
        return int(_I32.unpack_from(self._buffer, self._position + 23)[0])

    @property
    def base_timestamp(self) -> int:
        return int(_I64.unpack_from(self._buffer, self._position + 27)[0])

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the cleaner may drop this batch's tombstones, or the batch if it is a
        transaction marker (ms); None until a cleaning pass sets it (bit 6)."""
        if self.attributes & _DELETE_HORIZON_MASK:
            return self.base_timestamp
        return None

    @property
    def max_timestamp(self) -> int:
        return int(_I64.unpack_from(self._buffer, self._position + 35)[0])

    @property
    def producer_id(self) -> int:
        return int(_I64.unpack_from(self._buffer, self._position + 43)[0])

    @property
    def producer_epoch(self) -> int:
        return int(_I16.unpack_from(self._buffer, self._position + 51)[0])

    @property
    def base_sequence(self) -> int:
        return int(_I32.unpack_from(self._buffer, self._position + 53)[0])

    @property
    def record_count(self) -> int:
        return int(_I32.unpack_from(self._buffer, self._position + 57)[0])

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def offset_count(self) -> int:
        """Offsets this batch takes: ``last_offset_delta + 1``."""
        return self.last_offset_delta + 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def data(self) -> memoryview:
        """The whole batch, without copying."""
        return _bytes_view(self._buffer)[self._position : self._position + self.size]

    @property
    def records_data(self) -> memoryview:
        """The (possibly compressed) records after the header, without copying."""
        return _bytes_view(self._buffer)[self._position + HEADER_SIZE : self._position + self.size]

    def compute_crc(self) -> int:
        """CRC32C over attributes to the end of the batch."""
        start = self._position + _CRC_START
        with _bytes_view(self._buffer) as view:
            return int(crc32c.crc32c(view[start : self._position + self.size]))

    @property
    def crc_valid(self) -> bool:
        return self.compute_crc() == self.crc


def _corrupt(message: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.corrupt_message, message)


def _invalid(message: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.invalid_record, message)


def iter_batches(data: BytesLike) -> Iterator[RecordBatchView]:
    """Yield a view of each batch in concatenated, trusted batches.

    Checks framing only (complete header and body, magic 2), not CRCs.

    :raises RecordBatchError: CORRUPT_MESSAGE on truncated or non-v2 data.
    """
    if isinstance(data, memoryview):
        data = _bytes_view(data)
    end = len(data)
    position = 0
    while position < end:
        remaining = end - position
        if remaining < HEADER_SIZE:
            raise _corrupt(f"{remaining} bytes at position {position} are not a batch header")
        (batch_length,) = _I32.unpack_from(data, position + 8)
        size = LOG_OVERHEAD + batch_length
        if size < HEADER_SIZE:
            raise _corrupt(f"batch at position {position} has batchLength {batch_length}")
        if size > remaining:
            raise _corrupt(
                f"batch at position {position} needs {size} bytes, only {remaining} remain"
            )
        (magic,) = _I8.unpack_from(data, position + 16)
        if magic != _MAGIC_V2:
            raise _corrupt(f"batch at position {position} has magic {magic}, not 2")
        yield RecordBatchView(data, position)
        position += size


def validate_batches(
    data: BytesLike | None,
    max_batch_bytes: int | None = None,
    *,
    from_client: bool = True,
) -> list[RecordBatchView]:
    """Check concatenated batches as Apache Kafka checks an append; return views.

    ``from_client`` adds the checks Kafka applies to batches from producers
    (baseOffset 0, consistent counts, no control batches, sequences set when
    a producer id is). See the module docstring for the table of checks.

    :raises RecordBatchError: carrying the error code Kafka would answer.
    """
    if not data:
        raise _invalid("produce data has no record batch")
    buffer = _bytes_view(data) if isinstance(data, memoryview) else data
    with _bytes_view(data) as view:  # for slicing without copies
        return _validate(buffer, view, max_batch_bytes, from_client)


def _validate(
    buffer: BytesLike, view: memoryview, max_batch_bytes: int | None, from_client: bool
) -> list[RecordBatchView]:
    end = len(view)
    batches: list[RecordBatchView] = []
    position = 0
    while position < end:
        remaining = end - position
        if remaining < 17:
            raise _corrupt(f"{remaining} trailing bytes at position {position} are not a batch")
        (batch_length,) = _I32.unpack_from(buffer, position + 8)
        if batch_length < _MIN_LEGACY_SIZE:
            raise _corrupt(
                f"batch at position {position} has batchLength {batch_length}, "
                f"under the minimum of {_MIN_LEGACY_SIZE}"
            )
        (magic,) = _I8.unpack_from(buffer, position + 16)
        if magic < 0 or magic > _MAGIC_V2:
            raise _corrupt(f"batch at position {position} has invalid magic {magic}")
        size = LOG_OVERHEAD + batch_length
        if size > remaining:
            raise _corrupt(
                f"batch at position {position} is truncated: {size} bytes announced, "
                f"{remaining} present"
            )
        if magic != _MAGIC_V2:
            raise _invalid(
                f"batch at position {position} has magic {magic}; "
                "produce requests v3+ only take record batches with magic 2"
            )
        if size < HEADER_SIZE:
            raise _corrupt(f"batch at position {position} has {size} bytes, fewer than a v2 header")
        batch = RecordBatchView(buffer, position)
        (
            base_offset,
            _length,
            _epoch,
            _magic,
            crc,
            attributes,
            last_offset_delta,
            _base_timestamp,
            _max_timestamp,
            producer_id,
            _producer_epoch,
            base_sequence,
            record_count,
        ) = _HEADER.unpack_from(buffer, position)
        if attributes & _COMPRESSION_MASK > Compression.ZSTD:
            raise _invalid(
                f"batch at position {position} uses unknown compression "
                f"{attributes & _COMPRESSION_MASK}"
            )
        if from_client and base_offset != 0:
            raise _invalid(f"batch at position {position} has baseOffset {base_offset}, not 0")
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise RecordBatchError(
                ErrorCode.message_too_large,
                f"batch at position {position} has {size} bytes, over the limit of "
                f"{max_batch_bytes}",
            )
        computed = crc32c.crc32c(view[position + _CRC_START : position + size])
        if computed != crc:
            raise _corrupt(
                f"batch at position {position} is corrupt (stored crc {crc}, computed {computed})"
            )
        if from_client:
            if last_offset_delta < 0:
                raise _invalid(
                    f"batch at position {position} has lastOffsetDelta {last_offset_delta}"
                )
            if record_count <= 0:
                raise _invalid(f"batch at position {position} has recordCount {record_count}")
            if record_count != last_offset_delta + 1:
                raise _invalid(
                    f"batch at position {position} has recordCount {record_count} but "
                    f"lastOffsetDelta {last_offset_delta}"
                )
            if attributes & _CONTROL_MASK:
                raise _invalid("clients are not allowed to write control batches")
            if producer_id >= 0 and base_sequence < 0:
                raise _invalid(
                    f"batch at position {position} has producerId {producer_id} "
                    f"but baseSequence {base_sequence}"
                )
        batches.append(batch)
        position += size
    return batches


def validate_produce_records(
    records: BytesLike | None,
    api_version: int,
    max_batch_bytes: int | None = None,
) -> RecordBatchView:
    """Validate one partition's records of a Produce request; return its batch.

    Adds Kafka's Produce rules to ``validate_batches``: exactly one batch per
    partition, and zstd only from Produce v7.

    :raises RecordBatchError: carrying the error code Kafka would answer.
    """
    batches = validate_batches(records, max_batch_bytes)
    batch = batches[0]
    if api_version < 7 and batch.compression == Compression.ZSTD:
        raise RecordBatchError(
            ErrorCode.unsupported_compression_type,
            f"produce requests v{api_version} may not use zstd compression",
        )
    if len(batches) != 1:
        raise _invalid(
            f"produce requests v{api_version} take exactly one record batch per "
            f"partition, not {len(batches)}"
        )
    return batch


def set_base_offset(buffer: bytearray | memoryview, position: int, offset: int) -> None:
    """Rewrite the baseOffset of the batch at ``position``, in place.

    The CRC does not cover baseOffset, so it stays valid.
    """
    _I64.pack_into(buffer, position, offset)


def set_log_append_time(buffer: bytearray | memoryview, position: int, timestamp: int) -> None:
    """Turn the batch at ``position`` into a LOG_APPEND_TIME batch stamped
    ``timestamp`` (ms), as Kafka's LogValidator does, and recompute its CRC.

    Its records then all read as ``timestamp``; their bytes are untouched.
    """
    batch = RecordBatchView(buffer, position)
    _I16.pack_into(buffer, position + 21, batch.attributes | _TIMESTAMP_TYPE_MASK)
    _I64.pack_into(buffer, position + 35, timestamp)
    _U32.pack_into(buffer, position + 17, batch.compute_crc())


def with_log_append_time(batch: RecordBatchView, timestamp: int) -> RecordBatchView:
    """A copy of ``batch`` made a LOG_APPEND_TIME batch stamped ``timestamp`` (ms), as
    Kafka's LogValidator stamps a batch for a topic with message.timestamp.type
    LogAppendTime; ``batch`` itself is left alone.

    Only the header changes (attributes, maxTimestamp, CRC): Kafka rewrites neither
    the records' timestamp deltas nor compressed records, since readers give every
    record of such a batch its maxTimestamp.
    """
    buffer = bytearray(batch.data)
    set_log_append_time(buffer, 0, timestamp)
    return RecordBatchView(buffer)


def rebase_batches(
    data: BytesLike,
    first_offset: int,
    *,
    partition_leader_epoch: int | None = None,
) -> bytes:
    """Return a copy of ``data`` whose batches are numbered from ``first_offset``.

    Each batch takes ``last_offset_delta + 1`` offsets. With
    ``partition_leader_epoch``, that epoch is written into every batch too
    (also outside the CRC). See ``rebase_parts`` for the form without a copy.

    :raises RecordBatchError: CORRUPT_MESSAGE if ``data`` is not well framed.
    """
    return b"".join(rebase_parts(data, first_offset, partition_leader_epoch=partition_leader_epoch))


_HEAD = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch


def rebase_parts(
    data: BytesLike,
    first_offset: int,
    *,
    partition_leader_epoch: int | None = None,
) -> list[bytes | memoryview]:
    """``data``'s batches numbered from ``first_offset``, without copying them: the
    ``numbered_parts`` of each batch, in order. Written out, the parts are the batches,
    numbered. Framing is checked (``iter_batches``) before any part is made.

    :raises RecordBatchError: CORRUPT_MESSAGE if ``data`` is not well framed.
    """
    batches = list(iter_batches(data))
    parts: list[bytes | memoryview] = []
    offset = first_offset
    for batch in batches:
        parts += numbered_parts(batch, offset, partition_leader_epoch)
        offset += batch.last_offset_delta + 1
    return parts


def numbered_parts(
    batch: RecordBatchView, base_offset: int, partition_leader_epoch: int | None = None
) -> tuple[bytes, memoryview]:
    """One batch as a new 16-byte head (baseOffset, batchLength, partitionLeaderEpoch,
    the epoch kept unless given) and a view of the rest of it, which must stay unchanged
    while the view is in use. The fields rewritten are outside the CRC, so it stays valid.
    """
    view = _bytes_view(batch.buffer)
    at = batch.position
    _base_offset, batch_length, epoch = _HEAD.unpack_from(view, at)
    if partition_leader_epoch is not None:
        epoch = partition_leader_epoch
    head = _HEAD.pack(base_offset, batch_length, epoch)
    return head, view[at + _HEAD.size : at + LOG_OVERHEAD + batch_length]


# --- records: decoding and building (off the hot path) ---------------------

RecordHeader: TypeAlias = tuple[str, bytes | None]
"""A record header: a UTF-8 key and a nullable value."""

RecordSpec: TypeAlias = tuple[bytes | None, bytes | None, Sequence[RecordHeader], int]
"""What ``build_batch`` takes per record: key, value, headers, timestamp (ms)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record. ``timestamp`` is absolute, in milliseconds."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[RecordHeader, ...] = ()


class ControlRecordType(IntEnum):
    """The ``type`` in a control record's key."""

    ABORT = 0
    COMMIT = 1


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """Read a zigzag varint/varlong; return the value and the next position."""
    raw = 0
    shift = 0
    while True:
        byte = data[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
        if shift > 63:
            raise _corrupt("record varint is longer than 10 bytes")


def _read_nullable(data: bytes, position: int) -> tuple[bytes | None, int]:
    length, position = _read_varint(data, position)
    if length < 0:
        return None, position
    end = position + length
    if end > len(data):
        raise _corrupt("record field runs past the end of the batch")
    return data[position:end], end


def iter_records(batch: RecordBatchView) -> Iterator[Record]:
    """Decode the records of one batch, decompressing them if needed.

    :raises RecordBatchError: CORRUPT_MESSAGE if the records do not parse.
    """
    payload = batch.records_data
    if batch.compression == Compression.NONE:
        data = bytes(payload)
    else:
        data = decompress(batch.compression, payload)
    base_timestamp = batch.base_timestamp
    log_append_time = batch.max_timestamp if batch.timestamp_type == LOG_APPEND_TIME else None
    position = 0
    try:
        for _ in range(batch.record_count):
            length, position = _read_varint(data, position)
            start = position
            end = position + length
            if length < 0 or end > len(data):
                raise _corrupt(f"record of {length} bytes runs past the end of the batch")
            position += 1  # attributes: unused
            timestamp_delta, position = _read_varint(data, position)
            offset_delta, position = _read_varint(data, position)
            key, position = _read_nullable(data, position)
            value, position = _read_nullable(data, position)
            header_count, position = _read_varint(data, position)
            if header_count < 0:
                raise _corrupt(f"record has {header_count} headers")
            headers: list[RecordHeader] = []
            for _ in range(header_count):
                raw_key, position = _read_nullable(data, position)
                if raw_key is None:
                    raise _corrupt("record header has a null key")
                header_value, position = _read_nullable(data, position)
                # Kafka reads a header key with new String(bytes, UTF_8), which
                # replaces what is not UTF-8: such a record is no corrupt one there.
                headers.append((raw_key.decode("utf-8", "replace"), header_value))
            if position != end:
                raise _corrupt(
                    f"record is {length} bytes long but its fields take {position - start}"
                )
            timestamp = (
                base_timestamp + timestamp_delta if log_append_time is None else log_append_time
            )
            yield Record(offset_delta, timestamp, key, value, tuple(headers))
    except IndexError:
        raise _corrupt("records end in the middle of a record") from None


def _write_varint(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _write_nullable(out: bytearray, value: bytes | None) -> None:
    if value is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(value))
        out += value


def _encode_records(
    records: Iterable[tuple[int, int, bytes | None, bytes | None, Sequence[RecordHeader]]],
) -> bytearray:
    """The uncompressed records section from (offset delta, timestamp delta, key, value,
    headers) of each record."""
    body = bytearray()
    for offset_delta, timestamp_delta, key, value, headers in records:
        record = bytearray(b"\x00")  # attributes
        _write_varint(record, timestamp_delta)
        _write_varint(record, offset_delta)
        _write_nullable(record, key)
        _write_nullable(record, value)
        _write_varint(record, len(headers))
        for header_key, header_value in headers:
            _write_nullable(record, header_key.encode())
            _write_nullable(record, header_value)
        _write_varint(body, len(record))
        body += record
    return body


def _write_batch(
    payload: bytes,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    """A magic 2 batch of ``payload`` (records as stored) with the header given and its CRC."""
    batch = bytearray(HEADER_SIZE)
    batch += payload
    _HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD,
        partition_leader_epoch,
        _MAGIC_V2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    _U32.pack_into(batch, 17, crc32c.crc32c(memoryview(batch)[_CRC_START:]))
    return bytes(batch)


def build_batch(
    records: Sequence[RecordSpec],
    *,
    base_offset: int = 0,
    compression: int = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    partition_leader_epoch: int = -1,
    log_append_time: int | None = None,
) -> bytes:
    """Build one valid magic 2 batch with a correct CRC.

    Records take offset deltas 0, 1, 2...; baseTimestamp is the first
    record's timestamp (as the Java client does), so deltas may be negative.
    With ``log_append_time`` the batch is a LOG_APPEND_TIME batch whose
    maxTimestamp is that time.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    base_timestamp = records[0][3]
    body = _encode_records(
        (offset_delta, timestamp - base_timestamp, key, value, headers)
        for offset_delta, (key, value, headers, timestamp) in enumerate(records)
    )
    payload = compress(compression, body) if compression != Compression.NONE else bytes(body)
    attributes = compression & _COMPRESSION_MASK
    if transactional:
        attributes |= _TRANSACTIONAL_MASK
    if control:
        attributes |= _CONTROL_MASK
    if log_append_time is None:
        max_timestamp = max(record[3] for record in records)
    else:
        attributes |= _TIMESTAMP_TYPE_MASK
        max_timestamp = log_append_time
    return _write_batch(
        payload,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=len(records) - 1,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=len(records),
    )


def rebuild_batch(
    batch: RecordBatchView, records: Sequence[Record], *, delete_horizon_ms: int | None = None
) -> bytes:
    """``batch`` holding only ``records`` (some of its own, in order), as Kafka's cleaner
    rebuilds a batch it removed records from (MemoryRecords.filterTo).

    Kept from ``batch``: baseOffset and lastOffsetDelta (so its offsets and its last
    sequence stay, even when its last records go), the leader epoch, codec (records
    compressed again with it), timestamp type, producer id, epoch and base sequence, and
    the transactional and control flags. Each record keeps its offset delta, key, value,
    headers and timestamp. With ``delete_horizon_ms`` the batch carries that horizon
    (bit 6, in baseTimestamp); without, baseTimestamp is the first record's timestamp.
    maxTimestamp is ``batch``'s for LOG_APPEND_TIME, else the latest record's.

    :raises ValueError: no records (see ``empty_batch``), or offset deltas that are not
        increasing within ``batch``'s (the caller's fault).
    """
    if not records:
        raise ValueError("a rebuilt batch keeps at least one record; use empty_batch")
    previous = -1
    for record in records:
        if not previous < record.offset_delta <= batch.last_offset_delta:
            raise ValueError(
                f"offset delta {record.offset_delta} does not follow {previous} within a "
                f"batch of last offset delta {batch.last_offset_delta}"
            )
        previous = record.offset_delta
    attributes = batch.attributes & _KEPT_ATTRIBUTES
    if delete_horizon_ms is None:
        base_timestamp = records[0].timestamp
    else:
        attributes |= _DELETE_HORIZON_MASK
        base_timestamp = delete_horizon_ms
    if batch.timestamp_type == LOG_APPEND_TIME:
        max_timestamp = batch.max_timestamp
    else:
        max_timestamp = max(record.timestamp for record in records)
    body = _encode_records(
        (r.offset_delta, r.timestamp - base_timestamp, r.key, r.value, r.headers) for r in records
    )
    codec = batch.compression
    payload = compress(codec, body) if codec != Compression.NONE else bytes(body)
    return _write_batch(
        payload,
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=batch.last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        record_count=len(records),
    )


def empty_batch(batch: RecordBatchView) -> bytes:
    """``batch`` with no records left: a 61-byte header, as Kafka's cleaner writes one
    (DefaultRecordBatch.writeEmptyHeader) to keep a producer's last batch, for its
    epoch and last sequence, or the log's next offset.

    Same baseOffset, lastOffsetDelta, leader epoch, producer id, epoch, base sequence,
    timestamp type and transactional and control flags; no compression; maxTimestamp is
    ``batch``'s, baseTimestamp NO_TIMESTAMP and no delete horizon, as Kafka writes it
    (with no records left, no horizon has anything to delete).
    """
    return _write_batch(
        b"",
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=batch.attributes & (_KEPT_ATTRIBUTES & ~_COMPRESSION_MASK),
        last_offset_delta=batch.last_offset_delta,
        base_timestamp=NO_TIMESTAMP,
        max_timestamp=batch.max_timestamp,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        record_count=0,
    )


_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


def end_txn_marker(commit: bool, coordinator_epoch: int) -> tuple[bytes, bytes]:
    """Key and value of the control record that commits or aborts a
    transaction (control key v0, EndTxnMarker v0); put it in a
    ``build_batch(..., control=True, transactional=True)`` batch."""
    kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return _CONTROL_KEY.pack(0, kind), _END_TXN_MARKER.pack(0, coordinator_epoch)


def control_record_type(key: bytes | None) -> ControlRecordType | None:
    """The type of a control record from its key; None if it is not one we know."""
    if key is None or len(key) < _CONTROL_KEY.size:
        return None
    _version, kind = _CONTROL_KEY.unpack_from(key)
    try:
        return ControlRecordType(kind)
    except ValueError:
        return None
