"""Worker processes for the agent's CPU-heavy background work: compaction's builds.

A compaction job copies tens of megabytes batch by batch. In a thread of the agent it
holds the GIL for much of that time and the event loop waits for it between its own
steps: in the benchmark's latency rows produce p99 went from 14 to 99 ms while jobs ran
beside them. In a process of its own the job shares only the cores, and at a lower
priority (`nice`, 10 by default) the kernel runs the agent's requests first.

A worker opens the agent's object store itself (`StoreSpec`: the URL, the S3 options,
any injected latency) and runs one job at a time. What it asked of the store comes back
with its result and is added to the agent's counters (the store's stats, and the
request ledger under UNATTRIBUTED as every background request is), so that metrics and
benchmarks count the same requests as with a thread. A worker dies with its agent
(PR_SET_PDEATHSIG on Linux): a killed agent leaves no job running, only an upload that
nothing committed, which the orphan sweep deletes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from broker.costs import AccountingStore, Ledger
from broker.lean import leave_out_test_only_modules
from broker.memory import tune_allocator
from storage.objectstore import ObjectStore, open_store

if TYPE_CHECKING:
    from broker.config import BrokerConfig

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

K = TypeVar("K")
N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """What opens the agent's object store again, in another process."""

    url: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_addressing_style: str | None = None
    blocking_calls: int | None = None
    put_latency_ms: tuple[float, float] | None = None  # median, p99
    get_latency_ms: tuple[float, float] | None = None
    # A local store's large objects written no faster than this (None: unpaced), and with
    # O_DIRECT, as are its large reads (storage.local): compaction's, not the agent's.
    large_write_bytes_per_s: float | None = None
    large_io_direct: bool = False
    # Flushes packed into segment files (storage.segments): the agent's own store only.
    segments: bool = False

    @classmethod
    def of(
        cls, config: BrokerConfig, blocking_calls: int | None = None, *, worker: bool = False
    ) -> StoreSpec:
        """The agent's store (`worker`: as compaction's worker processes open it, their
        large writes paced, their large I/O direct)."""
        return cls(
            config.resolved_storage_url,
            config.s3_endpoint_url,
            config.s3_region,
            config.s3_addressing_style,
            blocking_calls,
            config.inject_put_latency_ms or None,
            config.inject_get_latency_ms or None,
            (config.compaction_write_bytes_per_s or None) if worker else None,
            large_io_direct=worker,
            segments=config.packs_flushes and not worker,
        )

    @property
    def remote(self) -> bool:
        """Whether a read costs a request to another machine (not a local folder)."""
        return not self.url.startswith("file://")

    def open(self) -> ObjectStore:
        store = open_store(
            self.url,
            s3_endpoint_url=self.s3_endpoint_url,
            s3_region=self.s3_region,
            s3_addressing_style=self.s3_addressing_style,
            blocking_calls=self.blocking_calls,
            large_write_bytes_per_s=self.large_write_bytes_per_s,
            large_io_direct=self.large_io_direct,
            segments=self.segments,
        )
        if self.put_latency_ms or self.get_latency_ms:
            from metadata.injected_kv import Lognormal
            from storage.injected import InjectedLatencyStore

            put, get = self.put_latency_ms, self.get_latency_ms
            store = InjectedLatencyStore(
                store,
                put_delay=Lognormal(*put) if put else None,
                get_delay=Lognormal(*get) if get else None,
            )
        return store


@dataclass(frozen=True, slots=True)
class Spent:
    """What a worker asked of the store for one call: the ledger's entries and the
    store's stats counters that moved."""

    requests: dict[tuple[str, str], float]
    bytes: dict[tuple[str, str], float]
    stats: dict[str, int]


def moved(before: Mapping[K, float], now: Mapping[K, N]) -> dict[K, N]:
    """The counters of `now` that moved since `before`, by how much."""
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}  # type: ignore[misc]


def add_spent(store: Any, spent: Spent) -> None:
    """Count a worker's requests as the agent's own."""
    stats = getattr(store, "stats", None)
    if isinstance(stats, dict):
        for name, value in spent.stats.items():
            stats[name] = stats.get(name, 0) + value
    if isinstance(store, AccountingStore):
        store.ledger.add(spent.requests, spent.bytes)


class WorkerPool:
    """`workers` processes, each with the store open, running `fn(store, *args)`.

    Started at the first call. A pool whose worker died (killed, out of memory) fails
    the calls it had and is started again at the next one."""

    def __init__(self, spec: StoreSpec, workers: int, nice: int) -> None:
        self.spec = spec
        self._workers = max(1, workers)
        self._nice = nice
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _started(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self._workers,
                # Not fork: the agent has threads (the store's, the metadata store's)
                # whose locks a forked child would inherit held.
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.spec, self._nice, logging.getLogger().level, os.getpid()),
            )
        return self._pool

    async def run(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, Spent]:
        pool = self._started()
        try:
            return await asyncio.wrap_future(pool.submit(_call, fn, args))
        except BrokenProcessPool:
            if self._pool is pool:  # started again at the next call
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise

    @property
    def started(self) -> bool:
        return self._pool is not None

    async def warm(self) -> None:
        """Start every worker now (each opens the store: about half a second), so that
        the first jobs do not wait for it."""
        await asyncio.gather(*(self.run(_nothing) for _ in range(self._workers)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# -- in the worker process ---------------------------------------------------------------

_store: AccountingStore | None = None


def die_with_parent(parent_pid: int) -> None:
    """In a process the agent (or its compaction process) started: die with that parent,
    even one killed with -9, and leave Ctrl-C to it."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # it died before that: nothing to work for
            os._exit(0)
    # A Ctrl-C reaches the whole process group: the parent ends its children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_child(parent_pid: int) -> None:
    """The first steps of a process the agent (or its compaction process) spawned: the
    test-only modules left out (before the jobs' modules are imported), death with its
    parent, and the agent's allocator settings, as a spawned process starts with glibc's
    defaults (a job's reads are fresh buffers of up to its whole input: on reused heap
    rather than new pages, broker.memory)."""
    leave_out_test_only_modules()
    die_with_parent(parent_pid)
    tune_allocator()


def _start_worker(spec: StoreSpec, nice: int, log_level: int, parent_pid: int) -> None:
    global _store
    start_child(parent_pid)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if nice:
        os.nice(nice)
    _store = AccountingStore(spec.open(), Ledger())


def _nothing(store: ObjectStore) -> None:
    return None


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Spent]:
    store = _store
    assert store is not None
    store.ledger = Ledger()
    stats = getattr(store.inner, "stats", {})
    before = dict(stats)
    result = fn(store, *args)
    requests, sizes = store.ledger.copy()
    return result, Spent(requests, sizes, moved(before, stats))
