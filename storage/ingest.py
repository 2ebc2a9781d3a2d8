"""The ingest-file format: one immutable object per broker flush.

Layout (integers big-endian, offsets absolute from the start of the object):

    header   b"BLIF", u16 format version (1), u16 reserved (0)             8 bytes
    chunks   per-partition chunks, back to back; a chunk is that
             partition's Kafka record batches, byte for byte
    footer   one entry per chunk, in file order:                       36 bytes each
             topic_id (16 bytes), partition i32, start u64, length u32, batch count u32
    trailer  footer length u32, crc32c(footer) u32, b"BLIF"               12 bytes

Rules:
- Batches are never decoded or re-encoded here; Kafka's own CRC covers their records.
- The footer is found from the end, so a reader fetches the trailer and footer with
  ranged GETs of the tail and never the chunks.
- The footer has a checksum: a bad index must fail loudly, not point reads astray.
- Keys are ULIDs, so listing a prefix returns files in creation order.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import crc32c

from storage.objectstore import ObjectStore

MAGIC = b"BLIF"
FORMAT_VERSION = 1

_HEADER = struct.Struct(">4sHH")
_ENTRY = struct.Struct(">16siQII")
_TRAILER = struct.Struct(">II4s")

HEADER_SIZE = _HEADER.size  # 8
ENTRY_SIZE = _ENTRY.size  # 36
TRAILER_SIZE = _TRAILER.size  # 12

_U32_MAX = 0xFFFF_FFFF


class IngestFileError(ValueError):
    """An ingest file (or the part of it that was read) is malformed or corrupt."""


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    """Where one partition's chunk sits in an ingest file."""

    topic_id: bytes  # 16 bytes (Kafka topic UUID)
    partition: int
    start: int  # absolute offset of the chunk in the file
    length: int  # bytes
    # Absolute offset of each batch; the first equals start. Empty when only the
    # footer is known (it stores the batch count, not the boundaries).
    batch_starts: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + self.length


def encode_ingest_file(
    chunks: Sequence[tuple[bytes, int, Sequence[bytes | memoryview]]],
    table: Callable[[list[ChunkLocation]], bytes] | None = None,
) -> tuple[bytes, list[ChunkLocation]]:
    """Build one ingest file from (topic_id, partition, raw batches) items.

    Returns the object and the location of every chunk, in the input order. `table`, given
    the locations, makes a block that goes between the last chunk and the footer (a
    journal object's batch table): readers of chunks never see it.
    """
    parts, locations = encode_ingest_parts(chunks, table)
    return b"".join(parts), locations


def encode_ingest_parts(
    chunks: Sequence[tuple[bytes, int, Sequence[bytes | memoryview]]],
    table: Callable[[list[ChunkLocation]], bytes] | None = None,
) -> tuple[list[bytes | memoryview], list[ChunkLocation]]:
    """encode_ingest_file's object as the pieces it is made of, in order, the batches
    among them as given (not copied): for a store that writes pieces as they are."""
    parts: list[bytes | memoryview] = [_HEADER.pack(MAGIC, FORMAT_VERSION, 0)]
    entries: list[bytes] = []
    locations: list[ChunkLocation] = []
    position = HEADER_SIZE
    for topic_id, partition, batches in chunks:
        if len(topic_id) != 16:
            raise ValueError(f"topic_id must be 16 bytes, got {len(topic_id)}")
        if not batches:
            raise ValueError(f"chunk for partition {partition} has no batches")
        start = position
        starts: list[int] = []
        for batch in batches:
            starts.append(position)
            position += len(batch)
        length = position - start
        if length > _U32_MAX or len(batches) > _U32_MAX:
            raise ValueError(f"chunk for partition {partition} is too large ({length} bytes)")
        parts.extend(batches)
        entries.append(_ENTRY.pack(topic_id, partition, start, length, len(batches)))
        locations.append(ChunkLocation(topic_id, partition, start, length, tuple(starts)))
    if table is not None:
        parts.append(table(locations))
    footer = b"".join(entries)
    parts.append(footer)
    parts.append(_TRAILER.pack(len(footer), crc32c.crc32c(footer), MAGIC))
    return parts, locations


def footer_size(tail: bytes) -> int:
    """Bytes of footer plus trailer, read from the trailer at the end of `tail`."""
    if len(tail) < TRAILER_SIZE:
        raise IngestFileError(f"need the {TRAILER_SIZE}-byte trailer, got {len(tail)} bytes")
    footer_length, _crc, magic = _TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    if magic != MAGIC:
        raise IngestFileError(f"not an ingest file: trailer magic is {magic!r}")
    if footer_length % ENTRY_SIZE:
        raise IngestFileError(f"footer length {footer_length} is not a whole number of entries")
    return int(footer_length) + TRAILER_SIZE


def decode_footer(tail: bytes) -> list[ChunkLocation]:
    """Chunk locations from any tail of an ingest file that holds footer and trailer.

    batch_starts are empty: the footer records how many batches, not where.
    """
    needed = footer_size(tail)
    if len(tail) < needed:
        raise IngestFileError(f"need the last {needed} bytes for the footer, got {len(tail)}")
    footer_length, crc, _magic = _TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    footer = memoryview(tail)[len(tail) - needed : len(tail) - TRAILER_SIZE]
    actual = crc32c.crc32c(footer)
    if actual != crc:
        raise IngestFileError(
            f"footer crc32c mismatch: stored {crc:#010x}, computed {actual:#010x}"
        )
    locations: list[ChunkLocation] = []
    previous_end = HEADER_SIZE
    for topic_id, partition, start, length, _count in _ENTRY.iter_unpack(footer):
        # Chunks are written back to back after the header; anything else is corruption.
        if start < previous_end:
            raise IngestFileError(f"chunk at {start} overlaps the one ending at {previous_end}")
        previous_end = start + length
        locations.append(ChunkLocation(topic_id, partition, start, length, ()))
    return locations


def decode_header(head: bytes) -> int:
    """The format version from the first bytes of an ingest file."""
    if len(head) < HEADER_SIZE:
        raise IngestFileError(f"need the {HEADER_SIZE}-byte header, got {len(head)} bytes")
    magic, version, _reserved = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise IngestFileError(f"not an ingest file: header magic is {magic!r}")
    if version != FORMAT_VERSION:
        raise IngestFileError(f"unsupported ingest file version {version}")
    return int(version)


async def read_index(
    store: ObjectStore, key: str, *, tail_guess: int = 16 * 1024
) -> list[ChunkLocation]:
    """The chunk locations of a stored ingest file, read from its tail only.

    One suffix GET of `tail_guess` bytes usually holds the whole footer (about 450
    chunks at the default); a larger footer costs exactly one more GET.
    """
    tail = await store.get(key, -max(tail_guess, TRAILER_SIZE))
    needed = footer_size(tail)
    if len(tail) < needed:
        tail = await store.get(key, -needed)
    try:
        return decode_footer(tail)
    except IngestFileError as exc:
        raise IngestFileError(f"{key}: {exc}") from None


# -- journal objects: an ingest file with a batch table -------------------------------------
#
# A lightning topic's flush is answered before it has offsets; whoever gives it offsets
# later (the agent that wrote it, or another after its death) needs each batch's producer
# fields, which the footer does not hold. They sit in a table between the last chunk and
# the footer, so that the tail of the object (one ranged GET) holds all of it:
#
#     table    one entry per batch, in file order:                    59 bytes each
#              topic_id (16), partition i32, start u64, length u32, last_offset_delta
#              i32, max_timestamp i64, producer_id i64, producer_epoch i16,
#              base_sequence i32, flags u8 (bit 0: transactional)
#     table trailer  table length u32, crc32c(table) u32, b"BLJT"           12 bytes
#
# then the footer and trailer of every ingest file.

JOURNAL_MAGIC = b"BLJT"
_JOURNAL_ENTRY = struct.Struct(">16siQIiqqhiB")
_JOURNAL_TRAILER = struct.Struct(">II4s")
JOURNAL_ENTRY_SIZE = _JOURNAL_ENTRY.size  # 59


@dataclass(frozen=True, slots=True)
class JournalBatch:
    """What giving one batch of a journal object its offsets takes."""

    topic_id: bytes
    partition: int
    start: int
    length: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool


class BatchFields(Protocol):
    """What the table records of a batch: JournalBatch, or any batch with the same
    fields (metadata.log.PendingBatch)."""

    @property
    def topic_id(self) -> bytes: ...
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def last_offset_delta(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def transactional(self) -> bool: ...


def encode_journal_table(batches: Sequence[BatchFields]) -> bytes:
    table = b"".join(
        _JOURNAL_ENTRY.pack(
            b.topic_id,
            b.partition,
            b.start,
            b.length,
            b.last_offset_delta,
            b.max_timestamp,
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
            1 if b.transactional else 0,
        )
        for b in batches
    )
    return table + _JOURNAL_TRAILER.pack(len(table), crc32c.crc32c(table), JOURNAL_MAGIC)


def decode_journal_table(tail: bytes, whole: bool) -> list[JournalBatch] | int:
    """The batch table from a tail of a journal object; `whole`: the tail is the whole
    object. When the tail is too short, how many bytes of tail are needed instead.

    :raises IngestFileError: not a journal object, or a corrupt table.
    """
    needed = footer_size(tail) + _JOURNAL_TRAILER.size
    if len(tail) < needed:
        if whole:
            raise IngestFileError("no journal table before the footer (not a journal object)")
        return needed
    end = len(tail) - footer_size(tail)  # where the table trailer ends
    length, crc, magic = _JOURNAL_TRAILER.unpack_from(tail, end - _JOURNAL_TRAILER.size)
    if magic != JOURNAL_MAGIC:
        raise IngestFileError("no journal table before the footer (not a journal object)")
    if length % JOURNAL_ENTRY_SIZE:
        raise IngestFileError(f"journal table length {length} is not a whole number of entries")
    needed += int(length)
    if len(tail) < needed:
        if whole:
            raise IngestFileError(f"journal table of {length} bytes does not fit the object")
        return needed
    table = memoryview(tail)[len(tail) - needed : end - _JOURNAL_TRAILER.size]
    if crc32c.crc32c(table) != crc:
        raise IngestFileError("journal table crc32c mismatch")
    return [
        JournalBatch(tid, p, st, ln, delta, ts, pid, epoch, seq, bool(flags & 1))
        for tid, p, st, ln, delta, ts, pid, epoch, seq, flags in _JOURNAL_ENTRY.iter_unpack(table)
    ]


async def read_journal_table(
    store: ObjectStore, key: str, *, tail_guess: int = 64 * 1024
) -> list[JournalBatch]:
    """The batch table of a stored journal object, read from its tail: one ranged GET,
    or two or three when footer and table are larger than `tail_guess`."""
    wanted = max(tail_guess, TRAILER_SIZE)
    for _ in range(3):
        tail = await store.get(key, -wanted)
        try:
            found = decode_journal_table(tail, whole=len(tail) < wanted)
        except IngestFileError as exc:
            raise IngestFileError(f"{key}: {exc}") from None
        if not isinstance(found, int):
            return found
        wanted = found
    raise IngestFileError(f"{key}: the journal table's size keeps changing")


# ULIDs: 48-bit milliseconds since the epoch, then 80 random bits, in Crockford base32.
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = (0, 0)  # (ms, random) of the last key made in this process


INGEST_PREFIX = "ingest/"  # the agents' flushes


def new_object_key(prefix: str = INGEST_PREFIX) -> str:
    """A fresh key, e.g. "ingest/01JD3V6Q0Z8WJ5H7X2M4N6P8RA", sorting by creation time.

    Within one millisecond this process increments the random part, so its keys are
    strictly increasing; keys of other processes in the same millisecond interleave.
    """
    global _ulid_last
    with _ulid_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_random = _ulid_last
        if ms <= last_ms:  # same millisecond, or the clock stepped back
            ms, rand = last_ms, last_random + 1
            if rand >> 80:
                ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big")
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last = (ms, rand)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | rand
    return prefix + "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))
