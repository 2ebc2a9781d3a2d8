"""The fault proxy of the S3 scenario (integration/chaos/s3faults.py) in front of a real
moto server: each kind of fault does to a boto3 client what it is named after, without
faults it forwards faithfully, and the rule that tells retriable client errors apart."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError
from confluent_kafka import KafkaError

from integration.chaos.s3faults import FaultProxy, retriable
from tests.storage.moto_support import TEST_BUCKET


@pytest.fixture
def proxy(moto_s3: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto_s3, fault_rate=0.0, seed=1).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def client(endpoint: str):
    """A client that tries once: what the proxy does is what it sees."""
    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, read_timeout=5)
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", config=config
    )


def stored(moto_s3: str, key: str) -> bytes | None:
    try:
        return client(moto_s3).get_object(Bucket=TEST_BUCKET, Key=key)["Body"].read()
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchKey"
        return None


def test_without_faults_every_request_is_forwarded(proxy, moto_s3):
    s3 = client(proxy.url)
    key = f"proxy/{uuid.uuid4().hex}"
    s3.put_object(Bucket=TEST_BUCKET, Key=key, Body=b"x" * 100_000, IfNoneMatch="*")
    assert s3.get_object(Bucket=TEST_BUCKET, Key=key)["Body"].read() == b"x" * 100_000
    assert s3.head_object(Bucket=TEST_BUCKET, Key=key)["ContentLength"] == 100_000
    got = s3.get_object(Bucket=TEST_BUCKET, Key=key, Range="bytes=10-19")["Body"].read()
    assert got == b"x" * 10
    with pytest.raises(ClientError) as refused:  # moto's own answer comes through
        s3.put_object(Bucket=TEST_BUCKET, Key=key, Body=b"y", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert stored(moto_s3, key) == b"x" * 100_000
    described = proxy.describe()
    assert described["faults"] == 0
    assert described["requests_by_method"] == {"PUT": 2, "GET": 2, "HEAD": 1}


@pytest.mark.parametrize(
    ("kind", "status", "code"), [("slowdown", 503, "SlowDown"), ("internal", 500, "InternalError")]
)
def test_error_answers_are_s3_errors_and_nothing_is_forwarded(proxy, moto_s3, kind, status, code):
    proxy.kinds, proxy.fault_rate = (kind,), 1.0
    key = f"proxy/{uuid.uuid4().hex}"
    with pytest.raises(ClientError) as failed:
        client(proxy.url).put_object(Bucket=TEST_BUCKET, Key=key, Body=b"v")
    assert failed.value.response["Error"]["Code"] == code
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert stored(moto_s3, key) is None
    assert proxy.describe()["faults_by_kind"] == {kind: 1}


@pytest.mark.parametrize(("kind", "took_effect"), [("drop-before", False), ("drop-after", True)])
def test_a_dropped_connection_leaves_the_client_without_an_answer(
    proxy, moto_s3, kind, took_effect
):
    proxy.kinds, proxy.fault_rate = (kind,), 1.0
    key = f"proxy/{uuid.uuid4().hex}"
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        client(proxy.url).put_object(Bucket=TEST_BUCKET, Key=key, Body=b"v")
    assert stored(moto_s3, key) == (b"v" if took_effect else None)


def test_latency_delays_and_forwards(proxy, moto_s3):
    proxy.kinds, proxy.fault_rate, proxy.max_latency_s = ("latency",), 1.0, 0.3
    key = f"proxy/{uuid.uuid4().hex}"
    client(proxy.url).put_object(Bucket=TEST_BUCKET, Key=key, Body=b"v")
    assert stored(moto_s3, key) == b"v"
    assert proxy.describe()["faults_by_kind"] == {"latency": 1}


def test_the_fault_rate_is_the_share_of_requests_failed(proxy):
    proxy.kinds, proxy.fault_rate = ("slowdown",), 0.3
    s3 = client(proxy.url)
    for _ in range(200):
        try:
            s3.head_bucket(Bucket=TEST_BUCKET)
        except ClientError:
            pass
    described = proxy.describe()
    assert described["requests"] == 200
    assert 0.2 <= described["measured_fault_rate"] <= 0.4


def test_retriable_client_errors():
    for code in (
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._TRANSPORT,
        KafkaError._MSG_TIMED_OUT,
    ):
        assert retriable(KafkaError(code)), KafkaError(code).name()
    for code in (
        KafkaError.UNKNOWN,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError._FATAL,
    ):
        assert not retriable(KafkaError(code)), KafkaError(code).name()
