from __future__ import annotations

import struct

import pytest

from protocol.errors import MalformedRequest, MalformedResponse, UnsupportedVersion
from protocol.headers import (
    RequestHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    request_header_version,
    response_header_version,
)

# (api_key, api_version, request header version); None = unknown to kio.
REQUEST_HEADER_VERSIONS = [
    (18, -1, 1),  # ApiVersions: any version has a header, see module rules
    (18, 0, 1),
    (18, 2, 1),
    (18, 3, 2),
    (18, 4, 2),
    (18, 99, 2),
    (3, 0, 1),  # Metadata keeps v0
    (3, 8, 1),
    (3, 9, 2),
    (3, 12, 2),
    (0, 2, None),  # Produce v0-2 removed by KIP-896
    (0, 3, 1),
    (0, 8, 1),
    (0, 9, 2),
    (1, 3, None),
    (1, 4, 1),
    (1, 11, 1),
    (1, 12, 2),
    (1, 15, 2),
    (1, 999, None),
    (10, 0, 1),  # FindCoordinator
    (10, 3, 2),
    (999, 0, None),
    (-1, 0, None),
]


@pytest.mark.parametrize(("api_key", "api_version", "expected"), REQUEST_HEADER_VERSIONS)
def test_request_header_version(api_key: int, api_version: int, expected: int | None) -> None:
    assert request_header_version(api_key, api_version) == expected


# (api_key, api_version, response header version)
RESPONSE_HEADER_VERSIONS = [
    (18, 0, 0),
    (18, 3, 0),  # flexible, but ApiVersions responses always use v0
    (18, 4, 0),
    (3, 1, 0),
    (3, 9, 1),
    (3, 12, 1),
    (0, 8, 0),
    (0, 9, 1),
    (1, 4, 0),
    (1, 12, 1),
    (1, 15, 1),
]


@pytest.mark.parametrize(("api_key", "api_version", "expected"), RESPONSE_HEADER_VERSIONS)
def test_response_header_version(api_key: int, api_version: int, expected: int) -> None:
    assert response_header_version(api_key, api_version) == expected


def test_response_header_version_of_unknown_api() -> None:
    with pytest.raises(UnsupportedVersion):
        response_header_version(999, 0)


# (header, header version, exact encoding)
HEADERS = [
    (
        RequestHeader(3, 1, 7, "abc"),
        1,
        b"\x00\x03\x00\x01\x00\x00\x00\x07\x00\x03abc",
    ),
    (
        RequestHeader(3, 12, 7, "abc"),
        2,
        b"\x00\x03\x00\x0c\x00\x00\x00\x07\x00\x03abc\x00",
    ),
    (RequestHeader(3, 1, -5, None), 1, b"\x00\x03\x00\x01\xff\xff\xff\xfb\xff\xff"),
    (RequestHeader(3, 12, 0, None), 2, b"\x00\x03\x00\x0c\x00\x00\x00\x00\xff\xff\x00"),
    (RequestHeader(3, 12, 2**31 - 1, ""), 2, b"\x00\x03\x00\x0c\x7f\xff\xff\xff\x00\x00\x00"),
    (
        RequestHeader(18, 3, 1, "prod-ü"),
        2,
        b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x07prod-\xc3\xbc\x00",
    ),
]


@pytest.mark.parametrize(("header", "version", "encoded"), HEADERS)
def test_request_header_round_trip(header: RequestHeader, version: int, encoded: bytes) -> None:
    assert encode_request_header(header, version) == encoded
    body = b"BODY"
    assert parse_request_header(encoded + body) == (header, len(encoded))
    assert parse_request_header(memoryview(encoded + body)) == (header, len(encoded))


def test_tagged_fields_in_request_header_are_skipped() -> None:
    fixed = struct.pack(">hhih", 3, 12, 9, 1) + b"c"
    # Two tagged fields: tag 0 of 3 bytes, tag 5 of 0 bytes.
    tagged = b"\x02" + b"\x00\x03xyz" + b"\x05\x00"
    header, offset = parse_request_header(fixed + tagged + b"body")
    assert header == RequestHeader(3, 12, 9, "c")
    assert offset == len(fixed) + len(tagged)


def test_unknown_api_yields_its_correlation_id_from_eight_bytes() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        parse_request_header(struct.pack(">hhi", 999, 3, 1234))
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (
        999,
        3,
        1234,
    )
    assert info.value.client_id is None


def test_removed_version_yields_its_correlation_id() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        parse_request_header(struct.pack(">hhih", 0, 2, 77, -1))
    assert info.value.correlation_id == 77


def test_api_versions_of_a_future_version_still_parses() -> None:
    encoded = encode_request_header(RequestHeader(18, 99, 31, "future"), 2)
    header, offset = parse_request_header(encoded)
    assert header == RequestHeader(18, 99, 31, "future")
    assert offset == len(encoded)


@pytest.mark.parametrize(("header", "version", "encoded"), HEADERS)
def test_every_truncation_is_malformed(header: RequestHeader, version: int, encoded: bytes) -> None:
    for cut in range(len(encoded)):
        with pytest.raises(MalformedRequest) as info:
            parse_request_header(encoded[:cut])
        if cut >= 8:
            assert info.value.correlation_id == header.correlation_id
            assert info.value.api_key == header.api_key
        else:
            assert info.value.correlation_id is None


@pytest.mark.parametrize(
    "tail",
    [
        struct.pack(">h", -2),  # negative length other than -1
        struct.pack(">h", 2) + b"\xff\xfe",  # not UTF-8
        struct.pack(">h", 0) + b"\x01\x00\x05ab",  # tagged field runs past the end
        struct.pack(">h", 0) + b"\x80\x80\x80\x80\x80\x01",  # varint too long
    ],
)
def test_malformed_v2_headers(tail: bytes) -> None:
    with pytest.raises(MalformedRequest) as info:
        parse_request_header(struct.pack(">hhi", 3, 12, 5) + tail)
    assert info.value.correlation_id == 5


@pytest.mark.parametrize(
    ("version", "encoded"),
    [(0, b"\x00\x00\x00\x2a"), (1, b"\x00\x00\x00\x2a\x00")],
)
def test_response_header_round_trip(version: int, encoded: bytes) -> None:
    assert encode_response_header(42, version) == encoded
    assert parse_response_header(encoded + b"body", version) == (42, len(encoded))


def test_response_header_with_tagged_fields() -> None:
    data = b"\x00\x00\x00\x01" + b"\x01\x03\x02hi" + b"body"
    assert parse_response_header(data, 1) == (1, 9)


@pytest.mark.parametrize(("data", "version"), [(b"\x00\x00\x01", 0), (b"\x00\x00\x00\x01", 1)])
def test_truncated_response_header(data: bytes, version: int) -> None:
    with pytest.raises(MalformedResponse):
        parse_response_header(data, version)


def test_header_versions_outside_the_protocol_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_request_header(RequestHeader(3, 1, 1, None), 0)
    with pytest.raises(ValueError):
        encode_response_header(1, 2)
