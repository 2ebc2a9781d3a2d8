"""FoundationDB tuple-layer keys, as thin wrappers over `fdb.tuple`.

Rules:

* the encoding is FoundationDB's own (`fdb.tuple`), byte for byte, so keys written by the
  SQLite backend mean the same on FoundationDB and packed keys sort like their tuples;
* `fdb.tuple` is pure Python: importing it loads neither `fdb.impl` nor libfdb_c (only
  `fdb.api_version()` does), so this module works on machines without the FDB client;
* supported element types: None, bytes, str, int (any size), bool, float, uuid.UUID and
  nested tuples.
"""

from __future__ import annotations

from typing import Any

# fdb ships no type information; everything it returns is re-typed below.
import fdb.tuple as _fdb_tuple


def pack(t: tuple[Any, ...]) -> bytes:
    """The key bytes of tuple `t`; bytewise order of the results is tuple order."""
    packed: bytes = _fdb_tuple.pack(t)
    return packed


def unpack(b: bytes) -> tuple[Any, ...]:
    """The tuple whose packed form is `b` (inverse of `pack`)."""
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
