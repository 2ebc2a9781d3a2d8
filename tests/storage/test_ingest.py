"""The ingest-file format: encoding, the footer index, ULID keys."""

from __future__ import annotations

import os
import struct
import time

import pytest

from storage.ingest import (
    ENTRY_SIZE,
    HEADER_SIZE,
    JOURNAL_ENTRY_SIZE,
    TRAILER_SIZE,
    ChunkLocation,
    IngestFileError,
    JournalBatch,
    decode_footer,
    decode_header,
    decode_journal_table,
    encode_ingest_file,
    encode_journal_table,
    new_object_key,
    read_index,
    read_journal_table,
)
from storage.local import LocalObjectStore
from storage.objectstore import ObjectStore

TOPIC_A = bytes(range(16))
TOPIC_B = bytes(range(16, 32))


def fake_batch(size: int) -> bytes:
    # Only lengths matter here: the format never looks inside a batch.
    return os.urandom(size)


def sample_chunks() -> list[tuple[bytes, int, list[bytes]]]:
    return [
        (TOPIC_A, 0, [fake_batch(100), fake_batch(61), fake_batch(2000)]),
        (TOPIC_B, 7, [fake_batch(75)]),
        (TOPIC_A, 1, [fake_batch(10) for _ in range(50)]),
    ]


def without_batches(locations: list[ChunkLocation]) -> list[ChunkLocation]:
    return [
        ChunkLocation(loc.topic_id, loc.partition, loc.start, loc.length, ()) for loc in locations
    ]


def test_round_trip_stores_batches_byte_for_byte() -> None:
    chunks = sample_chunks()
    data, locations = encode_ingest_file(chunks)
    assert decode_header(data) == 1
    assert [(loc.topic_id, loc.partition) for loc in locations] == [
        (topic, partition) for topic, partition, _ in chunks
    ]
    for (_topic, _partition, batches), loc in zip(chunks, locations, strict=True):
        assert data[loc.start : loc.end] == b"".join(batches)
        assert loc.batch_starts[0] == loc.start
        assert len(loc.batch_starts) == len(batches)
        ends = [*loc.batch_starts[1:], loc.end]
        for batch, start, end in zip(batches, loc.batch_starts, ends, strict=True):
            assert data[start:end] == batch
    assert locations[0].start == HEADER_SIZE
    assert decode_footer(data) == without_batches(locations)
    footer_and_trailer = len(chunks) * ENTRY_SIZE + TRAILER_SIZE
    assert len(data) == locations[-1].end + footer_and_trailer
    assert decode_footer(data[-footer_and_trailer:]) == without_batches(locations)


def test_footer_records_batch_counts() -> None:
    data, _ = encode_ingest_file(sample_chunks())
    footer_length = struct.unpack(">I", data[-12:-8])[0]
    footer = data[-12 - footer_length : -12]
    counts = [entry[-1] for entry in struct.iter_unpack(">16siQII", footer)]
    assert counts == [3, 1, 50]


def test_empty_file() -> None:
    data, locations = encode_ingest_file([])
    assert locations == []
    assert len(data) == HEADER_SIZE + TRAILER_SIZE
    assert decode_footer(data) == []


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_ingest_file([(b"short", 0, [b"x"])])
    with pytest.raises(ValueError, match="no batches"):
        encode_ingest_file([(TOPIC_A, 0, [])])


def test_corrupt_footer_crc_is_detected() -> None:
    data, _ = encode_ingest_file(sample_chunks())
    corrupt = bytearray(data)
    corrupt[-TRAILER_SIZE - 5] ^= 0x01  # a bit of the last footer entry
    with pytest.raises(IngestFileError, match="crc32c mismatch"):
        decode_footer(bytes(corrupt))


def test_truncated_or_foreign_tails_are_rejected() -> None:
    data, _ = encode_ingest_file(sample_chunks())
    with pytest.raises(IngestFileError, match="need the last"):
        decode_footer(data[-20:])
    with pytest.raises(IngestFileError, match="trailer"):
        decode_footer(data[-5:])
    with pytest.raises(IngestFileError, match="not an ingest file"):
        decode_footer(data[:-1])
    with pytest.raises(IngestFileError, match="not an ingest file"):
        decode_header(b"PK\x03\x04" + data[4:])


def test_large_encode_is_fast() -> None:
    batches = [os.urandom(16 * 1024)] * 1024  # 16 MiB in 1024 batches
    chunks = [(TOPIC_A, partition, batches[partition::64]) for partition in range(64)]
    began = time.perf_counter()
    data, locations = encode_ingest_file(chunks)
    elapsed = time.perf_counter() - began
    assert len(locations) == 64
    assert len(data) > 16 * 1024 * 1024
    assert elapsed < 0.5, f"encoding 16 MiB took {elapsed:.3f}s"


async def test_read_index_reads_only_the_tail(store: ObjectStore) -> None:
    chunks = [(TOPIC_A, p, [fake_batch(4096) for _ in range(16)]) for p in range(32)]
    data, locations = encode_ingest_file(chunks)  # about 2 MiB of chunks
    await store.put("ingest/file", data, if_absent=True)
    stats: dict[str, int] = store.stats  # type: ignore[attr-defined]
    stats["gets"] = stats["bytes_got"] = 0

    assert await read_index(store, "ingest/file") == without_batches(locations)
    assert stats["gets"] == 1
    assert stats["bytes_got"] == 16 * 1024, "one suffix GET of the default guess"

    stats["gets"] = stats["bytes_got"] = 0
    assert await read_index(store, "ingest/file", tail_guess=64) == without_batches(locations)
    footer_and_trailer = 32 * ENTRY_SIZE + TRAILER_SIZE
    assert stats["gets"] == 2, "the trailer said the footer is bigger than the guess"
    assert stats["bytes_got"] == 64 + footer_and_trailer


async def test_read_index_of_corrupt_file(local_store: LocalObjectStore) -> None:
    data, _ = encode_ingest_file(sample_chunks())
    corrupt = bytearray(data)
    corrupt[-TRAILER_SIZE - 1] ^= 0xFF
    await local_store.put("ingest/bad", bytes(corrupt))
    with pytest.raises(IngestFileError, match="ingest/bad: footer crc32c mismatch"):
        await read_index(local_store, "ingest/bad")
    await local_store.put("ingest/foreign", b"just some object")
    with pytest.raises(IngestFileError, match="not an ingest file"):
        await read_index(local_store, "ingest/foreign")


def test_object_keys_are_ulids_in_creation_order() -> None:
    keys = [new_object_key() for _ in range(2000)]
    assert len(set(keys)) == len(keys)
    assert keys == sorted(keys), "keys of one process are strictly increasing"
    crockford = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    for key in keys[:50]:
        assert key.startswith("ingest/")
        ulid = key.removeprefix("ingest/")
        assert len(ulid) == 26
        assert set(ulid) <= crockford
        assert ulid[0] <= "7", "128 bits fit in 26 characters"
    assert new_object_key("compacted/").startswith("compacted/")


def test_object_key_carries_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    ulid = new_object_key("")
    after = time.time_ns() // 1_000_000
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    ms = 0
    for char in ulid[:10]:
        ms = ms * 32 + alphabet.index(char)
    assert before <= ms <= after


def test_keys_from_separate_milliseconds_sort_by_time() -> None:
    first = new_object_key()
    time.sleep(0.002)
    second = new_object_key()
    assert first < second


def journal_entries(locations: list[ChunkLocation]) -> list[JournalBatch]:
    return [
        JournalBatch(loc.topic_id, loc.partition, start, 10, i, 1_700 + i, 7, 2, i * 3, i == 1)
        for i, (loc, start) in enumerate(
            (loc, start) for loc in locations for start in loc.batch_starts
        )
    ]


async def test_a_journal_table_is_read_from_the_tail_and_chunks_are_unchanged(
    store: ObjectStore,
) -> None:
    made: list[JournalBatch] = []

    def table(locations: list[ChunkLocation]) -> bytes:
        made.extend(journal_entries(locations))
        return encode_journal_table(made)

    chunks = sample_chunks()
    data, locations = encode_ingest_file(chunks, table)
    plain, plain_locations = encode_ingest_file(chunks)
    assert locations == plain_locations
    assert len(data) == len(plain) + len(made) * JOURNAL_ENTRY_SIZE + 12
    # Readers of chunks see the same file: the table sits between chunks and footer.
    assert decode_footer(data) == decode_footer(plain)
    assert data[: locations[-1].end] == plain[: locations[-1].end]
    await store.put("journal/s/0000000000", data, if_absent=True)
    assert await read_journal_table(store, "journal/s/0000000000") == made
    stats: dict[str, int] = store.stats  # type: ignore[attr-defined]
    stats["gets"] = 0
    assert await read_journal_table(store, "journal/s/0000000000", tail_guess=40) == made
    assert stats["gets"] == 3, "the trailer, then the footer and table trailer, then the table"


async def test_a_journal_table_that_is_missing_or_corrupt_is_refused(
    local_store: LocalObjectStore,
) -> None:
    plain, _ = encode_ingest_file(sample_chunks())
    await local_store.put("journal/s/0000000001", plain)
    with pytest.raises(IngestFileError, match="no journal table"):
        await read_journal_table(local_store, "journal/s/0000000001")
    data, _ = encode_ingest_file(
        sample_chunks(), lambda locations: encode_journal_table(journal_entries(locations))
    )
    corrupt = bytearray(data)
    footer_at = len(data) - (len(decode_footer(data)) * ENTRY_SIZE + TRAILER_SIZE)
    corrupt[footer_at - 12 - 5] ^= 0xFF  # inside the table's last entry
    await local_store.put("journal/s/0000000002", bytes(corrupt))
    with pytest.raises(IngestFileError, match="journal/s/0000000002: journal table crc32c"):
        await read_journal_table(local_store, "journal/s/0000000002")
    assert isinstance(decode_journal_table(data[-30:], whole=False), int)  # read more
