"""What a flush's write and fdatasync cost where the file's blocks are already written.

    .venv/bin/python integration/bench/results/2026-12-04-zeroed-writes.py [FOLDER]

A segment's record is written at the file's end and fdatasync'd (storage/segments.py):
the file system allocates blocks and grows the file, and the fdatasync writes that
metadata too. Here, 400 writes of each size, each followed by fdatasync, into four kinds
of file in FOLDER (default a temporary folder under /tmp, on the agent's disk): `append`
(a new file, as segments are written today), `zeroed` (the whole range written with
zeros and fsync'd first), `falloc` (the range given by posix_fallocate: unwritten
extents) and `dsync` (appended with one pwritev(RWF_DSYNC) instead of pwritev and
fdatasync). Then the cost of zeroing a 64 MiB segment ahead, buffered and with O_DIRECT,
and of writes into a range zeroed with O_DIRECT (its pages not in the page cache),
padded to the page or not. The writer thread's CPU and the wall time per write.

On this machine (ext4 without a journal on a virtio disk), 2026-12-04 (235 KB: the three
rounds; 12 KB and 1 MiB: the last of three):

    size       append            zeroed            falloc            dsync
               cpu / wall us     cpu / wall us     cpu / wall us     cpu / wall us
    12 KB       66 / 176          40 / 104          68 / 186          68 / 182
    235 KB     139-193 / 335-434  81-101 / 185-223  122-151 / 316-367  142-165 / 335-381
    1 MiB      315 / 863         180 / 437         268 / 864         317 / 875

    zeroing 64 MiB: buffered 18.5-18.7 ms CPU, 52-60 ms wall; O_DIRECT 5.6-7.5 ms CPU,
    52-53 ms wall. Into the O_DIRECT-zeroed range: 12,000 B 66-92 us CPU unpadded
    (the last page read from the disk first), 52-56 padded to the page; 235,000 B
    140-155 unpadded, 91-111 padded.

Not built (bench README, forty-second pass): a write into blocks written before costs
its thread about 40% less CPU and half the wall time, but the zeros are a second write
of every byte, and a segment's unwritten zeros are what `list` and the deletes would
have to tell from records.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
import time

FOLDER = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zeroed-writes-")
os.makedirs(FOLDER, exist_ok=True)
WRITES = 400
SEGMENT = 64 << 20
PAGE = 4096


def writes(mode: str, size: int) -> tuple[float, float]:
    """(CPU us, wall us) per write of `size` and its sync into a file of kind `mode`."""
    data = os.urandom(size)
    path = os.path.join(FOLDER, f"seg-{mode}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        total = WRITES * size + PAGE
        if mode == "zeroed":
            zeros = bytes(1 << 20)
            for offset in range(0, total, len(zeros)):
                os.pwrite(fd, zeros, offset)
            os.fsync(fd)
        elif mode == "falloc":
            os.posix_fallocate(fd, 0, total)
            os.fsync(fd)
        cpu, wall = time.thread_time(), time.perf_counter()
        offset = PAGE
        for _ in range(WRITES):
            if mode == "dsync":
                os.pwritev(fd, [data], offset, os.RWF_DSYNC)
            else:
                os.pwritev(fd, [data], offset)
                os.fdatasync(fd)
            offset += size
        return (
            (time.thread_time() - cpu) / WRITES * 1e6,
            (time.perf_counter() - wall) / WRITES * 1e6,
        )
    finally:
        os.close(fd)
        os.unlink(path)


def zero_segment(path: str, direct: bool) -> tuple[float, float]:
    """(CPU ms, wall ms) of writing a segment's zeros and syncing them."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0), 0o644)
    zeros = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
    try:
        cpu, wall = time.thread_time(), time.perf_counter()
        for offset in range(0, SEGMENT, len(zeros)):
            os.pwritev(fd, [zeros], offset)
        os.fdatasync(fd)
        return (time.thread_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3
    finally:
        os.close(fd)


def writes_into(path: str, size: int, pad: bool) -> tuple[float, float]:
    data = os.urandom(size)
    padding = bytes(-size % PAGE)
    fd = os.open(path, os.O_RDWR)
    try:
        cpu, wall = time.thread_time(), time.perf_counter()
        offset = PAGE
        for _ in range(300):
            os.pwritev(fd, [data, padding] if pad else [data], offset)
            os.fdatasync(fd)
            offset += size + len(padding)
        return (time.thread_time() - cpu) / 300 * 1e6, (time.perf_counter() - wall) / 300 * 1e6
    finally:
        os.close(fd)


for size in (12 * 1024, 235 * 1024, 1 << 20):
    for _round in range(3):
        for mode in ("append", "zeroed", "falloc", "dsync"):
            cpu_us, wall_us = writes(mode, size)
            print(f"{size:8d} {mode:7s} cpu {cpu_us:6.0f} us  wall {wall_us:6.0f} us", flush=True)
for _round in range(2):
    for direct in (False, True):
        path = os.path.join(FOLDER, "zeroed-segment")
        cpu_ms, wall_ms = zero_segment(path, direct)
        print(
            f"zero 64 MiB {'O_DIRECT' if direct else 'buffered'}: cpu {cpu_ms:.1f} ms wall {wall_ms:.1f} ms"
        )
        for size in (12_000, 235_000):
            for pad in (False, True):
                cpu_us, wall_us = writes_into(path, size, pad)
                print(f"  {size} into it, padded {pad}: cpu {cpu_us:.0f} us wall {wall_us:.0f} us")
        os.unlink(path)
