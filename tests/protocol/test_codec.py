from __future__ import annotations

import datetime
import importlib
import struct
import uuid
from types import ModuleType
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from protocol.codec import (
    Gathered,
    decode_entity,
    decode_request,
    decode_response,
    encode_entity,
    encode_request,
    encode_response,
    encode_response_parts,
)
from protocol.errors import MalformedRequest, MalformedResponse, UnsupportedVersion
from protocol.headers import RequestHeader, encode_request_header
from protocol.records import rebase_parts

ZERO = datetime.timedelta(0)
TOPIC_ID = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")


def schema(name: str, version: int, kind: str) -> ModuleType:
    return importlib.import_module(f"kio.schema.{name}.v{version}.{kind}")


def a_batch() -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 16,
    )
    for index in range(3):
        builder.append(
            offset=index, timestamp=1_700_000_000_000, key=b"k", value=b"v" * index, headers=[]
        )
    return bytes(builder.build())


def api_versions(version: int) -> tuple[Any, Any]:
    request_module = schema("api_versions", version, "request")
    response_module = schema("api_versions", version, "response")
    if version >= 3:
        request = request_module.ApiVersionsRequest(
            client_software_name="bucketlog-tests", client_software_version="1.0"
        )
    else:
        request = request_module.ApiVersionsRequest()
    keys = tuple(
        response_module.ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, low, high in [(0, 3, 11), (1, 4, 16), (18, 0, 4)]
    )
    extra: dict[str, Any] = {} if version == 0 else {"throttle_time": ZERO}
    response = response_module.ApiVersionsResponse(
        error_code=ErrorCode.none, api_keys=keys, **extra
    )
    return request, response


def metadata(version: int) -> tuple[Any, Any]:
    request_module = schema("metadata", version, "request")
    response_module = schema("metadata", version, "response")
    if version == 1:
        request = request_module.MetadataRequest(
            topics=(request_module.MetadataRequestTopic(name="orders"),)
        )
        topic_extra: dict[str, Any] = {}
        partition_extra: dict[str, Any] = {}
        response_extra: dict[str, Any] = {}
    else:
        request = request_module.MetadataRequest(
            topics=(request_module.MetadataRequestTopic(topic_id=None, name="orders"),),
            include_topic_authorized_operations=False,
        )
        topic_extra = {"topic_id": TOPIC_ID}
        partition_extra = {"leader_epoch": 0, "offline_replicas": ()}
        response_extra = {"throttle_time": ZERO, "cluster_id": "cluster"}
    partitions = tuple(
        response_module.MetadataResponsePartition(
            error_code=ErrorCode.none,
            partition_index=index,
            leader_id=1,
            replica_nodes=(1,),
            isr_nodes=(1,),
            **partition_extra,
        )
        for index in range(3)
    )
    response = response_module.MetadataResponse(
        brokers=(response_module.MetadataResponseBroker(node_id=1, host="localhost", port=9092),),
        controller_id=1,
        topics=(
            response_module.MetadataResponseTopic(
                error_code=ErrorCode.none, name="orders", partitions=partitions, **topic_extra
            ),
        ),
        **response_extra,
    )
    return request, response


def produce(version: int) -> tuple[Any, Any]:
    request_module = schema("produce", version, "request")
    response_module = schema("produce", version, "response")
    request = request_module.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            request_module.TopicProduceData(
                name="orders",
                partition_data=(
                    request_module.PartitionProduceData(index=0, records=a_batch()),
                    request_module.PartitionProduceData(index=1, records=None),
                ),
            ),
        ),
    )
    extra: dict[str, Any] = {"record_errors": ()} if version >= 8 else {}
    response = response_module.ProduceResponse(
        responses=(
            response_module.TopicProduceResponse(
                name="orders",
                partition_responses=(
                    response_module.PartitionProduceResponse(
                        index=0, error_code=ErrorCode.none, base_offset=42, **extra
                    ),
                    response_module.PartitionProduceResponse(
                        index=1, error_code=ErrorCode.corrupt_message, base_offset=-1, **extra
                    ),
                ),
            ),
        ),
        throttle_time=ZERO,
    )
    return request, response


def fetch(version: int) -> tuple[Any, Any]:
    request_module = schema("fetch", version, "request")
    response_module = schema("fetch", version, "response")
    topic = {"topic": "orders"} if version < 13 else {"topic_id": TOPIC_ID}
    request_extra: dict[str, Any] = {} if version < 7 else {"forgotten_topics_data": ()}
    request = request_module.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=1,
        topics=(
            request_module.FetchTopic(
                partitions=(
                    request_module.FetchPartition(
                        partition=0, fetch_offset=10, partition_max_bytes=1 << 20
                    ),
                ),
                **topic,
            ),
        ),
        **request_extra,
    )
    response_extra: dict[str, Any] = {} if version < 7 else {"error_code": ErrorCode.none}
    partitions = (
        response_module.PartitionData(
            partition_index=0,
            error_code=ErrorCode.none,
            high_watermark=13,
            last_stable_offset=13,
            aborted_transactions=(
                response_module.AbortedTransaction(producer_id=7, first_offset=11),
            ),
            records=a_batch(),
        ),
        response_module.PartitionData(
            partition_index=1,
            error_code=ErrorCode.offset_out_of_range,
            high_watermark=0,
            aborted_transactions=None,
            records=None,
        ),
    )
    response = response_module.FetchResponse(
        throttle_time=ZERO,
        responses=(response_module.FetchableTopicResponse(partitions=partitions, **topic),),
        **response_extra,
    )
    return request, response


CASES = [
    *[("api_versions", v, api_versions) for v in range(5)],
    ("metadata", 1, metadata),
    ("metadata", 12, metadata),
    ("produce", 3, produce),
    ("produce", 9, produce),
    ("fetch", 4, fetch),
    ("fetch", 12, fetch),
    ("fetch", 15, fetch),
]


@pytest.mark.parametrize(("name", "version", "make"), CASES, ids=[f"{c[0]}-v{c[1]}" for c in CASES])
def test_round_trip(name: str, version: int, make: Any) -> None:
    request, response = make(version)
    data = encode_request(request, correlation_id=1234, client_id="tests")
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    decoded = decode_request(data[4:])
    assert decoded.header == RequestHeader(request.__api_key__, version, 1234, "tests")
    assert decoded.body == request

    encoded = encode_response(1234, response)
    (size,) = struct.unpack_from(">i", encoded)
    assert size == len(encoded) - 4
    answer = decode_response(encoded[4:], response.__api_key__, version)
    assert answer.correlation_id == 1234
    assert answer.body == response


@pytest.mark.parametrize("version", range(5))
def test_api_versions_responses_use_header_v0(version: int) -> None:
    _, response = api_versions(version)
    encoded = encode_response(9, response)
    # Size, correlation id, then the error code at once: no tagged-field byte.
    assert encoded[4:8] == b"\x00\x00\x00\x09"
    assert encoded[8:10] == b"\x00\x00"


def test_flexible_responses_use_header_v1() -> None:
    _, response = metadata(12)
    encoded = encode_response(9, response)
    assert encoded[4:9] == b"\x00\x00\x00\x09\x00"


def _fetch_v15_answer(records: Any) -> Any:
    """A FetchResponse v15 with one partition holding `records` (any bytes-like)."""
    module = schema("fetch", 15, "response")
    partition = module.PartitionData(
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=3,
        aborted_transactions=None,
        records=records,
    )
    return module.FetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        responses=(module.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=(partition,)),),
    )


def test_records_as_memoryview_encode_like_bytes() -> None:
    batch = a_batch()
    cache = bytearray(b"junk" + batch + b"junk")
    view = memoryview(cache)[4 : 4 + len(batch)]
    assert encode_response(1, _fetch_v15_answer(view)) == encode_response(
        1, _fetch_v15_answer(batch)
    )


def test_response_parts_pass_large_records_through_uncopied() -> None:
    batch = a_batch()
    records = bytearray(batch * (70_000 // len(batch) + 1))  # over 64 KiB: passed as is
    response = _fetch_v15_answer(records)
    parts = encode_response_parts(5, response)
    # Everything before the records is one part, then the records object itself, then
    # everything after it.
    assert len(parts) == 3 and parts[1] is records
    assert b"".join(parts) == encode_response(5, response)
    assert decode_response(b"".join(parts)[4:], 1, 15).body == response
    # Small answers are a single part.
    _, small = metadata(12)
    assert encode_response_parts(9, small) == [encode_response(9, small)]


def test_gathered_records_are_laid_out_in_place() -> None:
    batch = a_batch()
    cache = bytes(batch * (70_000 // len(batch) + 1))
    big = memoryview(cache)  # over 64 KiB: passed through
    head, rest = rebase_parts(big[: len(batch)], 0)
    pieces = [head, rest, big[len(batch) :]]
    response = _fetch_v15_answer(Gathered(pieces))
    parts = encode_response_parts(5, response)
    joined = b"".join(parts)
    assert joined == encode_response(5, _fetch_v15_answer(b"".join(pieces)))
    assert joined == encode_response(5, response)
    # The large piece is the cached object's view itself, not a copy of it.
    assert any(part is pieces[2] for part in parts)
    assert decode_response(joined[4:], 1, 15).body.responses[0].partitions[0].records == (
        b"".join(pieces)
    )


def test_decode_request_accepts_writable_buffers() -> None:
    request, _ = metadata(12)
    frame = encode_request(request, correlation_id=3)[4:]
    assert decode_request(bytearray(frame)).body == request
    assert decode_request(memoryview(bytearray(frame))).body == request


def test_trailing_bytes_are_ignored_like_kafka() -> None:
    request, _ = metadata(12)
    frame = encode_request(request, correlation_id=3)[4:]
    assert decode_request(frame + b"\x00garbage").body == request


@pytest.mark.parametrize(
    ("api_key", "api_version"),
    [(0, 2), (0, 14), (1, 3), (1, 99), (999, 0), (-1, 0), (3, -1)],
)
def test_unsupported_versions_carry_the_correlation_id(api_key: int, api_version: int) -> None:
    frame = struct.pack(">hhih", api_key, api_version, 5150, -1) + b"\x00" * 20
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(frame)
    assert info.value.api_key == api_key
    assert info.value.api_version == api_version
    assert info.value.correlation_id == 5150


def test_future_api_versions_request_yields_correlation_and_client_id() -> None:
    header = encode_request_header(RequestHeader(18, 99, 77, "librdkafka"), 2)
    # A future body we cannot parse.
    frame = header + b"\x07future stuff"
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(frame)
    assert (info.value.api_key, info.value.api_version) == (18, 99)
    assert info.value.correlation_id == 77
    assert info.value.client_id == "librdkafka"


def test_future_api_versions_request_with_unparseable_header() -> None:
    frame = struct.pack(">hhih", 18, 99, 78, 500)  # client_id longer than the frame
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(frame)
    assert info.value.correlation_id == 78
    assert info.value.client_id is None


def test_malformed_body() -> None:
    request, _ = metadata(12)
    frame = encode_request(request, correlation_id=6, client_id="c")[4:]
    header_size = len(encode_request_header(RequestHeader(3, 12, 6, "c"), 2))
    for cut in range(header_size, len(frame)):
        with pytest.raises(MalformedRequest) as info:
            decode_request(frame[:cut])
        assert info.value.correlation_id == 6
        assert info.value.api_key == 3


def test_malformed_varint_in_body() -> None:
    header = encode_request_header(RequestHeader(3, 12, 8, None), 2)
    with pytest.raises(MalformedRequest) as info:
        decode_request(header + b"\xff" * 12)
    assert info.value.correlation_id == 8


def test_malformed_response() -> None:
    _, response = metadata(12)
    encoded = encode_response(1, response)[4:]
    with pytest.raises(MalformedResponse):
        decode_response(encoded[:-3], 3, 12)


def test_entity_round_trip() -> None:
    module = importlib.import_module("kio.schema.consumer_protocol_assignment.v1.data")
    assignment = module.ConsumerProtocolAssignment(
        assigned_partitions=(module.TopicPartition(topic="orders", partitions=(0, 2)),),
        user_data=b"\x01\x02",
    )
    data = encode_entity(assignment)
    assert decode_entity(module.ConsumerProtocolAssignment, data) == assignment
    with pytest.raises(ValueError):
        decode_entity(module.ConsumerProtocolAssignment, data[:3])


@pytest.mark.parametrize("asked", [1, 2, 3, 4])
def test_client_reads_a_v0_unsupported_version_answer(asked: int) -> None:
    module = schema("api_versions", 0, "response")
    answer = module.ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(module.ApiVersion(api_key=18, min_version=0, max_version=2),),
    )
    response = decode_response(encode_response(5, answer)[4:], 18, asked)
    assert response.correlation_id == 5
    assert response.body == answer
    assert response.body.__version__ == 0


@pytest.mark.parametrize("version", range(5))
def test_api_versions_answers_are_read_at_their_own_version(version: int) -> None:
    _, answer = api_versions(version)
    response = decode_response(encode_response(5, answer)[4:], 18, version)
    assert response.body == answer
    assert response.body.__version__ == version


def test_garbage_api_versions_answer_is_malformed() -> None:
    with pytest.raises(MalformedResponse):
        decode_response(b"\x00\x00\x00\x05\xff\xff\xff", 18, 3)
