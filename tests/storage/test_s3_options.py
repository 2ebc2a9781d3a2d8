"""S3 store settings for MinIO's and AWS's behaviour: addressing, region, credentials, and
stores without conditional writes (the last one on a real moto server)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import boto3
import pytest

from storage.objectstore import open_store
from storage.s3 import S3ObjectStore
from tests.storage.moto_support import TEST_BUCKET, TEST_CREDENTIALS


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Test credentials from the environment, and no developer's own AWS profile."""
    for name, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield monkeypatch


def _object_url(store: S3ObjectStore) -> str:
    # botocore builds the request URL (addressing, region endpoint) without any network I/O.
    url: str = store._client.generate_presigned_url(
        "get_object", Params={"Bucket": store.bucket, "Key": store.prefix + "k"}
    )
    return url.split("?")[0]


@pytest.mark.parametrize(
    ("endpoint", "style", "region", "url"),
    [
        # MinIO and other S3-compatible stores: path style unless told otherwise.
        ("http://minio:9000", None, None, "http://minio:9000/bucketlog-test/p/k"),
        ("http://minio:9000", "virtual", None, "http://bucketlog-test.minio:9000/p/k"),
        # AWS: virtual hosts where the bucket name allows ("auto"), or as asked.
        # ("auto" names the bucket in the host; botocore presigns it on the global name)
        (None, None, "eu-west-1", "https://bucketlog-test.s3.amazonaws.com/p/k"),
        (None, "path", "eu-west-1", "https://s3.eu-west-1.amazonaws.com/bucketlog-test/p/k"),
        (None, "virtual", "eu-west-1", "https://bucketlog-test.s3.eu-west-1.amazonaws.com/p/k"),
    ],
)
def test_addressing_style_and_region(
    aws_env: pytest.MonkeyPatch, endpoint: str | None, style: str | None, region: str, url: str
) -> None:
    store = S3ObjectStore(
        TEST_BUCKET, "p", endpoint_url=endpoint, region=region, addressing_style=style
    )
    assert _object_url(store) == url
    store._client.close()


def test_region_comes_from_the_aws_chain_unless_given(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.setenv("AWS_REGION", "ap-south-1")
    aws_env.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    chained = S3ObjectStore(TEST_BUCKET)
    given = S3ObjectStore(TEST_BUCKET, region="eu-central-1")
    assert chained._client.meta.region_name == "ap-south-1"
    assert given._client.meta.region_name == "eu-central-1"
    # Credentials too: the environment's, through boto3's usual chain.
    credentials = chained._client._request_signer._credentials
    assert credentials.access_key == TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"]
    chained._client.close()
    given._client.close()


def test_open_store_passes_region_and_addressing_style(aws_env: pytest.MonkeyPatch) -> None:
    store = open_store(
        f"s3://{TEST_BUCKET}/p",
        s3_endpoint_url="http://minio:9000",
        s3_region="eu-west-3",
        s3_addressing_style="virtual",
    )
    assert isinstance(store, S3ObjectStore)
    assert store._client.meta.region_name == "eu-west-3"
    assert _object_url(store) == "http://bucketlog-test.minio:9000/p/k"
    store._client.close()


def test_unknown_addressing_style_is_refused(aws_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="addressing style"):
        S3ObjectStore(TEST_BUCKET, addressing_style="dns")


async def test_store_without_conditional_writes_gets_plain_puts(
    moto_s3: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The server answers 501 NotImplemented to If-None-Match under fault-no-conditional/.
    store = S3ObjectStore(TEST_BUCKET, "fault-no-conditional", endpoint_url=moto_s3)
    with caplog.at_level(logging.WARNING, logger="storage.s3"):
        await store.put("ingest/01", b"first", if_absent=True)
        await store.put("ingest/02", b"second", if_absent=True)
    assert not store.conditional_writes
    assert [r.message for r in caplog.records].count(
        f"{store!r} does not implement conditional writes (If-None-Match); "
        "writing new objects with plain PUTs"
    ) == 1
    assert await store.get("ingest/01") == b"first"
    assert await store.get("ingest/02") == b"second"
    raw = boto3.session.Session().client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    listed = raw.list_objects_v2(Bucket=TEST_BUCKET, Prefix="fault-no-conditional/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [
        "fault-no-conditional/ingest/01",
        "fault-no-conditional/ingest/02",
    ]
    raw.close()
    await store.aclose()


async def test_conditional_writes_stay_on_where_supported(moto_s3: str) -> None:
    store = S3ObjectStore(TEST_BUCKET, "conditional-ok", endpoint_url=moto_s3)
    await store.put("k", b"v", if_absent=True)
    assert store.conditional_writes
    await store.aclose()
