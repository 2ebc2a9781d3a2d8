"""Fixtures: a moto S3 server for the session, and every object store to test against."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest

from storage.local import LocalObjectStore
from storage.objectstore import ObjectStore
from storage.s3 import S3ObjectStore
from tests.storage.moto_support import TEST_BUCKET, TEST_CREDENTIALS, moto_server


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint URL of a moto S3 server holding an empty bucket TEST_BUCKET."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in TEST_CREDENTIALS.items():
            mp.setenv(name, value)
        # Keep a developer's own AWS profile out of the tests.
        mp.setenv("AWS_CONFIG_FILE", "/dev/null")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        mp.delenv("AWS_PROFILE", raising=False)
        with moto_server() as url:
            client = boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1")
            client.create_bucket(Bucket=TEST_BUCKET)
            client.close()
            yield url


def make_s3_store(endpoint_url: str) -> S3ObjectStore:
    """A store under a fresh prefix, so tests never see each other's objects."""
    return S3ObjectStore(
        TEST_BUCKET, f"test-{uuid.uuid4().hex}", endpoint_url=endpoint_url, region="us-east-1"
    )


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """Each object store implementation in turn."""
    if request.param == "local":
        made: ObjectStore = LocalObjectStore(str(tmp_path / "objects"))
    else:
        made = make_s3_store(request.getfixturevalue("moto_s3"))
    yield made
    await made.aclose()


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalObjectStore]:
    made = LocalObjectStore(str(tmp_path / "objects"))
    yield made
    await made.aclose()
