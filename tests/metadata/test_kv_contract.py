"""The contract every metadata KV backend must meet (metadata/kv.py), run on each backend.

Tests that take `kv` or `backend` run once per backend (see conftest.py). At the end are
tests of the tuple-key helpers and of behaviour only the SQLite backend has (its file
settings, lock retries, connection pool), which are not parametrized.
"""

from __future__ import annotations

import fcntl
import gc
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest

from metadata import sqlite_kv
from metadata import tuple_layer as kt
from metadata.kv import (
    KV,
    MANY,
    KVError,
    ReadTransaction,
    Transaction,
    decode_i64,
    encode_i64,
)
from metadata.sqlite_kv import SQLiteKV

if TYPE_CHECKING:
    from tests.metadata.conftest import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def _put(kv: KV, items: dict[bytes, bytes]) -> None:
    def fn(tr: Transaction) -> None:
        for k, v in items.items():
            tr.set(k, v)

    kv.transact_sync(fn)


def _get(kv: KV, key: bytes) -> bytes | None:
    return kv.transact_sync(lambda tr: tr.get(key))


def _all(kv: KV) -> list[tuple[bytes, bytes]]:
    return kv.transact_sync(lambda tr: tr.get_range(b"", b"\xff"))


def _incr(key: bytes) -> Any:
    """A read-increment-write transaction function (deliberately not `add`)."""

    def fn(tr: Transaction) -> int:
        value = decode_i64(tr.get(key)) + 1
        tr.set(key, encode_i64(value))
        return value

    return fn


# -- basic operations -------------------------------------------------------------------


def test_get_set_clear(kv: KV) -> None:
    assert _get(kv, b"a") is None
    _put(kv, {b"a": b"1", b"b": b""})
    assert _get(kv, b"a") == b"1"
    assert _get(kv, b"b") == b""  # an empty value is a value, not a missing key
    _put(kv, {b"a": b"2"})
    assert _get(kv, b"a") == b"2"
    kv.transact_sync(lambda tr: tr.clear(b"a"))
    kv.transact_sync(lambda tr: tr.clear(b"never-set"))  # clearing a missing key is fine
    assert _get(kv, b"a") is None
    # Binary keys, including the bytes the tuple encoding escapes.
    binary = {b"\x00": b"zero", b"\x00\xff": b"esc", b"\xfe\xff": b"high"}
    _put(kv, binary)
    for k, v in binary.items():
        assert _get(kv, k) == v


async def test_async_transact_and_read_return_results(kv: KV) -> None:
    def write(tr: Transaction) -> str:
        tr.set(b"k", b"v")
        return "done"

    assert await kv.transact(write) == "done"
    assert await kv.read(lambda tr: tr.get(b"k")) == b"v"
    assert await kv.read(lambda tr: tr.get(b"missing")) is None


def test_get_range_bounds_order_and_limits(kv: KV) -> None:
    keys = [b"a", b"b", b"c", b"c\x00", b"ca", b"d", b"e", b"f"]
    _put(kv, {k: k.upper() for k in keys})

    def rng(begin: bytes, end: bytes, **kw: Any) -> list[bytes]:
        return [k for k, _ in kv.transact_sync(lambda tr: tr.get_range(begin, end, **kw))]

    # begin inclusive, end exclusive, bytewise order (a prefix sorts first).
    assert rng(b"c", b"e") == [b"c", b"c\x00", b"ca", b"d"]
    assert rng(b"b\xff", b"ca") == [b"c", b"c\x00"]
    assert rng(b"", b"\xff") == keys
    assert rng(b"c", b"e", reverse=True) == [b"d", b"ca", b"c\x00", b"c"]
    assert rng(b"c", b"e", limit=2) == [b"c", b"c\x00"]
    assert rng(b"c", b"e", limit=2, reverse=True) == [b"d", b"ca"]
    assert rng(b"c", b"e", limit=0) == rng(b"c", b"e")  # 0 = no limit
    assert rng(b"c", b"e", limit=100) == rng(b"c", b"e")
    assert rng(b"", b"\xff", limit=1, reverse=True) == [b"f"]
    assert rng(b"c", b"c") == []  # empty and inverted ranges hold nothing
    assert rng(b"e", b"c") == []
    assert rng(b"g", b"z") == []
    pairs = kv.transact_sync(lambda tr: tr.get_range(b"a", b"b\x00"))
    assert pairs == [(b"a", b"A"), (b"b", b"B")]


def test_long_ranges_and_odd_values_read_back_exactly(kv: KV) -> None:
    """Ranges longer than a backend reads at once, and values of every shape: empty,
    NUL and comma bytes, a key that is a prefix of the next, a value of 100 KB."""
    rng = random.Random(7)
    data = {b"k/%05d" % i: rng.randbytes(rng.randrange(0, 40)) for i in range(9_001)}
    data[b"k/00010\x00"] = b""
    data[b"k/00011,"] = b",\x00,"
    data[b"k/00012"] = b"\xff" * 100_000
    for at in range(0, len(data), 2_000):
        _put(kv, dict(list(data.items())[at : at + 2_000]))
    ordered = sorted(data.items())
    begin, end = b"k/", b"k0"

    def read(tr: ReadTransaction) -> list[Any]:
        return [
            tr.get_range(begin, end),
            tr.get_range(begin, end, reverse=True),
            tr.get_range(begin, end, limit=4_097),
            tr.get_range(begin, end, limit=8_193, reverse=True),
            tr.get_range(b"k/00005", b"k/00013", limit=5),
            tr.get_many([b"k/00010\x00", b"k/00011,", b"k/00012", b"k/missing"]),
        ]

    whole, backwards, first, last, middle, some = kv.transact_sync(read)
    assert whole == ordered
    assert backwards == ordered[::-1]
    assert first == ordered[:4_097]
    assert last == ordered[::-1][:8_193]
    assert [k for k, _ in middle] == [b"k/00005", b"k/00006", b"k/00007", b"k/00008", b"k/00009"]
    assert some == [b"", b",\x00,", b"\xff" * 100_000, None]


def test_clear_range(kv: KV) -> None:
    keys = [b"a", b"b", b"b\x00", b"bz", b"c", b"d"]
    _put(kv, {k: b"x" for k in keys})
    kv.transact_sync(lambda tr: tr.clear_range(b"b", b"c"))
    assert [k for k, _ in _all(kv)] == [b"a", b"c", b"d"]  # end (c) is kept
    kv.transact_sync(lambda tr: tr.clear_range(b"d", b"a"))  # inverted: no-op
    kv.transact_sync(lambda tr: tr.clear_range(b"c", b"c"))  # empty: no-op
    assert [k for k, _ in _all(kv)] == [b"a", b"c", b"d"]
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff"))
    assert _all(kv) == []


def test_batched_calls_do_what_one_key_at_a_time_does(kv: KV) -> None:
    many = [b"m/%04d" % i for i in range(MANY * 2 + 7)]  # more than one statement's worth
    _put(kv, {b"a": b"1", b"b": b"2", b"c": b"3"})

    def fn(tr: Transaction) -> list[Any]:
        seen: list[Any] = []
        seen.append(tr.get_many([b"c", b"missing", b"a", b"c"]))  # order, gaps, repeats
        tr.set_many([(b"a", b"10"), (b"d", b"4"), (b"a", b"11")])  # the last value stays
        tr.add(b"n", 5)  # a pending add is read as its sum
        tr.add(b"o", 6)
        seen.append(tr.get_many([b"a", b"d", b"n"]))
        tr.set_many([(k, k) for k in many])
        seen.append(tr.get_many(many) == many)
        tr.clear_many([b"b", b"missing", b"b", *many[1:]])
        tr.add(b"r/x", 1)
        tr.clear_ranges([(b"c", b"c\x00"), (b"r/", b"r0"), (b"z", b"y"), (b"d", b"d")])
        tr.add(b"r/y", 2)
        tr.set_many([])
        tr.clear_many([])
        tr.clear_ranges([])
        seen.append(tr.get_many([]))
        return seen

    seen = kv.transact_sync(fn)
    assert seen == [[b"3", None, b"1", b"3"], [b"11", b"4", encode_i64(5)], True, []]
    assert _all(kv) == [
        (b"a", b"11"),
        (b"d", b"4"),
        (many[0], many[0]),
        (b"n", encode_i64(5)),
        (b"o", encode_i64(6)),
        (b"r/y", encode_i64(2)),
    ]
    assert kv.transact_sync(lambda tr: tr.get_many([b"d", b"b"])) == [b"4", None]
    assert anyio.run(lambda: kv.read(lambda tr: tr.get_many([b"a", b"zz"]))) == [b"11", None]


def test_get_ranges_reads_what_a_get_range_of_each_reads(kv: KV) -> None:
    rng = random.Random(11)
    data = {b"g/%04d" % i: rng.randbytes(rng.randrange(0, 20)) for i in range(0, 3_000, 3)}
    data[b"g/0003\x00"] = b",\x00"  # a key that another key is a prefix of
    _put(kv, data)
    ranges = [(b"g/%04d" % i, b"g/%04d" % (i + 5)) for i in range(0, 3_000, 7)]  # > MANY
    ranges += [
        (b"g/0003", b"g/0004"),
        (b"g/0000", b"g/0030"),  # overlaps the ones before
        (b"g/0010", b"g/0005"),  # inverted: nothing
        (b"h", b"h"),  # empty
        (b"x", b"y"),  # no keys
        (b"", b"\xff"),  # everything
    ]
    assert len(ranges) > MANY

    def read(tr: ReadTransaction) -> tuple[Any, Any]:
        return tr.get_ranges(ranges), [tr.get_range(b, e) for b, e in ranges]

    batched, each = kv.transact_sync(read)
    assert batched == each
    assert batched[-1] == sorted(data.items())
    assert batched[-3:-1] == [[], []] and batched[-4] == []
    assert anyio.run(lambda: kv.read(lambda tr: tr.get_ranges(ranges))) == each
    assert kv.transact_sync(lambda tr: tr.get_ranges([])) == []

    def after_writes(tr: Transaction) -> Any:
        tr.set(b"g/0001", b"new")
        tr.clear(b"g/0003")
        tr.add(b"g/0002", 7)  # a pending add is read as its sum
        return tr.get_ranges([(b"g/0000", b"g/0004"), (b"g/0002", b"g/0003")])

    assert kv.transact_sync(after_writes) == [
        [
            (b"g/0000", data[b"g/0000"]),
            (b"g/0001", b"new"),
            (b"g/0002", encode_i64(7)),
            (b"g/0003\x00", b",\x00"),
        ],
        [(b"g/0002", encode_i64(7))],
    ]


def test_atomic_add(kv: KV) -> None:
    kv.transact_sync(lambda tr: tr.add(b"n", 5))  # a missing key counts as 0
    assert _get(kv, b"n") == encode_i64(5)
    assert _get(kv, b"n") == (5).to_bytes(8, "little", signed=True)
    kv.transact_sync(lambda tr: tr.add(b"n", -7))
    assert decode_i64(_get(kv, b"n")) == -2
    kv.transact_sync(lambda tr: tr.add(b"m", -3))
    assert _get(kv, b"m") == (-3).to_bytes(8, "little", signed=True)

    def many(tr: Transaction) -> None:
        for delta in (10, -1, 100, -1000):
            tr.add(b"n", delta)

    kv.transact_sync(many)
    assert decode_i64(_get(kv, b"n")) == -2 + 10 - 1 + 100 - 1000

    # FDB semantics: a shorter stored value is zero-extended, the sum wraps like i64.
    _put(kv, {b"short": b"\x01\x01"})
    kv.transact_sync(lambda tr: tr.add(b"short", 1))
    assert decode_i64(_get(kv, b"short")) == 0x0102
    _put(kv, {b"top": encode_i64(I64_MAX), b"bottom": encode_i64(I64_MIN)})

    def wrap(tr: Transaction) -> None:
        tr.add(b"top", 1)
        tr.add(b"bottom", -1)

    kv.transact_sync(wrap)
    assert decode_i64(_get(kv, b"top")) == I64_MIN
    assert decode_i64(_get(kv, b"bottom")) == I64_MAX

    with pytest.raises(ValueError):
        kv.transact_sync(lambda tr: tr.add(b"n", 1 << 63))  # not an i64 delta


def test_atomic_add_is_seen_by_the_transactions_own_reads_and_writes(kv: KV) -> None:
    _put(kv, {b"t/a": encode_i64(1), b"t/b": encode_i64(2), b"t/c": encode_i64(3)})

    def fn(tr: Transaction) -> list[Any]:
        seen: list[Any] = []
        tr.add(b"t/a", 10)
        seen.append(decode_i64(tr.get(b"t/a")))  # 11
        tr.add(b"t/a", 5)
        tr.add(b"t/b", 20)
        tr.add(b"t/new", 7)
        seen.append([(k, decode_i64(v)) for k, v in tr.get_range(b"t/", b"t0")])
        tr.add(b"t/b", 1)
        tr.set(b"t/b", encode_i64(100))  # a set after an add replaces the sum
        tr.add(b"t/c", 1)
        tr.clear(b"t/c")  # and so does a clear
        tr.add(b"t/c", 2)  # counted from nothing again
        tr.add(b"u/x", 4)
        tr.clear_range(b"u/", b"u0")
        tr.add(b"u/y", 9)
        tr.add(b"u/y", -4)
        return seen

    seen = kv.transact_sync(fn)
    assert seen == [11, [(b"t/a", 16), (b"t/b", 22), (b"t/c", 3), (b"t/new", 7)]]
    assert [(k, decode_i64(v)) for k, v in _all(kv)] == [
        (b"t/a", 16),
        (b"t/b", 100),
        (b"t/c", 2),
        (b"t/new", 7),
        (b"u/y", 5),
    ]

    def rolled_back(tr: Transaction) -> None:
        tr.add(b"t/a", 1000)
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        kv.transact_sync(rolled_back)
    assert decode_i64(_get(kv, b"t/a")) == 16


def test_large_values(kv: KV, backend: Backend) -> None:
    size = backend.large_value_size  # 1 MiB on SQLite; FoundationDB's cap is 100,000 bytes
    big = os.urandom(size)
    other = bytes(range(256)) * (size // 256)
    _put(kv, {b"big": big, b"big2": other})
    assert _get(kv, b"big") == big
    assert kv.transact_sync(lambda tr: tr.get_range(b"big", b"big\xff")) == [
        (b"big", big),
        (b"big2", other),
    ]


# -- tuple-packed keys ------------------------------------------------------------------

# Tuples in FoundationDB tuple order: by type code first (None < bytes < str < nested <
# int < bool < uuid), then by value; a tuple sorts before its own extensions.
TUPLES_IN_ORDER: list[tuple[Any, ...]] = [
    (None,),
    (None, 1),
    (b"",),
    (b"\x00",),
    (b"\x00\x00",),
    (b"\x00\xff",),
    (b"\x01",),
    (b"a",),
    (b"a", None),
    (b"a\x00",),
    (b"ab",),
    (b"\xff",),
    ("",),
    ("A",),
    ("a",),
    ("a", 1),
    ("a\x00",),
    ("ab",),
    ("é",),
    ("\U0001f600",),
    ((),),
    ((None,),),
    ((None, None),),
    ((b"",),),
    ((1,),),
    ((1, "a"),),
    ((2,),),
    (-(1 << 70),),
    (-(1 << 64),),
    (-(1 << 64) + 1,),
    (I64_MIN,),
    (-(1 << 32),),
    (-256,),
    (-255,),
    (-1,),
    (-1, "z"),
    (0,),
    (0, None),
    (0, 0),
    (1,),
    (1, "a"),
    (1, "b"),
    (1, 0),
    (1, 1),
    (255,),
    (256,),
    (1 << 32,),
    (I64_MAX,),
    (1 << 63,),
    ((1 << 64) - 1,),
    (1 << 64,),
    (1 << 70,),
    (False,),
    (True,),
    (uuid.UUID(int=0),),
    (uuid.UUID(int=1),),
    (uuid.UUID(int=(1 << 128) - 1),),
]


def test_tuple_packed_keys_sort_in_tuple_order(kv: KV) -> None:
    packed = [kt.pack(t) for t in TUPLES_IN_ORDER]
    assert len(set(packed)) == len(packed)
    # Insert in a scrambled order so that storage order cannot come from insertion order.
    scrambled = packed[1::2] + packed[::2]
    _put(kv, {k: str(i).encode() for i, k in enumerate(scrambled)})
    stored = [kt.unpack(k) for k, _ in _all(kv)]
    assert stored == TUPLES_IN_ORDER
    reverse = kv.transact_sync(lambda tr: tr.get_range(b"", b"\xff", reverse=True))
    assert [kt.unpack(k) for k, _ in reverse] == TUPLES_IN_ORDER[::-1]

    # range_of((1,)) holds exactly the strict extensions of (1,).
    begin, end = kt.range_of((1,))
    inside = [kt.unpack(k) for k, _ in kv.transact_sync(lambda tr: tr.get_range(begin, end))]
    assert inside == [(1, "a"), (1, "b"), (1, 0), (1, 1)]


# -- transactions -----------------------------------------------------------------------


def test_exception_rolls_everything_back_and_propagates_unchanged(kv: KV) -> None:
    _put(kv, {b"a": b"1", b"b": b"2", b"c": b"3"})
    kv.transact_sync(lambda tr: tr.add(b"n", 1))
    before = _all(kv)
    calls = 0
    error = RuntimeError("boom")

    def fn(tr: Transaction) -> None:
        nonlocal calls
        calls += 1
        tr.set(b"a", b"changed")
        tr.set(b"new", b"x")
        tr.clear(b"b")
        tr.clear_range(b"c", b"d")
        tr.add(b"n", 41)
        raise error

    with pytest.raises(RuntimeError) as caught:
        kv.transact_sync(fn)
    assert caught.value is error
    assert calls == 1  # an error of the function itself is not retried
    assert _all(kv) == before


async def test_exception_in_async_transact_and_read_propagates(kv: KV) -> None:
    _put(kv, {b"a": b"1"})

    def write(tr: Transaction) -> None:
        tr.set(b"a", b"2")
        raise KeyError("nope")

    def read(tr: ReadTransaction) -> None:
        tr.get(b"a")
        raise LookupError("read failed")

    with pytest.raises(KeyError):
        await kv.transact(write)
    with pytest.raises(LookupError, match="read failed"):
        await kv.read(read)
    assert await kv.read(lambda tr: tr.get(b"a")) == b"1"


def test_reads_your_writes(kv: KV) -> None:
    _put(kv, {b"k1": b"old", b"k2": b"two", b"k3": b"three", b"n": encode_i64(10)})

    def fn(tr: Transaction) -> None:
        tr.set(b"k1", b"new")
        assert tr.get(b"k1") == b"new"
        tr.set(b"k0", b"zero")
        tr.clear(b"k2")
        assert tr.get(b"k2") is None
        assert tr.get_range(b"k", b"l") == [
            (b"k0", b"zero"),
            (b"k1", b"new"),
            (b"k3", b"three"),
        ]
        assert tr.get_range(b"k", b"l", limit=2, reverse=True) == [
            (b"k3", b"three"),
            (b"k1", b"new"),
        ]
        tr.clear_range(b"k1", b"k4")
        assert tr.get_range(b"k", b"l") == [(b"k0", b"zero")]
        tr.add(b"n", 5)
        assert decode_i64(tr.get(b"n")) == 15
        tr.add(b"fresh", -2)
        assert decode_i64(tr.get(b"fresh")) == -2

    kv.transact_sync(fn)
    assert _all(kv) == [(b"fresh", encode_i64(-2)), (b"k0", b"zero"), (b"n", encode_i64(15))]


# -- isolation under concurrency --------------------------------------------------------

WORKERS = 4
INCREMENTS = 200


def test_serializable_read_increment_write_from_threads(kv: KV) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(INCREMENTS):
                kv.transact_sync(_incr(b"counter"))
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert decode_i64(_get(kv, b"counter")) == WORKERS * INCREMENTS


async def test_serializable_read_increment_write_from_async_tasks(kv: KV) -> None:
    seen: list[int] = []

    async def worker() -> None:
        for _ in range(INCREMENTS):
            seen.append(await kv.transact(_incr(b"counter")))

    async with anyio.create_task_group() as tg:
        for _ in range(WORKERS):
            tg.start_soon(worker)
    assert await kv.read(lambda tr: decode_i64(tr.get(b"counter"))) == WORKERS * INCREMENTS
    # Each committed increment saw a distinct value: no two transactions interleaved.
    assert sorted(seen) == list(range(1, WORKERS * INCREMENTS + 1))


_CHILD_INCREMENT = textwrap.dedent(
    """
    import sys
    import anyio
    from metadata.kv import decode_i64, encode_i64, open_kv

    url, key, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
    kv = open_kv(url)

    def incr(tr):
        tr.set(key, encode_i64(decode_i64(tr.get(key)) + 1))

    kv.transact_sync(incr)  # connect and warm up before the start signal
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(n - 1):
        kv.transact_sync(incr)
    anyio.run(kv.aclose)
    """
)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def test_serializable_read_increment_write_from_processes(kv: KV, backend: Backend) -> None:
    processes = 3
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD_INCREMENT, backend.url, "counter", str(INCREMENTS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=_child_env(),
        )
        for _ in range(processes)
    ]
    try:
        for child in children:  # start them together, so that they contend
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.communicate()[1]
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert decode_i64(_get(kv, b"counter")) == processes * INCREMENTS


async def test_read_sees_one_snapshot_while_writer_commits(kv: KV) -> None:
    _put(kv, {b"snap/a": encode_i64(0), b"snap/b": encode_i64(0)})
    commits = 0  # written only by the writer thread
    stop = threading.Event()

    def writer() -> None:
        nonlocal commits
        i = 0
        while not stop.is_set():
            i += 1

            def both(tr: Transaction, i: int = i) -> None:
                tr.set(b"snap/a", encode_i64(i))
                tr.set(b"snap/b", encode_i64(i))

            kv.transact_sync(both)
            commits += 1

    def reader(tr: ReadTransaction) -> tuple[int, int, list[int], int]:
        a = decode_i64(tr.get(b"snap/a"))
        seen = commits
        # Let the writer commit twice more in the middle of this read transaction.
        deadline = time.monotonic() + 5
        while commits < seen + 2 and time.monotonic() < deadline:
            time.sleep(0.0005)
        b = decode_i64(tr.get(b"snap/b"))
        pair = [decode_i64(v) for _, v in tr.get_range(b"snap/", b"snap0")]
        return a, b, pair, commits - seen

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(20):
            a, b, pair, moved = await kv.read(reader)
            assert moved >= 2  # the writer really committed during the read
            assert a == b and pair == [a, a]
    finally:
        stop.set()
        await anyio.to_thread.run_sync(thread.join)
    final = await kv.read(lambda tr: tr.get_range(b"snap/", b"snap0"))
    assert final[0][1] == final[1][1] == encode_i64(commits)


# -- durability -------------------------------------------------------------------------


async def test_committed_values_survive_close_and_reopen(kv: KV, backend: Backend) -> None:
    big = os.urandom(backend.large_value_size)

    def fn(tr: Transaction) -> None:
        for i in range(100):
            tr.set(kt.pack(("item", i)), str(i).encode())
        tr.set(b"big", big)
        tr.add(b"n", 42)

    await kv.transact(fn)
    await kv.aclose()
    reopened = backend.open()
    try:
        items = await reopened.read(lambda tr: tr.get_range(*kt.range_of(("item",))))
        assert [kt.unpack(k)[1] for k, _ in items] == list(range(100))
        assert [v for _, v in items] == [str(i).encode() for i in range(100)]
        assert await reopened.read(lambda tr: tr.get(b"big")) == big
        assert await reopened.read(lambda tr: decode_i64(tr.get(b"n"))) == 42
    finally:
        await reopened.aclose()


_CHILD_COMMIT_AND_DIE = textwrap.dedent(
    """
    import os, sys
    from metadata.kv import open_kv

    kv = open_kv(sys.argv[1])
    for i in range(50):
        kv.transact_sync(lambda tr, i=i: tr.set(b"crash/%03d" % i, b"v%d" % i))
    os._exit(0)  # no close, no checkpoint, no clean-up
    """
)


def test_committed_values_survive_a_writer_dying_without_close(kv: KV, backend: Backend) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_COMMIT_AND_DIE, backend.url],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=_child_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = kv.transact_sync(lambda tr: tr.get_range(b"crash/", b"crash0"))
    assert rows == [(b"crash/%03d" % i, b"v%d" % i) for i in range(50)]


# -- tuple helpers (metadata/tuple_layer.py) --------------------------------------------------


def test_tuple_encoding_is_foundationdb_byte_for_byte() -> None:
    # Vectors from FoundationDB's tuple-layer specification.
    assert kt.pack((None,)) == b"\x00"
    assert kt.pack((b"foo\x00bar",)) == b"\x01foo\x00\xffbar\x00"
    assert kt.pack(("F\u00d4O\u0000bar",)) == b"\x02F\xc3\x94O\x00\xffbar\x00"
    assert (
        kt.pack(((b"foo\x00bar", None, ()),)) == b"\x05\x01foo\x00\xffbar\x00\x00\xff\x05\x00\x00"
    )
    assert kt.pack((-5551212,)) == b"\x11\xab\x4b\x93"
    assert kt.pack((0,)) == b"\x14"
    assert kt.pack((1,)) == b"\x15\x01"
    assert kt.pack((False, True)) == b"\x26\x27"
    assert kt.pack((uuid.UUID(int=1),)) == b"\x30" + (1).to_bytes(16, "big")
    for t in TUPLES_IN_ORDER:
        assert kt.unpack(kt.pack(t)) == t


def test_range_of_and_strinc() -> None:
    assert kt.range_of((1,)) == (b"\x15\x01\x00", b"\x15\x01\xff")
    assert kt.range_of(()) == (b"\x00", b"\xff")
    assert kt.strinc(b"ab") == b"ac"
    assert kt.strinc(b"a\xff\xff") == b"b"
    assert kt.strinc(b"\x00") == b"\x01"
    with pytest.raises(ValueError):
        kt.strinc(b"\xff\xff")
    with pytest.raises(ValueError):
        kt.strinc(b"")


def test_tuple_helpers_do_not_load_the_fdb_client_library() -> None:
    code = "import sys, metadata.tuple_layer as t; t.pack((1, 'a')); assert 'fdb.impl' not in sys.modules"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=_child_env(),
    )
    assert done.returncode == 0, done.stderr


# -- SQLite backend specifics -----------------------------------------------------------


def test_sqlite_file_settings(tmp_path: Path) -> None:
    path = tmp_path / "new" / "folders" / "kv.db"
    kv = SQLiteKV(path)
    try:
        _put(kv, {b"k": b"v"})
        # Reaching into the transaction's connection: these settings are per connection.
        pragmas = kv.transact_sync(
            lambda tr: [
                tr._conn.execute(f"PRAGMA {name}").fetchone()[0]  # type: ignore[attr-defined]
                for name in ("journal_mode", "synchronous", "busy_timeout")
            ]
        )
        assert pragmas == ["wal", 2, 5000]  # synchronous 2 = FULL
        # The commits checkpoint only past the backstop; the store's thread does it before.
        autocheckpoint = kv.transact_sync(
            lambda tr: tr._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]  # type: ignore[attr-defined]
        )
        assert autocheckpoint == sqlite_kv._WAL_BACKSTOP_PAGES
    finally:
        kv.close()
    raw = sqlite3.connect(path)
    try:
        (sql,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'kv'").fetchone()
        assert "WITHOUT ROWID" in sql and "key BLOB PRIMARY KEY" in sql
        assert raw.execute("SELECT key, value FROM kv").fetchall() == [(b"k", b"v")]
    finally:
        raw.close()


def _write_megabytes(kv: SQLiteKV, megabytes: int) -> None:
    """Commit `megabytes` transactions of 1 MB each (256 pages of 4 KB and more)."""
    for n in range(megabytes):
        _put(kv, {b"big/%d/%d" % (n, i): os.urandom(50_000) for i in range(20)})


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sqlite-checkpoint"]


def test_sqlite_commits_leave_checkpoints_to_the_stores_thread(tmp_path: Path) -> None:
    # A thread that never comes round within the test: six commits of 1 MB take the WAL
    # past SQLite's 1,000 pages, and none of them copies it into the database file.
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, checkpoint_interval=3600)
    try:
        _write_megabytes(kv, 6)
        assert path.stat().st_size < 1_000_000
        assert Path(f"{path}-wal").stat().st_size > 6_000_000
        assert kv.stats["checkpoints"] == 0
    finally:
        kv.close()
    # A thread every 50 ms copies them soon after, while no commit runs.
    path = tmp_path / "often.db"
    kv = SQLiteKV(path, checkpoint_interval=0.05)
    try:
        _write_megabytes(kv, 6)
        deadline = time.monotonic() + 10
        # The file has its size before the checkpoint returns (it syncs the file last).
        while time.monotonic() < deadline and (
            path.stat().st_size < 6_000_000 or kv.stats["checkpoints"] == 0
        ):
            time.sleep(0.02)
        assert path.stat().st_size >= 6_000_000
        assert kv.stats["checkpoints"] > 0
        # The WAL starts again from its beginning at the next commit: it stays small.
        _put(kv, {b"small": b"v"})
        assert kv.read_sync(lambda tr: tr.get(b"big/5/19")) is not None
    finally:
        kv.close()


def test_sqlite_commits_checkpoint_themselves_past_the_backstop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread falls behind (here it never runs): the WAL stays bounded all the same.
    monkeypatch.setattr(sqlite_kv, "_WAL_BACKSTOP_PAGES", 200)
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, checkpoint_interval=3600)
    try:
        _write_megabytes(kv, 3)
        assert path.stat().st_size >= 2_000_000
    finally:
        kv.close()


def test_sqlite_checkpoints_left_to_sqlite_without_an_interval(tmp_path: Path) -> None:
    before = set(_checkpoint_threads())
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, checkpoint_interval=None)
    try:
        _write_megabytes(kv, 6)
        assert set(_checkpoint_threads()) == before
        assert path.stat().st_size >= 4_000_000  # SQLite's own, at 1,000 pages
    finally:
        kv.close()
    with pytest.raises(ValueError, match="checkpoint_interval"):
        SQLiteKV(path, checkpoint_interval=0)


def test_sqlite_close_ends_the_checkpoint_thread(tmp_path: Path) -> None:
    before = set(_checkpoint_threads())
    kv = SQLiteKV(tmp_path / "kv.db", checkpoint_interval=3600)
    assert set(_checkpoint_threads()) == before  # started with the first connection
    _put(kv, {b"k": b"v"})
    (started,) = set(_checkpoint_threads()) - before
    kv.close()  # does not wait out the interval
    assert not started.is_alive()


def test_sqlite_checkpoint_thread_of_a_store_dropped_unclosed_ends(tmp_path: Path) -> None:
    import gc

    before = set(_checkpoint_threads())
    kv = SQLiteKV(tmp_path / "kv.db", checkpoint_interval=0.02)
    _put(kv, {b"k": b"v"})
    (started,) = set(_checkpoint_threads()) - before
    del kv
    gc.collect()  # the store's pool refers back to it: a cycle
    started.join(timeout=5)
    assert not started.is_alive()


def test_sqlite_busy_is_retried_until_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, busy_timeout=0.01, retry_deadline=10)
    _put(kv, {b"k": b"0"})
    # Another connection, as another process would hold it; released from a timer thread.
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.3, other.execute, args=("COMMIT",))
    releaser.start()
    try:
        started = time.monotonic()
        assert kv.transact_sync(_incr(b"n")) == 1
        assert time.monotonic() - started >= 0.25
    finally:
        releaser.join()
        other.close()
        kv.close()


def test_sqlite_busy_past_the_deadline_raises_kverror(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, busy_timeout=0.01, retry_deadline=0.3)
    _put(kv, {b"k": b"0"})
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(KVError, match="busy"):
            kv.transact_sync(_incr(b"n"))
        assert 0.2 <= time.monotonic() - started < 3
        # Reads are not blocked by the writer (WAL).
        assert kv.read_sync(lambda tr: tr.get(b"k")) == b"0"
    finally:
        other.rollback()
        other.close()
    assert kv.transact_sync(_incr(b"n")) == 1
    kv.close()


def _hold_lock_file(path: Path) -> int:
    """The database's lock file taken as another process's writer takes it (flock
    excludes another open description in the same process too)."""
    fd = os.open(f"{path}-writer-lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if it is held
    return fd


def test_sqlite_writers_of_other_processes_queue_on_the_lock_file(tmp_path: Path) -> None:
    """A write waits while another process's writer holds the lock file, and goes on as
    soon as it is given back; reads do not wait."""
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path)
    _put(kv, {b"k": b"0"})
    fd = _hold_lock_file(path)
    done = threading.Event()
    writer = threading.Thread(target=lambda: (kv.transact_sync(_incr(b"n")), done.set()))
    try:
        writer.start()
        assert not done.wait(0.3)  # SQLite's own lock is free: only the file holds it
        assert kv.read_sync(lambda tr: tr.get(b"k")) == b"0"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert done.wait(5)
    finally:
        os.close(fd)
        writer.join(5)
    assert kv.read_sync(lambda tr: tr.get(b"n")) == (1).to_bytes(8, "little")
    os.close(_hold_lock_file(path))  # given back after the transaction
    kv.close()


def test_sqlite_store_dropped_unclosed_gives_its_lock_file_descriptor_back(
    tmp_path: Path,
) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    kv.transact_sync(_incr(b"n"))
    kv.close()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        SQLiteKV(tmp_path / "kv.db")  # never closed
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_sqlite_lock_file_held_past_the_deadline_raises_kverror(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    kv = SQLiteKV(path, retry_deadline=0.3)
    _put(kv, {b"k": b"0"})
    fd = _hold_lock_file(path)
    try:
        started = time.monotonic()
        with pytest.raises(KVError, match="another process's SQLite writer lock"):
            kv.transact_sync(_incr(b"n"))
        assert 0.2 <= time.monotonic() - started < 3
    finally:
        os.close(fd)
    assert kv.transact_sync(_incr(b"n")) == 1  # this process's lock was given back too
    kv.close()


async def test_sqlite_cancelled_transact_still_ends_its_transaction(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db", pool_size=1)  # one connection: a stuck one would show
    inside = threading.Event()

    def slow(tr: Transaction) -> None:
        tr.set(b"k", b"v")
        inside.set()
        time.sleep(0.2)

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(kv.transact, slow)
        await anyio.to_thread.run_sync(inside.wait)
        tg.cancel_scope.cancel()
    # The cancelled await waited for the worker thread, which committed.
    assert time.monotonic() - started >= 0.2
    assert await kv.read(lambda tr: tr.get(b"k")) == b"v"
    assert not any(conn.in_transaction for conn in kv._pool._idle)
    await kv.transact(lambda tr: tr.set(b"k2", b"v2"))
    await kv.aclose()


def test_sqlite_refuses_non_bytes_keys_and_values(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    try:
        with pytest.raises(TypeError):
            kv.transact_sync(lambda tr: tr.set("text", b"v"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            kv.transact_sync(lambda tr: tr.set(b"k", "text"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            kv.read_sync(lambda tr: tr.get_range("a", b"z"))  # type: ignore[arg-type]
        assert kv.read_sync(lambda tr: tr.get_range(b"", b"\xff")) == []
    finally:
        kv.close()


def test_sqlite_transaction_is_unusable_after_its_function(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    leaked = kv.transact_sync(lambda tr: tr)
    with pytest.raises(KVError):
        leaked.set(b"k", b"v")
    kv.close()
    with pytest.raises(KVError, match="closed"):
        kv.transact_sync(lambda tr: tr.get(b"k"))


def test_sqlite_writes_a_key_added_to_many_times_once(tmp_path: Path) -> None:
    """Adds are summed per key and written at the end: rows written, as SQLite counts
    them on the transaction's connection (total_changes)."""
    kv = SQLiteKV(tmp_path / "kv.db")

    def fn(tr: Transaction) -> int:
        conn = tr._conn  # type: ignore[attr-defined]
        before = conn.total_changes
        for _ in range(100):
            tr.add(b"objects", 1)
            tr.add(b"bytes", 4096)
        tr.set(b"other", b"v")
        tr._before_commit()  # type: ignore[attr-defined]  (what the commit runs)
        return int(conn.total_changes - before)

    try:
        assert kv.transact_sync(fn) == 3
        assert decode_i64(_get(kv, b"objects")) == 100
        assert decode_i64(_get(kv, b"bytes")) == 409600
        with pytest.raises(KVError):
            kv.transact_sync(lambda tr: tr).add(b"objects", 1)  # after its function
    finally:
        kv.close()


def test_sqlite_reads_many_pairs_as_a_few_rows(tmp_path: Path, monkeypatch) -> None:
    """A cursor gives up the GIL for each row it steps to and waits to take it back (a
    long wait beside a busy event loop): a range or a batch of keys comes back from
    SQLite as one row per page, not one row per pair. Rows counted as the cursors hand
    them over."""
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k/%05d" % i: b"v%d" % i for i in range(9_000)})
    rows = [0]
    execute = sqlite_kv._ReadTx._execute

    class Counting:
        def __init__(self, cursor: sqlite3.Cursor) -> None:
            self._cursor = cursor

        def fetchone(self) -> Any:
            row = self._cursor.fetchone()
            rows[0] += row is not None
            return row

        def fetchall(self) -> list[Any]:
            found = self._cursor.fetchall()
            rows[0] += len(found)
            return found

    monkeypatch.setattr(sqlite_kv._ReadTx, "_execute", lambda self, *a: Counting(execute(self, *a)))

    def read(tr: ReadTransaction) -> tuple[int, int]:
        many = tr.get_many([b"k/%05d" % i for i in range(0, 9_000, 40)])
        pairs = tr.get_range(b"k/", b"k0")
        return len(pairs), sum(v is not None for v in many)

    try:
        assert kv.transact_sync(read) == (9_000, 225)
        pages = -(-9_000 // sqlite_kv._PAGE)
        assert rows[0] <= pages + 1  # a row per page of the range, one for the keys
    finally:
        kv.close()


def test_sqlite_reads_many_ranges_with_one_statement_per_many(tmp_path: Path, monkeypatch) -> None:
    """Every statement gives up the GIL and waits to take it back: `get_ranges` reads up
    to MANY ranges with one (a compaction commit compares one range per partition of
    its job)."""
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k/%05d" % i: b"v%d" % i for i in range(2_000)})
    statements: list[str] = []
    execute = sqlite_kv._ReadTx._execute

    def counting(self: Any, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
        statements.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(sqlite_kv._ReadTx, "_execute", counting)
    ranges = [(b"k/%05d" % i, b"k/%05d" % (i + 3)) for i in range(0, 2_000, 5)]  # 400
    try:
        found = kv.read_sync(lambda tr: tr.get_ranges(ranges))
        assert len(statements) == 2  # 256 ranges, then 144
        assert found == [
            [(b"k/%05d" % j, b"v%d" % j) for j in range(i, i + 3)] for i in range(0, 2_000, 5)
        ]
    finally:
        kv.close()


def test_sqlite_refuses_memory_databases() -> None:
    with pytest.raises(ValueError):
        SQLiteKV(":memory:")


def test_open_kv_sqlite_url(tmp_path: Path) -> None:
    from metadata.kv import open_kv

    kv = open_kv(f"sqlite://{tmp_path}/a/b.db")
    assert isinstance(kv, SQLiteKV)
    kv.transact_sync(lambda tr: tr.set(b"k", b"v"))
    anyio.run(kv.aclose)
    assert (tmp_path / "a" / "b.db").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sqlite_store_refuses_to_run_in_a_forked_child(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k": b"v"})
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        try:
            kv.transact_sync(lambda tr: tr.get(b"k"))
        except KVError:
            os._exit(0)
        except BaseException:
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kv.read_sync(lambda tr: tr.get(b"k")) == b"v"  # the parent is unaffected
    kv.close()


async def test_quick_read_returns_what_read_returns(kv: KV) -> None:
    _put(kv, {b"a": b"1", b"b": b"2", b"c": b"3"})

    def fn(tr: ReadTransaction) -> tuple[bytes | None, list[tuple[bytes, bytes]]]:
        return tr.get(b"a"), tr.get_range(b"b", b"z")

    assert await kv.read(fn, quick=True) == await kv.read(fn)
    with pytest.raises(ZeroDivisionError):
        await kv.read(lambda tr: 1 // 0, quick=True)
    assert await kv.read(lambda tr: tr.get(b"c"), quick=True) == b"3"


async def test_sqlite_quick_read_runs_on_the_calling_thread(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k": b"v"})  # leaves an idle connection in the pool
    here = threading.get_ident()

    def where(tr: ReadTransaction) -> tuple[int, bytes | None]:
        return threading.get_ident(), tr.get(b"k")

    assert await kv.read(where, quick=True) == (here, b"v")
    thread, value = await kv.read(where)
    assert thread != here and value == b"v"
    assert (kv.stats["reads"], kv.stats["quick_reads"]) == (2, 1)
    await kv.aclose()


async def test_sqlite_quick_read_needs_no_pooled_connection(tmp_path: Path) -> None:
    # A writer holds the pool's only connection in the middle of its transaction: a quick
    # read still runs at once on the calling thread, on its own connection, and sees the
    # last committed snapshot.
    kv = SQLiteKV(tmp_path / "kv.db", pool_size=1)
    _put(kv, {b"k": b"v"})
    inside = threading.Event()
    go_on = threading.Event()
    here = threading.get_ident()

    def slow(tr: Transaction) -> None:
        tr.set(b"k", b"v2")
        inside.set()
        go_on.wait(5)

    def where(tr: ReadTransaction) -> tuple[int, bytes | None]:
        return threading.get_ident(), tr.get(b"k")

    async with anyio.create_task_group() as tg:
        tg.start_soon(kv.transact, slow)
        await anyio.to_thread.run_sync(inside.wait)
        try:
            assert await kv.read(where, quick=True) == (here, b"v")
        finally:
            go_on.set()
    assert await kv.read(where, quick=True) == (here, b"v2")
    assert kv.stats["quick_reads"] == 2
    await kv.aclose()


async def test_sqlite_quick_read_waits_in_a_thread_when_its_connection_is_in_use(
    tmp_path: Path,
) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k": b"v"})
    await kv.read(lambda tr: tr.get(b"k"), quick=True)  # opens the quick connection
    inside = threading.Event()
    here = threading.get_ident()

    def slow(tr: ReadTransaction) -> bytes | None:  # holds the quick connection for 0.3 s
        inside.set()
        time.sleep(0.3)
        return tr.get(b"k")

    def elsewhere() -> bytes | None:  # a quick read of another event loop, in a thread
        async def read() -> bytes | None:
            return await kv.read(slow, quick=True)

        return anyio.run(read)

    def where(tr: ReadTransaction) -> tuple[int, bytes | None]:
        return threading.get_ident(), tr.get(b"k")

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, elsewhere)
        await anyio.to_thread.run_sync(inside.wait)
        tg.start_soon(ticker)
        thread, value = await kv.read(where, quick=True)
        assert thread != here and value == b"v"  # read in a worker thread
        await anyio.sleep(0.35)  # the other read ends
        tg.cancel_scope.cancel()
    assert ticks >= 10  # the event loop kept running meanwhile
    assert kv.stats["quick_reads"] == 2  # the first read and the other loop's
    await kv.aclose()


def test_sqlite_close_closes_the_quick_connection(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k": b"v"})

    async def main() -> None:
        assert await kv.read(lambda tr: tr.get(b"k"), quick=True) == b"v"

    anyio.run(main)
    conn = kv._quick
    assert conn is not None
    kv.close()
    assert kv._quick is None
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")

    async def after() -> None:
        with pytest.raises(KVError):
            await kv.read(lambda tr: tr.get(b"k"), quick=True)

    anyio.run(after)


async def test_sqlite_quick_read_goes_to_a_thread_when_sqlite_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A WAL reader meets SQLITE_BUSY only in rare moments (WAL recovery or restart), so
    # the busy answer is injected: the first attempt on the event loop's thread fails.
    from metadata import sqlite_kv

    kv = SQLiteKV(tmp_path / "kv.db")
    _put(kv, {b"k": b"v"})
    here = threading.get_ident()
    real_once = SQLiteKV._once
    attempts: list[int] = []

    def busy_once(self: SQLiteKV, conn: Any, fn: Any, make_tx: Any, broken: list[bool]) -> Any:
        attempts.append(threading.get_ident())
        if threading.get_ident() == here:
            raise sqlite_kv._Retry("SQLite busy: database is locked")
        return real_once(self, conn, fn, make_tx, broken)

    monkeypatch.setattr(SQLiteKV, "_once", busy_once)
    assert await kv.read(lambda tr: tr.get(b"k"), quick=True) == b"v"
    assert attempts[0] == here and attempts[1:] and attempts[-1] != here
    assert kv.stats["retries"] == 1
    assert kv.stats["quick_reads"] == 0  # the read that was done went to a thread
    monkeypatch.undo()
    assert await kv.read(lambda tr: tr.get(b"k"), quick=True) == b"v"
    await kv.aclose()
