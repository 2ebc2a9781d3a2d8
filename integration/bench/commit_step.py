"""Time under SQLite's writer lock of one level-1 compaction commit: `--inputs` ingest
files of `--partitions` partitions each (one chunk entry per partition and file; 64, as
the flushes of an object store hold; a local folder's flushes hold a few) re-pointed to
one output, on a metadata file that holds the earlier rounds' entries too. With
`--spread`, the topic has that many partitions and each file holds the next ones in
turn (a soak's flushes: `--partitions 2 --spread 64`), so that a job's entries lie in
many partitions. Medians of
`--rounds` rounds after two, in milliseconds: the transaction's wall time and its
thread's CPU time; and, where the tree has it, the CPU of preparing the commit before
the transaction (`metadata.compaction.prepare_commit`). With `--busy`, a thread runs
Python beside the commit all along, as the agent's event loop does: each statement the
commit runs gives up the GIL and waits to take it back.

    .venv/bin/python integration/bench/commit_step.py

To compare two trees, run it with PYTHONPATH set to each (a checkout of the other
commit first on the path)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from metadata import compaction as cp
from metadata import keys
from metadata import lifecycle as lc
from metadata.kv import Transaction
from metadata.log import ChunkEntry, put_entry
from metadata.sqlite_kv import SQLiteKV

TOPIC_ID = b"\x01" * 16
SUB = keys.Subspace(("bench",))
ENTRY_BYTES = 256 * 1024


class Files:
    """Ingest files committed as the agent commits them: entries, record, queue row.
    Each file holds `partitions` of the topic's `spread` partitions, the next ones in
    turn (a soak's flushes hold two or so of its 64)."""

    def __init__(self, partitions: int, spread: int) -> None:
        self.partitions = partitions
        self.spread = max(spread, partitions)
        self.offsets = [0] * self.spread
        self.next = 0
        self.created = 1_000

    def add(self, tr: Transaction, count: int) -> None:
        for _ in range(count):
            key = f"ingest/{self.created:012d}"
            position = 0
            chosen = sorted((self.next + i) % self.spread for i in range(self.partitions))
            self.next = (self.next + self.partitions) % self.spread
            for partition in chosen:
                base = self.offsets[partition]
                entry = ChunkEntry(key, position, 2_500, base, base + 2, 1, self.created)
                put_entry(tr, SUB, TOPIC_ID, partition, entry)
                self.offsets[partition] += 3
                position += 2_500
            lc.put_object(
                tr, SUB, key, lc.ObjectRecord(position, self.partitions, self.created, None, 0)
            )
            tr.set(SUB.key(keys.L0_OBJECT, self.created, key), keys.pack_value(()))
            self.created += 1


def one_round(kv: SQLiteKV, files: Files, inputs: int, n: int) -> tuple[float, float, float, float]:
    """(wall s, CPU s) of the commit's transaction, CPU s of preparing it and CPU s of
    the plan's claim (its transaction; the selection before it only reads)."""
    kv.transact_sync(lambda tr: files.add(tr, inputs))
    now = files.created + 10**6
    limits = cp.Limits(max_inputs=inputs, max_entries=10**6, max_bytes=1 << 40)
    selection = kv.read_sync(lambda tr: cp.select_l1(tr, SUB, now, 0, limits))
    claim_cpu = time.thread_time()
    plan = kv.transact_sync(lambda tr: cp.claim_l1(tr, SUB, selection, 1, now, 60_000))
    claim_cpu = time.thread_time() - claim_cpu
    if plan is None or len(plan.input_keys) != inputs:
        raise RuntimeError(f"planned {plan and len(plan.input_keys)} of {inputs} files")
    starts, position = [], 0
    for _topic, _partition, entries in plan.partitions():
        starts.append(position)
        position += sum(e.length for e in entries)
    key = f"level1/{n:06d}"
    outputs = cp.output_entries(plan, key, starts, ENTRY_BYTES)
    prepare = getattr(cp, "prepare_commit", None)
    prepared_cpu = 0.0
    if prepare is not None:
        began = time.thread_time()
        prepared = prepare(SUB, plan, key, position, outputs)
        prepared_cpu = time.thread_time() - began

        def commit(tr: Transaction) -> cp.JobResult:
            return cp.commit_prepared(tr, SUB, prepared, 1, now, 60_000)
    else:

        def commit(tr: Transaction) -> cp.JobResult:
            return cp.commit_job(tr, SUB, plan, 1, key, position, outputs, now, 60_000)

    wall, cpu = time.perf_counter(), time.thread_time()
    result = kv.transact_sync(commit)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if not result.committed:
        raise RuntimeError(result.reason)
    return wall, cpu, prepared_cpu, claim_cpu


def _spin(done: threading.Event) -> None:
    """Python bytecode without pause until done (no system call gives the GIL up)."""
    total = 0
    while not done.is_set():
        for i in range(10_000):
            total += i


def busy_thread(on: bool) -> threading.Event:
    """With `on`, a daemon thread spinning in Python (`_spin`) until the event is set."""
    done = threading.Event()
    if on:
        threading.Thread(target=_spin, args=(done,), daemon=True).start()
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument(
        "--spread", type=int, default=0, help="the topic's partitions (default: --partitions)"
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--busy", action="store_true", help="a thread running Python beside")
    args = parser.parse_args()
    done = busy_thread(args.busy)
    with tempfile.TemporaryDirectory() as folder:
        kv = SQLiteKV(str(Path(folder) / "metadata.db"))
        kv.transact_sync(lambda tr: tr.set(SUB.key(keys.TOPIC, TOPIC_ID), keys.pack_value(("t",))))
        files = Files(args.partitions, args.spread)
        rounds = [one_round(kv, files, args.inputs, n) for n in range(args.rounds + 2)][2:]
        kv.close()
    wall, cpu, prepared, claim = (
        statistics.median(column) * 1000 for column in zip(*rounds, strict=True)
    )
    done.set()
    print(
        f"{'beside a busy thread: ' if args.busy else ''}{args.inputs} files x {args.partitions} "
        f"partitions of {files.spread}: commit {wall:.1f} ms wall, "
        f"{cpu:.1f} ms CPU under the lock; prepared before it in {prepared:.1f} ms CPU; "
        f"the plan's claim {claim:.2f} ms CPU "
        f"(medians of {args.rounds})"
    )


if __name__ == "__main__":
    main()
