"""CPU of two metadata steps that count the same tallies many times, on SQLite: the
deletion step's `forget_deleted` of 100 objects and a retention step's drop of 1,000
chunk entries (metadata.lifecycle: `drop_entries` where the tree has it, else
`drop_entry` of each). Medians of ten rounds after two, in
milliseconds of the calling thread's CPU (the fsync of the commit is not in it).

    .venv/bin/python integration/bench/tally_steps.py

To compare two trees, run it with PYTHONPATH set to each (a checkout of the other
commit first on the path)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from metadata import keys
from metadata import lifecycle as lc
from metadata.kv import Transaction
from metadata.log import ChunkEntry, put_entry
from metadata.sqlite_kv import SQLiteKV

ROUNDS = 12
OBJECTS = 100
ENTRIES = 1000
TOPIC_ID = b"\x01" * 16


def one_round(kv: SQLiteKV, sub: keys.Subspace, n: int) -> tuple[float, float]:
    """Seconds of CPU of the retention step and of the deletion step."""
    objects = [f"ingest/o{n:02d}-{i:04d}" for i in range(OBJECTS)]
    entries = [
        ChunkEntry(objects[j % OBJECTS], j, 10, n * ENTRIES + j, n * ENTRIES + j, 1, 0)
        for j in range(ENTRIES)
    ]
    dead = [lc.DeadObject(1010, o, 1000) for o in objects]

    def fill(tr: Transaction) -> None:
        for o in objects:
            lc.put_object(tr, sub, o, lc.ObjectRecord(1000, ENTRIES // OBJECTS, 1, None, 0))
        for e in entries:
            put_entry(tr, sub, TOPIC_ID, 0, e)

    def drop(tr: Transaction) -> None:
        drop_entries = getattr(lc, "drop_entries", None)
        if drop_entries is not None:
            drop_entries(tr, sub, TOPIC_ID, [(0, e) for e in entries], 10, 1000)
            return
        for e in entries:
            lc.drop_entry(tr, sub, TOPIC_ID, 0, e, 10, 1000)

    def forget(tr: Transaction) -> None:
        lc.forget_deleted(tr, sub, dead)

    kv.transact_sync(fill)
    began = time.thread_time()
    kv.transact_sync(drop)
    dropped = time.thread_time()
    kv.transact_sync(forget)
    return dropped - began, time.thread_time() - dropped


def main() -> None:
    kv = SQLiteKV(Path(tempfile.mkdtemp()) / "kv.db")
    sub = keys.Subspace(("bucketlog", "bench"))
    try:
        rounds = [one_round(kv, sub, n) for n in range(ROUNDS)][2:]
    finally:
        kv.close()
    drop_ms = statistics.median(r[0] for r in rounds) * 1000
    forget_ms = statistics.median(r[1] for r in rounds) * 1000
    print(f"forget_deleted x100: {forget_ms:.2f} ms, 1,000 entries dropped: {drop_ms:.2f} ms")


if __name__ == "__main__":
    main()
