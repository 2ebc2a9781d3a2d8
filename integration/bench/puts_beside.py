"""Concurrent puts to the local store, each with its own fsync of the folder or sharing
them, alone or beside a writer of large objects.

`.venv/bin/python integration/bench/puts_beside.py [--seconds 20] [--threads 8]
[--rounds 2] [--dir PATH] [--out FILE]` runs, in a temporary folder on the disk under
test (default: next to this checkout), THREADS threads that each put a 100 KB object
into `ingest/` of one `LocalObjectStore` and then wait 5 ms, over and over, as an
agent's flushes do when several are in flight. Each round runs four variants one after
the other:

- `shared-alone`, `each-alone`: no other writer;
- `shared-beside`, `each-beside`: beside a process writing 64 MiB files as the local
  store writes a compaction output (fsync_beside.py's `sync-2m` writer).

`shared` is the store as it is (puts that publish while an fsync of the folder runs
share the next one); `each` gives every put an fsync of the folder of its own, as the
store did before. For each it prints the puts per second, p50, p99 and maximum time of
a put, and the fsyncs of the folder per put. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fsync_beside import large_writer  # noqa: E402

from storage import local  # noqa: E402
from storage.ingest import new_object_key  # noqa: E402

PUT_BYTES = 100_000
PAUSE_S = 0.005
VARIANTS = ("shared-alone", "each-alone", "shared-beside", "each-beside")


def run_variant(folder: str, variant: str, seconds: float, threads: int) -> dict[str, object]:
    sharing, beside = variant.split("-")
    store = local.LocalObjectStore(os.path.join(folder, variant))
    store.put_sync("ingest/first", b"x")
    folder_fsyncs = [0]
    if sharing == "each":

        def each(path: str) -> None:
            folder_fsyncs[0] += 1
            local._fsync_dir(path)

        store._folder_syncs.sync = each  # type: ignore[method-assign]
    stop = multiprocessing.Event()
    large_out: multiprocessing.Queue = multiprocessing.Queue()
    large = None
    if beside == "beside":
        large = multiprocessing.Process(
            target=large_writer, args=(folder, "sync-2m", stop, large_out)
        )
        large.start()
        time.sleep(1.0)
    data = os.urandom(PUT_BYTES)
    times: list[float] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def putter() -> None:
        while time.monotonic() < end:
            key = new_object_key()
            began = time.perf_counter()
            store.put_sync(key, data, if_absent=True)
            took = (time.perf_counter() - began) * 1000
            with lock:
                times.append(took)
            os.unlink(os.path.join(store.root, key))
            time.sleep(PAUSE_S)

    before = store._folder_syncs.fsyncs
    workers = [threading.Thread(target=putter) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    mbs = 0.0
    if large is not None:
        stop.set()
        mbs = large_out.get()
        large.join()
    times.sort()
    fsyncs = folder_fsyncs[0] + store._folder_syncs.fsyncs - before
    return {
        "variant": variant,
        "puts": len(times),
        "puts_s": round(len(times) / seconds, 1),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[int(len(times) * 0.99)], 2),
        "max_ms": round(times[-1], 2),
        "folder_fsyncs_per_put": round(fsyncs / len(times), 3),
        "large_mb_s": round(mbs, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="puts-beside-", dir=args.dir) as folder:
        for round_ in range(args.rounds):
            for variant in VARIANTS:
                row = run_variant(folder, variant, args.seconds, args.threads)
                row["round"] = round_ + 1
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        body = {"threads": args.threads, "seconds": args.seconds, "rows": rows}
        Path(args.out).write_text(json.dumps(body, indent=1) + "\n")


if __name__ == "__main__":
    main()
