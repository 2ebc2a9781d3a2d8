"""FoundationDB tuple-layer keys, as thin wrappers over `fdb.tuple`.

Rules:

* the encoding is FoundationDB's own (`fdb.tuple`), byte for byte, so keys written by the
  SQLite backend mean the same on FoundationDB and packed keys sort like their tuples;
* `fdb.tuple` is pure Python: importing it loads neither `fdb.impl` nor libfdb_c (only
  `fdb.api_version()` does), so this module works on machines without the FDB client;
* supported element types: None, bytes, str, int (any size), bool, float, uuid.UUID and
  nested tuples;
* the types nearly every key and value holds (None, bytes, str, ints of up to 8 bytes
  and tuples of them: an idempotent producer's state in a partition, written by every
  flush) are packed and unpacked here, in one loop without a call per element (`fdb.tuple` makes
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
_NESTED = 0x05  # a tuple inside a tuple: its items, then 0x00
_NESTED_NULL = b"\x00\xff"  # None inside a nested tuple
_BYTES = 0x01
_STRING = 0x02
_INT_ZERO = 0x14  # 0x14 - n: a negative int of n bytes; 0x14 + n: a positive one
_ESCAPED_NUL = b"\x00\xff"  # a 0x00 inside bytes or a string
_LIMIT = (1 << 64) - 1  # smaller ints take 8 bytes at most (fdb.tuple: from it on, 0x1d)
_INT_HEADS = [bytes((_INT_ZERO + n,)) for n in range(-8, 9)]  # index n + 8


def pack(t: tuple[Any, ...]) -> bytes:
    """The key bytes of tuple `t`; bytewise order of the results is tuple order."""
    parts: list[bytes] = []
    if not _pack_into(t, parts.append, False):
        return _fdb_pack(t)
    return b"".join(parts)


def _pack_into(t: tuple[Any, ...], append: Any, nested: bool) -> bool:
    """Append the encoding of t's items; False if an item is of a type left to fdb."""
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
                return False
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
            append(_NESTED_NULL if nested else b"\x00")
        elif kind is tuple:
            append(b"\x05")
            if not _pack_into(item, append, True):
                return False
            append(b"\x00")
        else:
            return False
    return True


def unpack(b: bytes) -> tuple[Any, ...]:
    """The tuple whose packed form is `b` (inverse of `pack`)."""
    if type(b) is not bytes:
        b = bytes(b)
    found = _unpack_from(b, 0, False)
    if found is None:
        return _fdb_unpack(b)  # a type left to fdb, or bytes cut short: fdb says how
    return tuple(found[0])


def _unpack_from(b: bytes, pos: int, nested: bool) -> tuple[list[Any], int] | None:
    """The items from pos on, and where they end: at the end of b, or (nested) past the
    0x00 that closes them. None: something only fdb.tuple reads, or a cut."""
    out: list[Any] = []
    append = out.append
    size = len(b)
    while pos < size:
        code = b[pos]
        if _INT_ZERO < code <= _INT_ZERO + 8:
            end = pos + 1 + code - _INT_ZERO
            if end > size:
                return None
            append(int.from_bytes(b[pos + 1 : end], "big"))
            pos = end
        elif code == _BYTES or code == _STRING:
            end = b.find(0, pos + 1)
            while end != -1 and end + 1 < size and b[end + 1] == 0xFF:
                end = b.find(0, end + 2)
            if end == -1:
                return None
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
                return None
            append(int.from_bytes(b[pos + 1 : end], "big") - (1 << (8 * n)) + 1)
            pos = end
        elif code == _NULL:
            if not nested:
                append(None)
                pos += 1
            elif pos + 1 < size and b[pos + 1] == 0xFF:
                append(None)
                pos += 2
            else:
                return out, pos + 1  # the nested tuple's end
        elif code == _NESTED:
            inner = _unpack_from(b, pos + 1, True)
            if inner is None:
                return None
            append(tuple(inner[0]))
            pos = inner[1]
        else:
            return None
    if nested:
        return None  # no closing 0x00: let fdb.tuple say how it reads that
    return out, pos


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
