"""S3ObjectStore beyond the contract: prefixes, retries and failures, on a real moto server."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from functools import partial

import anyio
import boto3
import pytest

from integration.chaos.s3faults import FaultProxy
from storage.objectstore import ObjectExistsError, ObjectStoreError, open_store
from storage.s3 import BLOCKING_CALLS, S3ObjectStore, _PartsBody
from tests.storage.conftest import make_s3_store
from tests.storage.moto_support import TEST_BUCKET, free_port


@pytest.fixture
async def s3_store(moto_s3: str) -> AsyncIterator[S3ObjectStore]:
    store = make_s3_store(moto_s3)
    yield store
    await store.aclose()


async def test_keys_live_under_the_prefix(moto_s3: str) -> None:
    store = open_store(f"s3://{TEST_BUCKET}/tenant/one/", s3_endpoint_url=moto_s3)
    assert isinstance(store, S3ObjectStore)
    try:
        await store.put("ingest/01", b"data")
        client = boto3.session.Session().client("s3", endpoint_url=moto_s3)
        raw = client.get_object(Bucket=TEST_BUCKET, Key="tenant/one/ingest/01")
        assert raw["Body"].read() == b"data"
        client.close()
        assert [info.key for info in await store.list()] == ["ingest/01"]
        other = S3ObjectStore(TEST_BUCKET, "tenant/two", endpoint_url=moto_s3)
        assert await other.list() == []
        await other.aclose()
    finally:
        await store.delete("ingest/01")
        await store.aclose()


async def test_list_pages_through_many_keys(moto_s3: str) -> None:
    store = S3ObjectStore(TEST_BUCKET, "paged", endpoint_url=moto_s3, list_page_size=7)
    keys = [f"many/{i:03d}" for i in range(30)]
    for key in reversed(keys):
        await store.put(key, b"")
    assert [info.key for info in await store.list("many/")] == keys
    assert [info.key for info in await store.list("many/01")] == keys[10:20]
    await store.aclose()


async def test_slowdown_is_retried(s3_store: S3ObjectStore) -> None:
    await s3_store.put("fault-slowdown/a", b"patience")
    assert await s3_store.get("fault-slowdown/a") == b"patience"
    assert s3_store.stats["puts"] == 1


async def test_lost_response_to_if_absent_put_is_our_own_success(s3_store: S3ObjectStore) -> None:
    # The first PUT lands but answers 500; its retry gets 412 from our own object.
    await s3_store.put("fault-lost-put/a", b"mine", if_absent=True)
    assert await s3_store.get("fault-lost-put/a") == b"mine"
    with pytest.raises(ObjectExistsError):
        await s3_store.put("fault-lost-put/a", b"mine", if_absent=True)


async def test_conditional_conflict_is_retried(s3_store: S3ObjectStore) -> None:
    await s3_store.put("fault-conflict/a", b"after a conflict", if_absent=True)
    assert await s3_store.get("fault-conflict/a") == b"after a conflict"


async def test_body_cut_short_is_read_again(s3_store: S3ObjectStore) -> None:
    data = os.urandom(256 * 1024)
    await s3_store.put("fault-cut-body/a", data)
    assert await s3_store.get("fault-cut-body/a", 1000) == data[1000:]
    assert s3_store.stats["gets"] == 1


async def test_missing_bucket_is_a_store_error(moto_s3: str) -> None:
    store = S3ObjectStore("no-such-bucket", endpoint_url=moto_s3)
    with pytest.raises(ObjectStoreError, match="NoSuchBucket"):
        await store.put("k", b"x")
    await store.aclose()


async def test_unreachable_endpoint_is_a_store_error() -> None:
    store = S3ObjectStore(
        TEST_BUCKET, endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=2
    )
    with pytest.raises(ObjectStoreError, match="Could not connect"):
        await store.get("k")
    await store.aclose()


async def test_the_wait_between_attempts_is_capped(moto_s3: str) -> None:
    # After a SlowDown answer botocore waits rand(0, 1) x 2^i s before attempt i+1, up to
    # 20 s: six waits of up to 1, 2, 4, 8, 16 and 20 s. Capped at 0.2 s, they take 1.2 s
    # at most, and every attempt is still made.
    proxy = FaultProxy(moto_s3, fault_rate=1.0, kinds=("slowdown",), seed=3).start()
    store = S3ObjectStore(
        TEST_BUCKET, endpoint_url=proxy.url, max_attempts=7, max_retry_delay_s=0.2
    )
    try:
        began = time.monotonic()
        with pytest.raises(ObjectStoreError, match="SlowDown"):
            await store.put("capped", b"x", if_absent=True)
        elapsed = time.monotonic() - began
    finally:
        await store.aclose()
        proxy.stop()
    assert proxy.requests["PUT"] == 7
    assert elapsed < 6 * 0.2 + 2.0


async def test_blocking_calls_beside_the_limit_reuse_pooled_connections(
    s3_store: S3ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The ingest pipeline's uploads and hedges, compaction and cleaning call the *_sync
    # methods from threads of their own, beside the async calls' limit: with a pool no
    # larger than that limit, every request beyond it opened a connection and dropped it
    # after ("Connection pool is full, discarding connection", once per request).
    data = os.urandom(4 * 1024 * 1024)
    await s3_store.put("pool/big", data)
    extra = BLOCKING_CALLS  # blocking calls at once, beside a full limit of async ones
    start = threading.Barrier(extra)

    def blocking_get() -> bytes:
        start.wait(timeout=10)
        return s3_store.get_sync("pool/big")

    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    async with anyio.create_task_group() as tg:
        for _ in range(extra):
            tg.start_soon(
                partial(anyio.to_thread.run_sync, blocking_get, limiter=anyio.CapacityLimiter(1))
            )
        for _ in range(16):
            tg.start_soon(s3_store.get, "pool/big")
    full = [r for r in caplog.records if "pool is full" in r.getMessage()]
    assert full == []
    assert s3_store.stats["gets"] == extra + 16


@pytest.mark.parametrize(
    "folder",
    ["plain", "fault-slowdown", "fault-lost-put", "fault-conflict", "fault-no-conditional"],
)
async def test_a_put_of_parts_sends_them_as_they_are_and_whole_through_retries(
    s3_store: S3ObjectStore, folder: str
) -> None:
    # Over 1 MB (botocore asks for 100-continue), a view, an empty part, a bytearray;
    # each fault makes the body be read again from its start (a retry, our own or
    # botocore's), or read to compare it with the stored object (fault-lost-put).
    parts = [
        os.urandom(700_000),
        b"",
        memoryview(os.urandom(1_500_000))[100:],
        bytearray(b"the tail"),
    ]
    bodies: list[type] = []
    put_object = s3_store._client.put_object

    def spy(**kwargs: object) -> object:
        bodies.append(type(kwargs["Body"]))
        return put_object(**kwargs)

    s3_store._client.put_object = spy
    key = f"{folder}/parts"
    await anyio.to_thread.run_sync(partial(s3_store.put_parts_sync, key, parts, if_absent=True))
    assert await s3_store.get(key) == b"".join(parts)
    assert bodies and bytes not in bodies  # never joined into one buffer
    assert s3_store.stats["puts"] == 1 and s3_store.stats["bytes_put"] == 2_200_008 - 100


def test_a_parts_body_reads_seeks_and_tells_as_a_file_of_the_parts_joined() -> None:
    parts = [b"abc", b"", memoryview(b"defgh")[1:], b"ij"]
    joined = b"abcefghij"
    body = _PartsBody(parts)
    assert len(body) == len(joined) and body.tell() == 0
    read = b""
    while chunk := body.read(2):  # 2 bytes, across parts too, fewer only at the end
        assert len(chunk) == min(2, len(joined) - len(read))
        read += bytes(chunk)
    assert read == joined and body.tell() == len(joined) and body.read(5) == b""
    for position in range(len(joined) + 2):
        assert body.seek(position) == min(position, len(joined))
        assert bytes(body.read()) == joined[position:]
        assert body.tell() == len(joined)
    body.seek(4)
    assert body.seek(-2, 1) == 2 and bytes(body.read(1)) == b"c"
    assert body.seek(-3, 2) == 6 and bytes(body.read(9)) == b"hij"
    body.seek(1)
    assert isinstance(body.read(2), memoryview)  # inside one part: not copied
    assert bytes(body.read(0)) == b"" and body.seek(0) == 0
    with pytest.raises(ValueError):
        body.seek(-1)
