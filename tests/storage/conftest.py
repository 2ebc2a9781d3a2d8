"""Fixtures: every object store to test against (the moto S3 server is in tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage.injected import InjectedLatencyStore
from storage.local import LocalObjectStore
from storage.objectstore import ObjectStore
from storage.s3 import S3ObjectStore
from tests.storage.moto_support import TEST_BUCKET


def make_s3_store(endpoint_url: str) -> S3ObjectStore:
    """A store under a fresh prefix, so tests never see each other's objects."""
    return S3ObjectStore(
        TEST_BUCKET, f"test-{uuid.uuid4().hex}", endpoint_url=endpoint_url, region="us-east-1"
    )


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """A "local" store in tmp_path, or an "s3" one on the moto server (for a fixture
    parametrized over both)."""
    if kind == "local":
        return LocalObjectStore(str(tmp_path / "objects"))
    return make_s3_store(request.getfixturevalue("moto_s3"))


@pytest.fixture(params=["local", "s3", "injected-latency"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """Each object store implementation in turn (and the latency-injecting wrapper, which
    must keep the contract of the store it wraps)."""
    if request.param == "injected-latency":
        made: ObjectStore = InjectedLatencyStore(
            LocalObjectStore(str(tmp_path / "objects")),
            put_delay=lambda: 0.001,
            get_delay=lambda: 0.001,
        )
    else:
        made = make_store(request.param, request, tmp_path)
    yield made
    await made.aclose()


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalObjectStore]:
    made = LocalObjectStore(str(tmp_path / "objects"))
    yield made
    await made.aclose()
