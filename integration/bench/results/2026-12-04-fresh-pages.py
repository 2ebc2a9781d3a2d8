"""What a write into pages the page cache does not have yet costs the writer, as memory
is used anew or used again.

    .venv/bin/python integration/bench/results/2026-12-04-fresh-pages.py [FOLDER]

Writes of 235 KB (half-load's flush) at consecutive offsets of a new file in FOLDER
(default: the checkout), 2,000 a file (470 MB), without fsync; the writer's thread CPU
per GB of each file. Three files deleted after each (the memory they took is freed and
used again by the next), then ten kept (each takes memory not used since the run
began), then, once the ten are deleted, two more deleted after each.
"""

import os
import sys
import time
from pathlib import Path

SIZE = 235 * 1024
WRITES = 2000

folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[3])
data = os.urandom(SIZE)
kept: list[Path] = []


def write_file(keep: bool) -> float:
    """One file of WRITES writes; the writer's CPU seconds per GB."""
    path = folder / f".fresh-pages-{os.getpid()}-{len(kept)}.tmp"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        began = time.thread_time()
        for i in range(WRITES):
            os.pwrite(fd, data, i * SIZE)
        cpu = time.thread_time() - began
    finally:
        os.close(fd)
    if keep:
        kept.append(path)
    else:
        path.unlink()
    return round(cpu / (WRITES * SIZE) * 1e9, 3)


try:
    print("deleted after each", [write_file(False) for _ in range(3)], flush=True)
    print("kept", [write_file(True) for _ in range(10)], flush=True)
    for path in kept:
        path.unlink()
    kept.clear()
    print("deleted after each, after the kept ones", [write_file(False) for _ in range(2)])
finally:
    for path in kept:
        path.unlink(missing_ok=True)
