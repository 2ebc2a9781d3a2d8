"""Time under SQLite's writer lock of one produce commit (`metadata.log.commit_ingest`):
one ingest file holding a batch of each of `--producers` producers (idempotent unless
0: then one batch without a producer id) in each of `--partitions` partitions, on a
metadata file that holds the earlier rounds' entries too. Medians of `--rounds` rounds
after two, in milliseconds: the transaction's wall time and its thread's CPU time.
With `--busy`, a thread runs Python beside the commit all along, as the agent's event
loop does: each statement the commit runs gives up the GIL and waits to take it back.

    .venv/bin/python integration/bench/ingest_commit_step.py --partitions 4

To compare two trees, run it with PYTHONPATH set to each (a checkout of the other
commit first on the path)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from commit_step import busy_thread

from metadata import cluster, keys, log, producers, topics
from metadata.sqlite_kv import SQLiteKV

SUB = keys.Subspace(("bench",))
BATCH_BYTES = 16 * 1024


def one_round(
    kv: SQLiteKV, topic_id: bytes, partitions: int, pids: list[int], n: int
) -> tuple[float, float]:
    """(wall s, CPU s) of the commit's transaction."""
    batches, start = [], 0
    for partition in range(partitions):
        for pid in pids or [-1]:
            batches.append(
                log.PendingBatch(
                    topic_id=topic_id,
                    partition=partition,
                    start=start,
                    length=BATCH_BYTES,
                    last_offset_delta=9,
                    max_timestamp=1_000 + n,
                    producer_id=pid,
                    producer_epoch=0 if pid >= 0 else -1,
                    base_sequence=10 * n if pid >= 0 else -1,
                )
            )
            start += BATCH_BYTES
    key = f"ingest/{n:012d}"
    wall, cpu = time.perf_counter(), time.thread_time()
    results = kv.transact_sync(
        lambda tr: log.commit_ingest(tr, SUB, key, start, 1_000 + n, batches)
    )
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if any(r.error for r in results):
        raise RuntimeError(f"refused: {results}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--busy", action="store_true", help="a thread running Python beside")
    args = parser.parse_args()
    done = busy_thread(args.busy)
    with tempfile.TemporaryDirectory() as folder:
        kv = SQLiteKV(str(Path(folder) / "metadata.db"))
        topic = kv.transact_sync(
            lambda tr: topics.create_topic(tr, SUB, "t", b"\x01" * 16, args.partitions, {}, 0)
        )

        def new_producer(tr) -> int:  # type: ignore[no-untyped-def]
            pid = cluster.allocate_producer_id(tr, SUB)
            producers.put_producer(tr, SUB, producers.ProducerIdentity(pid, 0, None))
            return pid

        pids = [kv.transact_sync(new_producer) for _ in range(args.producers)]
        rounds = [
            one_round(kv, topic.topic_id, args.partitions, pids, n) for n in range(args.rounds + 2)
        ][2:]
        kv.close()
    done.set()
    wall, cpu = (statistics.median(column) * 1000 for column in zip(*rounds, strict=True))
    print(
        f"{'beside a busy thread: ' if args.busy else ''}{args.partitions} partitions x "
        f"{args.producers} producers: commit {wall:.2f} ms wall, {cpu:.2f} ms CPU "
        f"(medians of {args.rounds})"
    )


if __name__ == "__main__":
    main()
