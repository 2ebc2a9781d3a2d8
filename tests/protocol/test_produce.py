"""Produce requests decoded without copying their records: the same entities as kio's
reader, for every version and for damaged input too."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest

from protocol import bounds, produce
from protocol.codec import _reader, decode_request, encode_request, request_schema
from protocol.errors import MalformedRequest
from protocol.headers import parse_request_header


def kio_decode(frame: bytes) -> Any:
    """What kio's own reader makes of the request body, behind protocol.bounds."""
    header, offset = parse_request_header(frame)
    schema = request_schema(header.api_key, header.api_version)
    try:
        bounds.check(schema, frame, offset)
        body, _consumed = _reader(schema)(frame, offset)
    except Exception as error:
        raise MalformedRequest(str(error)) from error
    return body


def random_request(rng: random.Random, version: int) -> Any:
    request_cls, topic_cls, partition_cls = produce._classes(version)
    topics = []
    for t in range(rng.randint(0, 4)):
        partitions = []
        for _ in range(rng.randint(0, 4)):
            records = rng.choice([None, b"", rng.randbytes(rng.randint(1, 3000))])
            partitions.append(partition_cls(index=rng.randint(-5, 2**31 - 1), records=records))
        name = rng.choice(["t", f"topic-{t}", "ünïcode-名前", "x" * 200])
        topics.append(topic_cls(name=name, partition_data=tuple(partitions)))
    return request_cls(
        transactional_id=rng.choice([None, "", "tx-1", "é" * 70]),
        acks=rng.choice([-1, 0, 1, 2, -32768]),
        timeout=datetime.timedelta(milliseconds=rng.randint(-(2**31), 2**31 - 1)),
        topic_data=tuple(topics),
    )


def frame_of(request: Any) -> bytes:
    return encode_request(request, correlation_id=17, client_id="c")[4:]


@pytest.mark.parametrize("version", list(produce.VERSIONS))
def test_same_entities_as_kio_and_records_are_views_of_the_frame(version: int) -> None:
    rng = random.Random(version)
    for _ in range(200):
        request = random_request(rng, version)
        frame = frame_of(request)
        body = decode_request(frame).body
        assert type(body) is type(request)
        assert body == request == kio_decode(frame)
        partitions = [p for topic in body.topic_data for p in topic.partition_data]
        for partition in partitions:
            if partition.records is not None and len(partitions) <= produce.MAX_PARTITIONS:
                assert isinstance(partition.records, memoryview)
                assert partition.records.obj is frame
            elif partition.records is not None:  # many partitions: kio read it, a copy
                assert type(partition.records) is bytes


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_damaged_requests_fail_or_parse_as_kio_says(version: int) -> None:
    """Cut short anywhere, or with bytes changed: malformed exactly when kio says so,
    and otherwise the same entity."""
    rng = random.Random(1000 + version)
    for _ in range(40):
        frame = frame_of(random_request(rng, version))
        header_end = parse_request_header(frame)[1]
        damaged = [frame[:cut] for cut in range(header_end, len(frame), 7)]
        for _ in range(60):
            data = bytearray(frame)
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(header_end, len(data))] = rng.choice((0, 0x7F, 0x80, 0xFF))
            damaged.append(bytes(data))
        for data in damaged:
            try:
                expected = kio_decode(data)
            except MalformedRequest:
                with pytest.raises(MalformedRequest):
                    decode_request(data)
                continue
            assert decode_request(data).body == expected


def test_null_records_read_as_none_and_null_arrays_are_malformed() -> None:
    request_cls, topic_cls, partition_cls = produce._classes(9)
    request = request_cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(topic_cls(name="t", partition_data=(partition_cls(index=0, records=None),)),),
    )
    body = decode_request(frame_of(request)).body
    assert body.topic_data[0].partition_data[0].records is None
    # Null topic and partition arrays: Kafka's schema allows neither.
    header = frame_of(request)[: parse_request_header(frame_of(request))[1]]
    start = header + b"\x00" + b"\xff\xff\x00\x00\x03\xe8"
    null_topics = start + b"\x00" + b"\x00"
    null_partitions = start + b"\x02" + b"\x02t" + b"\x00" + b"\x00" + b"\x00"
    for frame, field in [
        (null_topics, "ProduceRequest.topic_data"),
        (null_partitions, "TopicProduceData.partition_data"),
    ]:
        with pytest.raises(MalformedRequest, match=f"non-nullable field {field} "):
            decode_request(frame)
        with pytest.raises(MalformedRequest, match=f"non-nullable field {field} "):
            kio_decode(frame)
