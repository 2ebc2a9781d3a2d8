"""Record-batch compression codecs (attributes bits 0-2), via cramjam.

Rules:

- Used only where records must be read or built (ListOffsets by timestamp,
  tools, tests), never on the produce or fetch hot path: batches are stored
  and served as the producer compressed them.
- gzip: RFC 1952. lz4: the LZ4 *frame* format with independent blocks (Java's
  ``Lz4BlockInputStream`` rejects linked blocks, which cramjam's one-shot
  ``lz4.compress`` produces). zstd: a standard zstd frame.
- snappy: the Java client writes xerial framing (``b"\\x82SNAPPY\\x00"``,
  int32 version, int32 compatible version, then [uint32 length][raw snappy
  block]...); librdkafka writes one raw snappy block. Decompression accepts
  both; compression writes xerial framing, which every client reads.
- Compression uses fast levels: it only serves tools and tests.
- Bytes that do not decompress raise ``RecordBatchError(CORRUPT_MESSAGE)``.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam
from kio.schema.errors import ErrorCode

from .errors import RecordBatchError

__all__ = ["Compression", "compress", "decompress"]


class Compression(IntEnum):
    """Compression codec ids, as in record batch attributes bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_VERSION = 1
_XERIAL_COMPATIBLE = 1
_XERIAL_BLOCK_SIZE = 32 * 1024  # the block size of Java's SnappyOutputStream
_UINT32 = struct.Struct(">I")


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress ``data`` with ``codec`` (a ``Compression`` id).

    :raises ValueError: unknown codec (the caller's fault).
    """
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=1))
    if codec == Compression.SNAPPY:
        return _xerial_compress(data)
    if codec == Compression.LZ4:
        compressor = cramjam.lz4.Compressor(level=1, content_checksum=False, block_linked=False)
        compressor.compress(data if isinstance(data, bytes) else bytes(data))
        return bytes(compressor.finish())
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=1))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Decompress ``data`` written with ``codec``.

    :raises RecordBatchError: unknown codec or bytes that do not decompress.
    """
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == Compression.SNAPPY:
            return _snappy_decompress(memoryview(data))
        if codec == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except RecordBatchError:
        raise
    except Exception as error:
        name = Compression(codec).name.lower()
        raise RecordBatchError(
            ErrorCode.corrupt_message, f"{name} records do not decompress: {error}"
        ) from error
    raise RecordBatchError(ErrorCode.corrupt_message, f"unknown compression codec {codec}")


def _xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data).cast("B")
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, _XERIAL_VERSION, _XERIAL_COMPATIBLE)]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(_UINT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(view: memoryview) -> bytes:
    view = view.cast("B")
    if len(view) < _XERIAL_HEADER.size or bytes(view[:8]) != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    parts = []
    position = _XERIAL_HEADER.size
    end = len(view)
    while position < end:
        if position + 4 > end:
            raise RecordBatchError(ErrorCode.corrupt_message, "xerial snappy block is truncated")
        (size,) = _UINT32.unpack_from(view, position)
        position += 4
        if position + size > end:
            raise RecordBatchError(ErrorCode.corrupt_message, "xerial snappy block is truncated")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[position : position + size])))
        position += size
    return b"".join(parts)
