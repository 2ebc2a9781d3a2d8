"""Fixtures for the metadata tests: one `kv` store per test, for every KV backend.

`backend` is parametrized over every backend, and `kv` (an open, empty store) is built on
it, so any test that asks for `kv` or `backend` runs once per backend. A backend that
cannot run here is skipped with the reason why, never silently dropped.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from metadata.kv import KV, open_kv

FDB_MISSING = "FoundationDB client library libfdb_c and fdbserver are not installed on this machine"
FDB_CLUSTER_FILE_ENV = "BUCKETLOG_TEST_FDB_CLUSTER_FILE"

MiB = 1 << 20


@dataclass(frozen=True)
class Backend:
    """How to open one backend's store, here or in another process."""

    name: str
    url: str  # for metadata.kv.open_kv, also from a child process
    # The largest value the backend stores: FoundationDB refuses values over 100,000 bytes.
    large_value_size: int

    def open(self) -> KV:
        return open_kv(self.url)


@functools.cache
def _fdb_available() -> bool:
    try:
        # Importing fdb.impl loads libfdb_c (fdb.tuple alone does not).
        import fdb.impl  # type: ignore[import-untyped]  # noqa: F401
    except Exception:
        return False
    return shutil.which("fdbserver") is not None or bool(os.environ.get(FDB_CLUSTER_FILE_ENV))


def _sqlite_backend(tmp_path: Path) -> Backend:
    # A folder that does not exist yet: the backend must create it.
    path = tmp_path / "metadata" / "kv.sqlite3"
    return Backend("sqlite", f"sqlite://{path}", large_value_size=MiB)


def _fdb_backend(tmp_path: Path) -> Backend:
    if not _fdb_available():
        pytest.skip(FDB_MISSING)
    if importlib.util.find_spec("metadata.fdb_kv") is None:
        pytest.skip("the FoundationDB backend (metadata/fdb_kv.py) is not written yet")
    cluster_file = os.environ.get(FDB_CLUSTER_FILE_ENV)
    if not cluster_file:
        pytest.skip(
            f"fdbserver is installed but no test cluster is set: set {FDB_CLUSTER_FILE_ENV}"
        )
    return Backend("fdb", f"fdb://{cluster_file}", large_value_size=100_000)


BACKENDS = {"sqlite": _sqlite_backend, "fdb": _fdb_backend}


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](tmp_path)


def _clear_all(kv: KV) -> None:
    # Every test starts from an empty key space (a shared FDB test cluster keeps data).
    kv.transact_sync(lambda tr: tr.clear_range(b"", b"\xff"))


@pytest.fixture
def kv(backend: Backend) -> Iterator[KV]:
    store = backend.open()
    _clear_all(store)
    yield store
    anyio.run(store.aclose)
