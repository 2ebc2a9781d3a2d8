"""The memory of an agent process: allocator settings, the garbage collector, and the
bound on request bytes.

An agent allocates and frees large buffers all the time: request frames, the copies of
produced batches, ingest files, the pieces of a Fetch answer and the answer's frame, each
0.1–4 MiB. glibc's malloc serves a request above its mmap threshold (128 KiB at first,
raised on the fly up to the largest block freed so far) with fresh pages from mmap, and
gives freed memory at the top of the heap back to the kernel above its trim threshold.
Either way the next buffer lands on pages the process has never touched, and each first
touch of a 4 KiB page is a minor page fault. Measured on a 1 MiB Fetch answer built from
the cache: about 480 faults and 1.1 ms of the request's time, against 0.1 ms for the
same work on reused memory.

`tune_allocator` fixes both thresholds high enough that those buffers are carved from the
heap and reused: mmap only above 32 MiB (glibc's upper limit for the setting), and keep
up to 64 MiB of free heap before trimming. Fixing them also turns off glibc's on-the-fly
adjustment. The cost is that up to 64 MiB of freed memory per arena may stay resident,
so the arenas are limited to 2 (glibc's default allows 8 per core, and each worker
thread may get its own): the GIL serializes allocation anyway. Measured over three
produce runs, a catch-up read and a confluent-kafka round trip, peak RSS was 459–529 MB
with these settings, 620 MB without the arena limit and 573–599 MB with glibc's
defaults.

Compaction's process and its worker processes (broker.compactor, broker.workers) are
spawned, so they start with glibc's defaults, and set the same: a job's reads are fresh
buffers of up to its whole input. A worker took 262,000-289,000 minor faults and 1.3-1.9
CPU s per GB written with the defaults, 36,000-52,000 and 0.9-1.2 with these
(integration/bench/results/2026-12-04-compaction-cpu.{py,jsonl}).

It does nothing on a C library other than glibc, and nothing for a threshold the operator
already set through glibc's own environment variables (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_, MALLOC_ARENA_MAX), which take precedence.

Python's cyclic garbage collector stops the process while it runs, and a collection of
the oldest generation visits every object the process tracks. Most of an agent's are
made at start and live as long as it does: modules, classes, functions, the protocol
schemas, botocore's service models (about 60,000 of the 63,000 tracked in an agent
under produce load). Every 15-35 s of that load a full collection visited them all and
found nothing to free, 30-100 ms each time with the event loop stopped: the longest
round trips of requests that need neither store. `freeze_startup_heap` moves what
exists once the agent serves into the collector's permanent generation (`gc.freeze`),
which it never visits again; full collections then take about 3 ms. What is frozen is
still freed by reference counting; only a reference cycle among those objects would
outlive its last use, and they are the agent's own long-lived parts.
`GarbageCollections` counts the full collections and the time they stopped the process
(the agent's stats, "gc").
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
import time
from collections import deque

import anyio

logger = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024
ARENA_MAX = 2

_SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX),
)


def tune_allocator() -> list[str]:
    """Apply the settings above; returns the names of the thresholds that were set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return []
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = []
    for env, param, value in _SETTINGS:
        if env in os.environ:
            continue
        if mallopt(param, value) == 1:
            applied.append(env.rstrip("_").lower())
        else:
            logger.warning("glibc refused mallopt(%d, %d)", param, value)
    return applied


def freeze_startup_heap() -> int:
    """Move every object the collector tracks now into its permanent generation (see
    above); the objects frozen so far. Called once the agent serves."""
    gc.freeze()
    COLLECTIONS.frozen_objects = gc.get_freeze_count()
    return COLLECTIONS.frozen_objects


class GarbageCollections:
    """The full collections of this process (the oldest generation) and the time they
    took, from the collector's own callbacks, once `install`ed."""

    def __init__(self) -> None:
        self.full_collections = 0
        self.full_collection_us = 0
        self.longest_full_collection_us = 0
        # As counted when the heap was frozen (freeze_startup_heap): gc.get_freeze_count()
        # walks every frozen object, about 3 ms with the agent's, too slow for each second's
        # stats (2% of a Fetch loop's samples).
        self.frozen_objects = 0
        self._began = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = int((time.perf_counter() - self._began) * 1_000_000)
        self.full_collections += 1
        self.full_collection_us += took
        self.longest_full_collection_us = max(self.longest_full_collection_us, took)

    def stats(self) -> dict[str, int]:
        return {
            "frozen_objects": self.frozen_objects,
            "full_collections": self.full_collections,
            "full_collection_us": self.full_collection_us,
            "longest_full_collection_us": self.longest_full_collection_us,
        }


# This process's: the agent installs it at start (broker.cli), its stats report it.
COLLECTIONS = GarbageCollections()


class RequestMemory:
    """The bytes of requests being received or handled, bounded across all connections
    (Apache Kafka's `queued.max.request.bytes` memory pool).

    A connection reserves a frame's size as soon as its size prefix has arrived, before
    reading its body, and the reservation lasts until the request is answered (a Produce
    keeps views of its frame until its flush is committed). When the pool is used up the
    connection stops reading from its socket until memory is released; waiters are
    served in arrival order, so a large frame is not starved by small ones. A frame larger
    than the whole pool could never be read, and is refused at its prefix
    (`max_frame_size`).
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("the request memory must be positive")
        self.capacity = capacity
        self.available = capacity
        self._waiters: deque[_Waiter] = deque()
        self.stats = {"in_use_peak": 0, "reads_paused": 0}

    @property
    def in_use(self) -> int:
        return self.capacity - self.available

    @property
    def contended(self) -> bool:
        """Whether a connection waits for memory now."""
        return bool(self._waiters)

    async def reserve(self, size: int) -> None:
        """Take `size` bytes, waiting while they are not free."""
        if size > self.capacity:
            raise ValueError(f"{size} bytes can never fit in {self.capacity}")
        if not self._waiters and size <= self.available:
            self._take(size)
            return
        waiter = _Waiter(size)
        self._waiters.append(waiter)
        self.stats["reads_paused"] += 1
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():
                self.release(size)  # granted as it was cancelled: give it back
            else:
                self._waiters.remove(waiter)
                self._grant()  # a large waiter gone may let smaller ones through
            raise

    def release(self, size: int) -> None:
        self.available += size
        self._grant()

    def _take(self, size: int) -> None:
        self.available -= size
        self.stats["in_use_peak"] = max(self.stats["in_use_peak"], self.in_use)

    def _grant(self) -> None:
        while self._waiters and self._waiters[0].size <= self.available:
            waiter = self._waiters.popleft()
            self._take(waiter.size)
            waiter.granted.set()


class _Waiter:
    __slots__ = ("size", "granted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.granted = anyio.Event()
