"""A read-write transaction worked out on a snapshot and applied only if its reads still hold.

On SQLite every read-write transaction holds the one writer lock from its first statement
to its COMMIT, and every produce commit that comes meanwhile waits behind it; a commit
waits for the whole of a long hold, and the flushes after it wait for that commit (they
commit in flush order). A background transaction (a level-2 compaction plan, a
compaction's commit) need not hold the lock while it reads and decides: only while its
reads are asked again and its writes made. `SQLiteKV.transact_optimistic` runs this way;
the function works over any KV.

Rules:

- `transact_optimistic(kv, fn)` first runs fn in a read transaction (one snapshot, no
  writer lock) against a recorder: each read is recorded with its answer, each write is
  kept, in order, and not applied. Then one read-write transaction asks every recorded
  read again; if every answer is the same, it applies the kept writes in their order
  and the call returns fn's result. fn is then as if it had run in that transaction: it
  saw the same values, so it made the same writes.
- fn must decide from its arguments and its reads only (no clock, no randomness, no
  state kept between runs that changes what it writes), as a transaction function
  retried by FoundationDB must.
- When an answer differs (another transaction changed what fn read), fn is worked out
  again on a new snapshot, up to `SNAPSHOT_TRIES` snapshots in all; after that, or as
  soon as fn reads a key it wrote before in the same run (the recorder cannot answer
  that from a snapshot), fn runs again the ordinary way, inside the read-write
  transaction: the result is always what `kv.transact(fn)` would have given.
- An exception raised by fn on the snapshot propagates, and nothing is written.
- The caller's `OptimisticCounts`, if given, counts the outcomes: applied, changed (ran
  under the lock after its last snapshot changed), overlapped (ran under the lock), and
  retried (snapshots that changed before the last).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from metadata.kv import KV, OptimisticCounts, ReadTransaction, Transaction

T = TypeVar("T")


class _Overlap(BaseException):
    """fn read a key it had written: the snapshot cannot answer for its own writes. (Not
    an Exception: a function that catches those does not swallow it.)"""


class _Recorder:
    """A `Transaction` over a snapshot: reads recorded, writes kept."""

    def __init__(self, tr: ReadTransaction) -> None:
        self._tr = tr
        self.reads: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = []
        self.writes: list[tuple[str, tuple[Any, ...]]] = []
        self._keys: list[bytes] = []  # written keys, sorted
        self._ranges: list[tuple[bytes, bytes]] = []  # cleared ranges

    # -- writes --------------------------------------------------------------------------

    def _wrote(self, key: bytes) -> None:
        at = bisect.bisect_left(self._keys, key)
        if at == len(self._keys) or self._keys[at] != key:
            self._keys.insert(at, key)

    def set(self, key: bytes, value: bytes) -> None:
        self.writes.append(("set", (key, value)))
        self._wrote(key)

    def clear(self, key: bytes) -> None:
        self.writes.append(("clear", (key,)))
        self._wrote(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self.writes.append(("clear_range", (begin, end)))
        self._ranges.append((begin, end))

    def add(self, key: bytes, delta: int) -> None:
        self.writes.append(("add", (key, delta)))
        self._wrote(key)

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        items = list(items)
        self.writes.append(("set_many", (items,)))
        for key, _value in items:
            self._wrote(key)

    def clear_many(self, keys: Sequence[bytes]) -> None:
        keys = list(keys)
        self.writes.append(("clear_many", (keys,)))
        for key in keys:
            self._wrote(key)

    def clear_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> None:
        ranges = list(ranges)
        self.writes.append(("clear_ranges", (ranges,)))
        self._ranges.extend(ranges)

    # -- reads ---------------------------------------------------------------------------

    def _check(self, begin: bytes, end: bytes) -> None:
        """Refuse a read of [begin, end) that meets a write of this run."""
        at = bisect.bisect_left(self._keys, begin)
        if at < len(self._keys) and self._keys[at] < end:
            raise _Overlap
        if any(b < end and begin < e for b, e in self._ranges):
            raise _Overlap

    def _read(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        answer = getattr(self._tr, name)(*args, **kwargs)
        # The answer is kept as a copy: fn may change the lists it is given.
        if name == "get_ranges":
            kept = [list(rows) for rows in answer]
        else:
            kept = list(answer) if isinstance(answer, list) else answer
        self.reads.append((name, args, kwargs, kept))
        return answer

    def get(self, key: bytes) -> bytes | None:
        self._check(key, key + b"\x00")
        return self._read("get", (key,), {})  # type: ignore[no-any-return]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        keys = list(keys)
        for key in keys:
            self._check(key, key + b"\x00")
        return self._read("get_many", (keys,), {})  # type: ignore[no-any-return]

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        self._check(begin, end)
        return self._read(  # type: ignore[no-any-return]
            "get_range", (begin, end), {"limit": limit, "reverse": reverse}
        )

    def get_ranges(self, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        ranges = list(ranges)
        for begin, end in ranges:
            self._check(begin, end)
        return self._read("get_ranges", (ranges,), {})  # type: ignore[no-any-return]


_CHANGED = object()
# Snapshots fn is worked out on before it runs under the lock: a change between one and
# its check is most often another job's commit, done by the next snapshot.
SNAPSHOT_TRIES = 2


async def transact_optimistic(
    kv: KV, fn: Callable[[Transaction], T], counts: OptimisticCounts | None = None
) -> T:
    """fn's result and writes as `kv.transact(fn)` would give them, with the writer lock
    held only to check its reads and apply its writes (see the module)."""
    counts = counts if counts is not None else OptimisticCounts()

    def on_snapshot(tr: ReadTransaction) -> tuple[_Recorder, T] | None:
        recorder = _Recorder(tr)
        try:
            return recorder, fn(recorder)
        except _Overlap:
            return None

    for attempt in range(SNAPSHOT_TRIES):
        ran = await kv.read(on_snapshot)
        if ran is None:
            counts.overlapped += 1
            return await kv.transact(fn)
        recorder, result = ran
        applied = await kv.transact(partial(_apply, recorder, result))
        if applied is not _CHANGED:
            counts.applied += 1
            return result
        if attempt + 1 < SNAPSHOT_TRIES:
            counts.retried += 1
    counts.changed += 1
    return await kv.transact(fn)


def _apply(recorder: _Recorder, result: object, tr: Transaction) -> object:
    """Under the lock: the recorded reads asked again, and the kept writes made if every
    answer is the same (else _CHANGED, nothing written)."""
    for name, args, kwargs, answer in recorder.reads:
        if getattr(tr, name)(*args, **kwargs) != answer:
            return _CHANGED
    for name, args in recorder.writes:
        getattr(tr, name)(*args)
    return result
