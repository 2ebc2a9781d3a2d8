from __future__ import annotations

import os
import struct

import cramjam
import pytest
from aiokafka import codec as aiokafka_codec
from kio.schema.errors import ErrorCode

from protocol.compression import XERIAL_MAGIC, Compression, compress, decompress
from protocol.errors import RecordBatchError

PAYLOADS = [
    b"",
    b"x",
    b"hello kafka " * 1000,
    os.urandom(5000),
    os.urandom(40_000) + b"\x00" * 100_000,  # spans several 32 KiB xerial blocks
]


@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_round_trip(codec: Compression, payload: bytes) -> None:
    compressed = compress(codec, payload)
    assert decompress(codec, compressed) == payload
    assert decompress(codec, compress(codec, bytearray(payload))) == payload
    assert decompress(codec, compress(codec, memoryview(payload))) == payload
    assert decompress(codec, memoryview(compressed)) == payload
    assert decompress(codec, bytearray(compressed)) == payload


def test_snappy_writes_xerial_framing() -> None:
    payload = b"abc" * 30_000
    compressed = compress(Compression.SNAPPY, payload)
    assert compressed[:8] == XERIAL_MAGIC
    assert struct.unpack_from(">ii", compressed, 8) == (1, 1)
    # Java's SnappyOutputStream writes 32 KiB blocks: 90000 bytes make 3.
    position, blocks = 16, 0
    while position < len(compressed):
        (size,) = struct.unpack_from(">I", compressed, position)
        position += 4 + size
        blocks += 1
    assert blocks == 3


def test_snappy_reads_a_raw_block() -> None:
    payload = b"librdkafka writes raw snappy " * 100
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(payload))) == payload


@pytest.mark.parametrize("xerial", [True, False])
def test_snappy_reads_what_a_client_writes(xerial: bool) -> None:
    payload = os.urandom(1000) * 80
    written = aiokafka_codec.snappy_encode(payload, xerial_compatible=xerial)
    assert decompress(Compression.SNAPPY, written) == payload


def test_lz4_blocks_are_independent() -> None:
    compressed = compress(Compression.LZ4, b"x" * 200_000)
    assert compressed[:4] == b"\x04\x22\x4d\x18"
    flags = compressed[4]
    assert flags >> 6 == 1  # version
    assert flags & 0x20  # block independence: Java refuses linked blocks


@pytest.mark.parametrize(
    ("codec", "encode"),
    [
        (Compression.GZIP, aiokafka_codec.gzip_encode),
        (Compression.LZ4, aiokafka_codec.lz4_encode),
        (Compression.ZSTD, aiokafka_codec.zstd_encode),
    ],
)
def test_reads_what_a_client_writes(codec: Compression, encode: object) -> None:
    payload = b"record bytes " * 5000
    assert callable(encode)
    assert decompress(codec, encode(payload)) == payload


@pytest.mark.parametrize("codec", [c for c in Compression if c != Compression.NONE])
def test_corrupt_input_is_corrupt_message(codec: Compression) -> None:
    compressed = compress(codec, b"some records " * 100)
    for garbage in (b"\xff" * 40, compressed[: len(compressed) // 2]):
        with pytest.raises(RecordBatchError) as info:
            decompress(codec, garbage)
        assert info.value.error_code == ErrorCode.corrupt_message


def test_truncated_xerial_stream() -> None:
    compressed = compress(Compression.SNAPPY, b"abc" * 1000)
    with pytest.raises(RecordBatchError) as info:
        decompress(Compression.SNAPPY, compressed[:-5])
    assert info.value.error_code == ErrorCode.corrupt_message


def test_unknown_codecs() -> None:
    with pytest.raises(ValueError):
        compress(5, b"x")
    with pytest.raises(RecordBatchError) as info:
        decompress(7, b"x")
    assert info.value.error_code == ErrorCode.corrupt_message
