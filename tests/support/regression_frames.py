"""Request frames that once broke the broker, kept as regression cases.

Each is a whole frame as a client sends it (size prefix included) and the words the
broker's refusal must contain. tests/protocol/test_bounds.py decodes them,
tests/e2e/test_bad_input.py sends them to a broker, and the protocol fuzzer
(integration/chaos/fuzz.py) sends them, as they are and mutated, before anything else.

- OVER_LONG_ARRAYS: array lengths over the bytes left. kio reserved memory for the
  announced length before reading an item, and the agent died of SIGABRT.
- FORBIDDEN_NULLS: nulls where Kafka's schema allows none. kio read them as None and the
  handlers failed on them with a traceback.
- BAD_TAGGED_FIELDS: tagged-field sizes that disagree with the bytes; kio ignored them.
- CUT_SHORT: a body that stops after one byte, refused with a traceback at ERROR.
- NOT_REQUESTS: bytes that are no request at all (the connection closes).
"""

from __future__ import annotations

import datetime
import importlib
import struct
from dataclasses import dataclass

from protocol.codec import encode_request
from protocol.headers import RequestHeader, encode_request_header, request_header_version


@dataclass(frozen=True)
class BadFrame:
    case: str
    frame: bytes  # as sent: size prefix, header, body
    refusal: str  # what the broker says when it refuses it ("" where the case shows none)

    @property
    def payload(self) -> bytes:
        """The frame without its size prefix, as the broker's decoder gets it."""
        return self.frame[4:]


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request_frame(api_key: int, version: int, body: bytes, client_id: str = "fzz") -> bytes:
    """A whole request frame around a body written by hand (the header its version calls
    for, correlation id 1)."""
    header_version = request_header_version(api_key, version)
    assert header_version is not None, (api_key, version)
    header = RequestHeader(api_key, version, 1, client_id)
    return sized(encode_request_header(header, header_version) + body)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def produce_v9_body(topics: bytes, count: int) -> bytes:
    """transactional_id null, acks -1, timeout 1000 ms, then `count` topics."""
    return b"\x00" + b"\xff\xff\x00\x00\x03\xe8" + uvarint(count + 1) + topics + b"\x00"


def fetch_v15_with_tags(tags: bytes) -> bytes:
    """A whole Fetch v15 request frame whose own tagged fields are `tags` (count included)."""
    module = importlib.import_module("kio.schema.fetch.v15.request")
    request = module.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(),
        forgotten_topics_data=(),
        rack_id="",
    )
    frame = encode_request(request, correlation_id=1, client_id="c")
    assert frame.endswith(b"\x00")  # no tagged fields: the count alone
    return sized(frame[4:-1] + tags)


def _null(field: str) -> str:
    return f"non-nullable field {field} was serialized as null"


OVER_LONG_ARRAYS = (
    BadFrame(
        # Found from outside: a compact array length of 2**32-1 (2**32-2 topics) in 20
        # bytes; kio asked for 34 GB.
        "metadata-v9-2**32-2-topics",
        bytes.fromhex("000000100003000900000001ffff00ffffffff0f"),
        "MetadataRequest.topics has 4294967294 items",
    ),
    BadFrame(
        # A 5-byte varint holding 2**35-1 (kio reads all 35 bits): 2**35-2 topics.
        "metadata-v12-2**35-2-topics",
        request_frame(3, 12, b"\xff\xff\xff\xff\x7f" + b"\x00\x00\x00"),
        "MetadataRequest.topics has 34359738366 items",
    ),
    BadFrame(
        "metadata-v1-2**31-1-topics",
        request_frame(3, 1, struct.pack(">i", 2**31 - 1)),
        "MetadataRequest.topics has 2147483647 items",
    ),
    BadFrame(
        # Arrays of int32 inside a struct: OffsetFetch v1 partition indexes.
        "offset-fetch-v1-2**31-1-partition-indexes",
        request_frame(
            9, 1, b"\x00\x01g" + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">i", 2**31 - 1)
        ),
        "OffsetFetchRequestTopic.partition_indexes has 2147483647 items",
    ),
    BadFrame(
        # Read by protocol.produce (one topic): 2**35-2 partitions (kio: 256 GB).
        "produce-v9-2**35-2-partitions",
        request_frame(0, 9, b"\x00\xff\xff\x00\x00\x03\xe8\x02\x02t\xff\xff\xff\xff\x7f"),
        "TopicProduceData.partition_data has 34359738366 items",
    ),
    BadFrame(
        # Past protocol.produce's few partitions, kio reads Produce: 2**31-1 partitions.
        "produce-v9-2**31-1-partitions",
        request_frame(0, 9, b"\x00\xff\xff\x00\x00\x03\xe8\x02\x02t" + b"\x80\x80\x80\x80\x08"),
        "TopicProduceData.partition_data has 2147483647 items",
    ),
)

FORBIDDEN_NULLS = (
    BadFrame(
        # Found from outside: topics null (compact length 0).
        "offset-for-leader-epoch-v4-null-topics",
        bytes.fromhex(
            "00000024001700046fd0ff220003667a7a00020000000000000000000000000000000003667a0001"
        ),
        _null("OffsetForLeaderEpochRequest.topics"),
    ),
    BadFrame(
        # Found from outside: the resources array is null (-1), before any configs.
        "incremental-alter-configs-v0-null-resources",
        bytes.fromhex(
            "0000003f002c00000f6deb570003667a7affffffff010203667a0400000000ffffffffffffffff"
            "fffffffe0000000001fffffffffffffffffffffffe0000000002ffff"
        ),
        _null("IncrementalAlterConfigsRequest.resources"),
    ),
    BadFrame(
        # One topic resource whose configs array is null.
        "incremental-alter-configs-v0-null-configs",
        request_frame(
            44, 0, struct.pack(">i", 1) + b"\x02\x00\x01t" + struct.pack(">i", -1) + b"\x00"
        ),
        _null("AlterConfigsResource.configs"),
    ),
    BadFrame(
        "incremental-alter-configs-v1-null-configs",
        request_frame(44, 1, b"\x02" + b"\x02\x02t" + b"\x00" + b"\x00" + b"\x00" + b"\x00"),
        _null("AlterConfigsResource.configs"),
    ),
    BadFrame(
        # Read by protocol.produce (a few partitions).
        "produce-v9-null-partition-data",
        request_frame(0, 9, produce_v9_body(b"\x02t" + b"\x00" + b"\x00", 1)),
        _null("TopicProduceData.partition_data"),
    ),
    BadFrame(
        # Nine topics: read by kio, behind protocol.bounds.
        "produce-v9-null-partition-data-of-nine-topics",
        request_frame(
            0,
            9,
            produce_v9_body(
                (b"\x02t" + b"\x02" + b"\x00\x00\x00\x00" + b"\x01" + b"\x00" + b"\x00") * 8
                + b"\x02u\x00\x00",
                9,
            ),
        ),
        _null("TopicProduceData.partition_data"),
    ),
    BadFrame(
        "produce-v9-null-topic-data",
        request_frame(0, 9, b"\x00\xff\xff\x00\x00\x03\xe8\x00\x00"),
        _null("ProduceRequest.topic_data"),
    ),
    BadFrame(
        "produce-v3-null-partition-data",
        request_frame(
            0,
            3,
            b"\xff\xff\xff\xff\x00\x00\x03\xe8"
            + struct.pack(">i", 1)
            + b"\x00\x01t"
            + struct.pack(">i", -1),
        ),
        _null("TopicProduceData.partition_data"),
    ),
)

BAD_TAGGED_FIELDS = (
    # Tag 0 of FetchRequest is cluster_id: kio read the value after the size and ignored
    # the size.
    BadFrame(
        "known-size-past-the-frame",
        fetch_v15_with_tags(b"\x01" + b"\x00" + b"\xff\xff\xff\xff\x0f" + b"\x04abc"),
        "FetchRequest has a tagged field 0 of 4294967295 bytes",
    ),
    BadFrame(
        "known-size-under-its-value",
        fetch_v15_with_tags(b"\x01" + b"\x00" + b"\x01" + b"\x04abc"),
        "tagged field FetchRequest.cluster_id has a size of 1 bytes",
    ),
    BadFrame(
        "known-size-over-its-value",
        fetch_v15_with_tags(b"\x01" + b"\x00" + b"\x05" + b"\x04abc" + b"\x00"),
        "tagged field FetchRequest.cluster_id has a size of 5 bytes",
    ),
    BadFrame(
        "unknown-size-past-the-frame",
        fetch_v15_with_tags(b"\x01" + b"\x09" + b"\x80\x80\x80\x80\x01" + b"\x00"),
        "FetchRequest has a tagged field 9 of 268435456 bytes",
    ),
    BadFrame(
        "count-past-the-frame",
        fetch_v15_with_tags(b"\xff\xff\xff\xff\x0f"),
        "FetchRequest has 4294967295 tagged fields",
    ),
)

CUT_SHORT = (
    BadFrame(
        # A Metadata v12 request whose body stops after one byte: the header parses, the
        # body does not. Logged at ERROR with a traceback before bad input became an event.
        "metadata-v12-body-of-one-byte",
        request_frame(3, 12, b"\x05"),
        "MetadataRequest.topics has 4 items",
    ),
)

NOT_REQUESTS = (
    # "GET " read as a size is 1195725856 bytes, over socket.request.max.bytes.
    BadFrame("http-request", b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "1195725856"),
    BadFrame("negative-size", struct.pack(">i", -1) + b"\x00" * 16, "negative frame size"),
    # A size of 0 is a valid receive, but no request header fits in it.
    BadFrame("empty-frame", struct.pack(">i", 0), ""),
    # An API key no Kafka version knows.
    BadFrame("api-key-31000", sized(struct.pack(">hhi", 31_000, 0, 7) + b"\x00" * 40), ""),
)

ALL = OVER_LONG_ARRAYS + FORBIDDEN_NULLS + BAD_TAGGED_FIELDS + CUT_SHORT + NOT_REQUESTS
