"""How long a flush's small write and fsync takes beside a writer of large objects.

`.venv/bin/python integration/bench/fsync_beside.py [--seconds 20] [--dir PATH]
[--writer MODE ...] [--delete HOW ...] [--small HOW ...] [--piece-kib N ...] [--rounds 1]
[--out FILE]` runs, in a folder on
the disk under test (default: a temporary folder next to this checkout), a small writer
that writes 100 KB to a new file and fsyncs it every 5 ms, as the agent's flushes do,
and beside it a large writer that writes 64 MiB files one after the other, as
compaction's jobs do, in one of these ways:

- `alone`: no large writer;
- `sync-2m`: 1 MiB writes, fdatasync every 2 MiB, fsync at the end (the local store's
  way for a large object);
- `sync-2m-NNNmbs`: the same, paced to NNN MB/s (e.g. `sync-2m-100mbs`);
- `direct`: 1 MiB writes with O_DIRECT (aligned buffers; the page cache bypassed), fsync
  at the end;
- `direct-NNNmbs`: the same, paced to NNN MB/s;
- `direct-dsync`: writes with O_DIRECT and O_DSYNC (each write durable before it
  returns, so that the disk's write cache never holds much of the large writer's data
  for a small writer's flush to wait for); `direct-dsync-NNNmbs` paced.

How the large writer deletes each file when done (`--delete`, one or more):

- `unlink`: at once, as a plain delete does;
- `pieces`: by the local store's own delete (storage/local.py): unlinked, then its
  blocks freed a piece at a time (ftruncate from its end; now 1 MiB 5 ms apart);
- `pieces-NNNk-MMms`: unlinked, then its blocks freed NNN KiB at a time, MM ms apart
  (e.g. `pieces-1024k-10ms`);
- `keep`: not at all (the files stay until the mode's end).

`pieces` and `pieces-…` deletions run in a thread of the large writer's process
(`pieces` ran in its loop, between files, 4 MiB at once, until
results/2026-12-02-fsync-beside-deletes-pass33.json included).

How the small writer writes (`--small`, one or more): `new-file` (a new file each time,
fsync'd and unlinked), `append` (the next page-aligned place of one file, pwritev and
fdatasync, as a segment file's record), `overwrite` (the same into a file whose blocks
were all written with zeros before the run: no block to allocate) or `overwrite-dsync`
(the same with pwritev's RWF_DSYNC instead of an fdatasync).

`--piece-kib` (one or more) sets the large writer's write size (default 1024 KiB).

For each mode and deletion it prints the small writer's p50, p99 and maximum per
write-and-fsync and the large writer's MB/s. Each writer is a process of its own (as the agent and its
compaction worker are). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from storage import local

SMALL_BYTES = 100_000
SMALL_EVERY_S = 0.005
LARGE_BYTES = 64 << 20
PIECE = 1 << 20
SYNC_PIECE = 2 << 20
MODES = ("alone", "sync-2m", "sync-2m-100mbs", "direct", "direct-100mbs", "direct-dsync")
DELETES = ("unlink", "pieces", "keep")
SMALLS = ("new-file", "append", "overwrite", "overwrite-dsync")


def _mode(value: str) -> str:
    base = value.rsplit("-", 1)[0] if value.endswith("mbs") else value
    if base not in ("alone", "sync-2m", "direct", "direct-dsync") or (
        base == "alone" and base != value
    ):
        raise argparse.ArgumentTypeError(f"unknown writer {value!r}")
    return value


def small_writer(
    folder: str, seconds: float, out: multiprocessing.Queue, small: str = "new-file"
) -> None:
    data = os.urandom(SMALL_BYTES)
    times: list[float] = []
    end = time.monotonic() + seconds
    n = 0
    span = -(-SMALL_BYTES // 4096) * 4096  # each write at a page boundary, as a segment's
    segment = None
    if small != "new-file":
        segment = os.open(os.path.join(folder, "segment"), os.O_RDWR | os.O_CREAT, 0o644)
        if small.startswith("overwrite"):  # written (not only allocated) before the run
            zeros = bytes(1 << 20)
            for at in range(0, int(seconds / SMALL_EVERY_S + 1) * span, 1 << 20):
                os.pwrite(segment, zeros, at)
            os.fsync(segment)
    while time.monotonic() < end:
        began = time.perf_counter()
        if segment is None:
            path = os.path.join(folder, f"small-{n}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.unlink(path)
        elif small == "overwrite-dsync":
            os.pwritev(segment, [data], n * span, os.RWF_DSYNC)
        else:  # append, overwrite: as a segment's record is written
            os.pwritev(segment, [data], n * span)
            os.fdatasync(segment)
        times.append((time.perf_counter() - began) * 1000)
        n += 1
        time.sleep(SMALL_EVERY_S)
    if segment is not None:
        os.close(segment)
    out.put(times)


def _paced(written: int, began: float, rate: float | None) -> None:
    if rate:
        ahead = written / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)


def _delete_kind(value: str) -> str:
    if value in DELETES or re.fullmatch(r"pieces-[0-9]+k-[0-9.]+ms", value):
        return value
    raise argparse.ArgumentTypeError(f"unknown deletion {value!r}")


def _delete(path: str, how: str) -> None:
    if how == "unlink":
        os.unlink(path)
    elif how == "pieces":
        local._delete_file(path)  # the local store's own delete
    elif how.startswith("pieces-"):  # pieces-NNNk-MMms: NNN KiB at a time, MM ms apart
        kib, ms = how.removeprefix("pieces-").split("-")
        piece, pause = int(kib.removesuffix("k")) << 10, float(ms.removesuffix("ms")) / 1000
        fd = os.open(path, os.O_WRONLY)
        try:
            os.unlink(path)
            size = os.fstat(fd).st_size
            while size > piece:
                size -= piece
                os.ftruncate(fd, size)
                time.sleep(pause)
        finally:
            os.close(fd)


def large_writer(
    folder: str,
    mode: str,
    delete: str,
    stop: multiprocessing.Event,
    out: multiprocessing.Queue,
    piece: int = PIECE,
) -> None:
    rate = float(mode.rsplit("-", 1)[1].removesuffix("mbs")) * 1e6 if mode.endswith("mbs") else None
    direct = mode.startswith("direct")
    payload = os.urandom(piece)
    buffer = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
    buffer.write(payload)
    total = 0
    began = time.monotonic()
    n = 0
    deleter = ThreadPoolExecutor(1)
    while not stop.is_set():
        path = os.path.join(folder, f"large-{n}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
        if mode.startswith("direct-dsync"):
            flags |= os.O_DSYNC
        fd = os.open(path, flags, 0o644)
        unsynced = 0
        for _ in range(LARGE_BYTES // piece):
            total += os.write(fd, buffer if direct else payload)
            unsynced += piece
            if not direct and unsynced >= SYNC_PIECE:
                os.fdatasync(fd)
                unsynced = 0
            _paced(total, began, rate)
            if stop.is_set():
                break
        os.fsync(fd)
        os.close(fd)
        if delete.startswith("pieces"):  # in a thread of its own, as a collector's
            deleter.submit(_delete, path, delete)
        else:
            _delete(path, delete)
        n += 1
    out.put(total / (time.monotonic() - began) / 1e6)
    deleter.shutdown(wait=False, cancel_futures=True)


def run_mode(
    folder: str,
    mode: str,
    seconds: float,
    delete: str,
    small_mode: str = "new-file",
    piece: int = PIECE,
) -> dict[str, float | str]:
    results: multiprocessing.Queue = multiprocessing.Queue()
    stop = multiprocessing.Event()
    large = None
    if mode != "alone":
        large = multiprocessing.Process(
            target=large_writer, args=(folder, mode, delete, stop, results, piece)
        )
        large.start()
        time.sleep(1.0)
    small_results: multiprocessing.Queue = multiprocessing.Queue()
    small = multiprocessing.Process(
        target=small_writer, args=(folder, seconds, small_results, small_mode)
    )
    small.start()
    times = sorted(small_results.get())
    small.join()
    mbs = 0.0
    if large is not None:
        stop.set()
        mbs = results.get()
        large.join()
    for name in os.listdir(folder):  # what `keep` kept
        os.unlink(os.path.join(folder, name))
    return {
        "mode": mode,
        "small": small_mode,
        **({"piece_kib": piece >> 10} if large is not None else {}),
        **({"delete": delete} if large is not None else {}),
        "fsyncs": len(times),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[int(len(times) * 0.99)], 2),
        "max_ms": round(times[-1], 2),
        "large_mb_s": round(mbs, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--dir", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--writer", action="append", type=_mode)
    parser.add_argument("--delete", action="append", type=_delete_kind)
    parser.add_argument("--small", action="append", choices=SMALLS)
    parser.add_argument("--piece-kib", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    modes = args.writer or list(MODES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsync-beside-", dir=args.dir) as folder:
        for round_ in range(args.rounds):
            for mode in modes:
                deletes = ["unlink"] if mode == "alone" else args.delete or ["unlink"]
                for delete in deletes:
                    for small in args.small or ["new-file"]:
                        for kib in [1024] if mode == "alone" else args.piece_kib or [1024]:
                            row = run_mode(folder, mode, args.seconds, delete, small, kib << 10)
                            row["round"] = round_ + 1
                            rows.append(row)
                            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
