"""Fixtures for the metadata tests: one `kv` store per test, for every KV backend.

`backend` is parametrized over every backend, and `kv` (an open, empty store) is built on
it, so any test that asks for `kv` or `backend` runs once per backend. A backend that
cannot run here is skipped with the reason why, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from metadata.kv import KV, ThreadsFactory, open_kv
from storage.threads import ThreadPool
from tests.support.fdb_server import FDB_CLUSTER_FILE_ENV, FDB_MISSING

__all__ = ["FDB_CLUSTER_FILE_ENV", "FDB_MISSING", "Backend"]

MiB = 1 << 20


@dataclass(frozen=True)
class Backend:
    """How to open one backend's store, here or in another process."""

    name: str
    url: str  # for metadata.kv.open_kv, also from a child process
    # The largest value the backend stores: FoundationDB refuses values over 100,000 bytes.
    large_value_size: int
    threads: ThreadsFactory | None = None  # the worker threads of a SQLite store here

    def open(self) -> KV:
        return open_kv(self.url, threads=self.threads)


def _sqlite_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    # A folder that does not exist yet: the backend must create it.
    path = tmp_path / "metadata" / "kv.sqlite3"
    return Backend("sqlite", f"sqlite://{path}", large_value_size=MiB)


def _faulty_sqlite_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    # The fault-injection wrapper (metadata.injected_kv), its switch off: it must keep
    # the contract of the store it wraps. The store in it hands its calls to a
    # storage.threads.ThreadPool, as in an agent (the plain one to anyio's threads).
    path = tmp_path / "metadata" / "kv.sqlite3"
    switch = tmp_path / "metadata-down"
    return Backend(
        "faulty+sqlite",
        f"faulty+sqlite://{path}?unavailable_when={switch}",
        large_value_size=MiB,
        threads=ThreadPool,
    )


def _fdb_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    # A throwaway local fdbserver (or BUCKETLOG_TEST_FDB_CLUSTER_FILE), started once per
    # session; skips with FDB_MISSING when libfdb_c or fdbserver is not on this machine.
    cluster_file = request.getfixturevalue("fdb_cluster_file")
    # A root of its own, so that a shared test cluster keeps everything else it holds.
    return Backend(
        "fdb", f"fdb://{cluster_file}?prefix=bucketlog-kv-tests", large_value_size=100_000
    )


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "sqlite": _sqlite_backend,
    "faulty+sqlite": _faulty_sqlite_backend,
    "fdb": _fdb_backend,
}


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](request, tmp_path)


def _clear_all(kv: KV) -> None:
    # Every test starts from an empty key space (a shared FDB test cluster keeps data;
    # on FoundationDB this is the store's own root only).
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff"))


@pytest.fixture
def kv(backend: Backend) -> Iterator[KV]:
    store = backend.open()
    _clear_all(store)
    yield store
    anyio.run(store.aclose)
