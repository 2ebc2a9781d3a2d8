"""fsync_beside.py's small writer (`append`: a segment file's record, pwritev and
fdatasync every 5 ms) beside its `direct` large writer (64 MiB files in 1 MiB O_DIRECT
writes, deleted in pieces), the large writer's I/O priority set first with
ioprio_set(2): class 0 (none: best effort by its niceness), 3 (idle) or 2 (best effort,
level 7). Two rounds of 15 s each. Thirty-second pass of integration/bench/README.md."""

import ctypes
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))

import fsync_beside as fb  # noqa: E402

SYS_IOPRIO_SET = 251  # x86_64
IOPRIO_WHO_PROCESS = 1
libc = ctypes.CDLL(None, use_errno=True)


def large_in_class(folder, mode, delete, stop, out, io_class):
    if io_class:
        level = 7 if io_class == 2 else 0
        if libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, 0, (io_class << 13) | level) != 0:
            raise OSError(ctypes.get_errno(), "ioprio_set")
    fb.large_writer(folder, mode, delete, stop, out)


def run(folder, io_class, seconds=15):
    results = multiprocessing.Queue()
    stop = multiprocessing.Event()
    large = multiprocessing.Process(
        target=large_in_class, args=(folder, "direct", "pieces", stop, results, io_class)
    )
    large.start()
    time.sleep(1)
    small_results = multiprocessing.Queue()
    small = multiprocessing.Process(
        target=fb.small_writer, args=(folder, seconds, small_results, "append")
    )
    small.start()
    times = sorted(small_results.get())
    small.join()
    stop.set()
    mbs = results.get()
    large.join()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    return {
        "io_class": io_class,
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[int(len(times) * 0.99)], 2),
        "large_mb_s": round(mbs, 1),
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=os.path.join(HERE, "..", "..", "..")) as folder:
        for _round in range(2):
            for io_class in (0, 3, 2):
                print(run(folder, io_class), flush=True)
