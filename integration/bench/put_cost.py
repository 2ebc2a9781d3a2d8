"""What one durable put costs the local store's worker thread, against the same bytes
written into a file that already exists.

Each of `--rounds` rounds times `--puts` writes of `--size` bytes in one thread, every
variant in turn, in a fresh folder of its own (a folder where many files were just
deleted is slower to create files in: see `--after-deletes`; nothing is deleted before
the end), and prints the thread's system and user CPU per put (getrusage(RUSAGE_THREAD))
and the p50 and p99 of a put's wall time. A pause of `--pause-ms` between puts lets
writeback run as it does between flushes.

    store     LocalObjectStore.put_sync(if_absent=True), as a flush is uploaded: a new
              temp file, written, fsync'd, linked to its name, the folder fsync'd
    new-file  a new file written and fsync'd, nothing else
    segment   pwrite at the next offset of one file preallocated (posix_fallocate) for
              all the round's puts, then fdatasync: no new inode, no folder change
    segment-append  the same into a file not preallocated (each write extends it)

With `--after-deletes N`, each round first creates and deletes N files in the variant's
folder (as the garbage collector deletes ingest files beside the new ones).

    .venv/bin/python integration/bench/put_cost.py --dir /var/tmp/put-cost
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from storage.local import LocalObjectStore  # noqa: E402

VARIANTS = ("store", "new-file", "segment", "segment-append")


def one_round(variant: str, folder: Path, puts: int, data: bytes, pause: float, deletes: int):
    folder.mkdir(parents=True)
    for i in range(deletes):
        victim = folder / f"deleted-{i}"
        victim.write_bytes(data[:4096])
        victim.unlink()
    store = LocalObjectStore(str(folder / "store"))
    segment_fd = -1
    if variant.startswith("segment"):
        segment_fd = os.open(folder / "segment", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        if variant == "segment":
            os.posix_fallocate(segment_fd, 0, len(data) * puts)
        os.fsync(segment_fd)
    walls = []
    before = resource.getrusage(resource.RUSAGE_THREAD)
    for i in range(puts):
        began = time.perf_counter()
        if variant == "store":
            store.put_sync(f"ingest/{i:08d}", data, if_absent=True)
        elif variant == "new-file":
            fd = os.open(folder / f"{i:08d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            os.pwrite(segment_fd, data, i * len(data))
            os.fdatasync(segment_fd)
        walls.append(time.perf_counter() - began)
        time.sleep(pause)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    if segment_fd >= 0:
        os.close(segment_fd)
    walls.sort()
    return {
        "variant": variant,
        "system_us_per_put": round(1e6 * (after.ru_stime - before.ru_stime) / puts),
        "user_us_per_put": round(1e6 * (after.ru_utime - before.ru_utime) / puts),
        "p50_ms": round(1e3 * walls[len(walls) // 2], 3),
        "p99_ms": round(1e3 * walls[int(len(walls) * 0.99)], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="a folder on the file system to measure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--puts", type=int, default=800)
    parser.add_argument("--size", type=int, default=450_000, help="bytes per put")
    parser.add_argument("--pause-ms", type=float, default=2.0)
    parser.add_argument("--after-deletes", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    data = os.urandom(args.size)
    try:
        for n in range(args.rounds):
            for variant in args.variants.split(","):
                folder = root / f"round-{n}-{variant}"
                result = one_round(
                    variant, folder, args.puts, data, args.pause_ms / 1000, args.after_deletes
                )
                result.update(round=n, size=args.size, after_deletes=args.after_deletes)
                print(json.dumps(result), flush=True)
    finally:  # deleted only at the end: deletes make the next rounds' files dearer
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
