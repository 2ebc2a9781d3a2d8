"""The broker on the S3 store (a real S3 API server: moto's server mode on 127.0.0.1)."""

from __future__ import annotations

import json
import time
import uuid

import boto3
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.storage.moto_support import TEST_BUCKET

pytestmark = pytest.mark.store_independent


def on_s3(start_broker, moto_s3, prefix, *args):
    """An agent on the moto server's bucket, under `prefix`, with more arguments."""
    return start_broker(
        extra_args=[
            "--storage",
            f"s3://{TEST_BUCKET}/{prefix}",
            "--s3-endpoint-url",
            moto_s3,
            *args,
        ],
        env={
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )


def test_produce_consume_on_s3(start_broker, moto_s3):
    prefix = f"e2e-{uuid.uuid4().hex}"
    broker = on_s3(
        start_broker, moto_s3, prefix, "--flush-interval-ms", "20", "--default-partitions", "3"
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    sent = {}
    for i in range(300):
        key = b"key-%d" % (i % 17)
        producer.produce("s3topic", key=key, value=b"value-%d" % i, headers=[("n", b"%d" % i)])
    assert producer.flush(20) == 0

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "s3", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("s3topic", p, 0) for p in range(3)])
    got: dict[int, list] = {}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.setdefault(msg.partition(), []).append(
            (msg.offset(), msg.key(), msg.value(), msg.headers())
        )
    consumer.close()
    values = sorted(v for recs in got.values() for _o, _k, v, _h in recs)
    assert values == sorted(b"value-%d" % i for i in range(300))
    for recs in got.values():
        assert [o for o, *_ in recs] == list(range(len(recs)))
        for _o, key, value, headers in recs:
            i = int(value.split(b"-")[1])
            assert key == b"key-%d" % (i % 17)
            assert headers == [("n", b"%d" % i)]
    del sent

    # The ingest files are in the bucket, under the prefix, and nothing else is.
    s3 = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=TEST_BUCKET, Prefix=prefix + "/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert keys and all(k.startswith(prefix + "/ingest/") for k in keys)


def test_slow_puts_are_sent_again_on_s3(start_broker, moto_s3):
    """A flush's PUT that outlasts the 95th percentile of the recent ones is sent a second
    time (storage.hedge, on by default on S3); whichever answers first acknowledges the
    batches, and every record reads back once."""
    # A long tail: median 2 ms, p99 400 ms (a lognormal), drawn per request.
    broker = on_s3(
        start_broker, moto_s3, f"e2e-{uuid.uuid4().hex}",
        "--flush-interval-ms", "2", "--inject-put-latency-ms", "2,400",
    )  # fmt: skip
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    stats_file = broker.data_dir / f"stats-{broker.port}.json"
    sent = 0
    hedge: dict = {}
    deadline = time.monotonic() + 30
    while not hedge.get("hedge_won") and time.monotonic() < deadline:
        for _ in range(20):  # one at a time: a flush each
            producer.produce("hedged", value=b"v-%d" % sent)
            sent += 1
            producer.flush(10)
        if stats_file.exists():
            hedge = json.loads(stats_file.read_text()).get("put_hedge", {})
    assert hedge.get("hedge_won"), hedge
    assert hedge["hedged"] < hedge["puts"] / 4, hedge  # the tail only

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "h", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("hedged", 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < sent and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    consumer.close()
    assert got == [b"v-%d" % i for i in range(sent)]
