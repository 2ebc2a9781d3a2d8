"""FoundationDB tuple-layer keys, as thin wrappers over `fdb.tuple`.

Rules:

* the encoding is FoundationDB's own (`fdb.tuple`), byte for byte, so keys written by the
  SQLite backend mean the same on FoundationDB and packed keys sort like their tuples;
* `fdb.tuple` is pure Python: importing it loads neither `fdb.impl` nor libfdb_c (only
  `fdb.api_version()` does), so this module works on machines without the FDB client;
* supported element types: None, bytes, str, int (any size), bool, float, uuid.UUID and
  nested tuples;
* the types nearly every key and value holds (None, bytes, str and ints of up to 8 bytes)
  are packed and unpacked here, in one loop without a call per element (`fdb.tuple` makes
  several: on the metadata paths that read thousands of entries, such as a compaction's
  commit, unpacking was most of the time); a tuple with anything else goes to `fdb.tuple`
  whole. Both give the same bytes and the same tuples: tests/metadata/test_tuple_layer.py
  checks it against `fdb.tuple` on generated tuples.
"""

from __future__ import annotations

from typing import Any

# fdb ships no type information; everything it returns is re-typed below.
import fdb.tuple as _fdb_tuple

# Type codes of FoundationDB's tuple encoding (the design/tuple.md of its repository).
_NULL = 0x00
_BYTES = 0x01
_STRING = 0x02
_INT_ZERO = 0x14  # 0x14 - n: a negative int of n bytes; 0x14 + n: a positive one
_ESCAPED_NUL = b"\x00\xff"  # a 0x00 inside bytes or a string
_LIMIT = (1 << 64) - 1  # smaller ints take 8 bytes at most (fdb.tuple: from it on, 0x1d)
_INT_HEADS = [bytes((_INT_ZERO + n,)) for n in range(-8, 9)]  # index n + 8


def pack(t: tuple[Any, ...]) -> bytes:
    """The key bytes of tuple `t`; bytewise order of the results is tuple order."""
    parts: list[bytes] = []
    append = parts.append
    for item in t:
        kind = type(item)  # exact types: a bool is an int, and packs otherwise
        if kind is int:
            if item > 0 and item < _LIMIT:
                n = (item.bit_length() + 7) >> 3
                append(_INT_HEADS[n + 8])
                append(item.to_bytes(n, "big"))
            elif item == 0:
                append(b"\x14")
            elif item < 0 and -item < _LIMIT:
                n = ((-item).bit_length() + 7) >> 3
                append(_INT_HEADS[8 - n])
                append((item + (1 << (8 * n)) - 1).to_bytes(n, "big"))
            else:
                return _fdb_pack(t)
        elif kind is bytes:
            append(b"\x01")
            append(item.replace(b"\x00", _ESCAPED_NUL) if b"\x00" in item else item)
            append(b"\x00")
        elif kind is str:
            raw = item.encode("utf-8")
            append(b"\x02")
            append(raw.replace(b"\x00", _ESCAPED_NUL) if b"\x00" in raw else raw)
            append(b"\x00")
        elif item is None:
            append(b"\x00")
        else:
            return _fdb_pack(t)
    return b"".join(parts)


def unpack(b: bytes) -> tuple[Any, ...]:
    """The tuple whose packed form is `b` (inverse of `pack`)."""
    if type(b) is not bytes:
        b = bytes(b)
    out: list[Any] = []
    append = out.append
    pos, size = 0, len(b)
    while pos < size:
        code = b[pos]
        if _INT_ZERO < code <= _INT_ZERO + 8:
            end = pos + 1 + code - _INT_ZERO
            if end > size:
                return _fdb_unpack(b)  # truncated: fdb.tuple says how
            append(int.from_bytes(b[pos + 1 : end], "big"))
            pos = end
        elif code == _BYTES or code == _STRING:
            end = b.find(0, pos + 1)
            while end != -1 and end + 1 < size and b[end + 1] == 0xFF:
                end = b.find(0, end + 2)
            if end == -1:
                return _fdb_unpack(b)
            raw = b[pos + 1 : end]
            if _ESCAPED_NUL in raw:
                raw = raw.replace(_ESCAPED_NUL, b"\x00")
            append(raw if code == _BYTES else raw.decode("utf-8"))
            pos = end + 1
        elif code == _INT_ZERO:
            append(0)
            pos += 1
        elif _INT_ZERO - 8 <= code < _INT_ZERO:
            n = _INT_ZERO - code
            end = pos + 1 + n
            if end > size:
                return _fdb_unpack(b)
            append(int.from_bytes(b[pos + 1 : end], "big") - (1 << (8 * n)) + 1)
            pos = end
        elif code == _NULL:
            append(None)
            pos += 1
        else:
            return _fdb_unpack(b)
    return tuple(out)


def _fdb_pack(t: tuple[Any, ...]) -> bytes:
    packed: bytes = _fdb_tuple.pack(t)
    return packed


def _fdb_unpack(b: bytes) -> tuple[Any, ...]:
    unpacked: tuple[Any, ...] = _fdb_tuple.unpack(b)
    return unpacked


def range_of(prefix: tuple[Any, ...]) -> tuple[bytes, bytes]:
    """(begin, end) holding every key packed from a tuple that extends `prefix`.

    Same bounds as FoundationDB's `fdb.tuple.range`: begin inclusive, end exclusive. The
    packed prefix itself is not included (it is not a strict extension).
    """
    p = pack(prefix)
    return p + b"\x00", p + b"\xff"


def strinc(b: bytes) -> bytes:
    """The first key after every key that starts with `b` (FoundationDB's `strinc`).

    Trailing 0xff bytes are dropped and the last remaining byte is incremented, so
    `(b, strinc(b))` is the range of all keys prefixed by `b`.
    """
    stripped = b.rstrip(b"\xff")
    if not stripped:
        raise ValueError("strinc: key must contain at least one byte other than 0xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,))
