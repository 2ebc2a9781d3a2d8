"""Kafka request and response headers.

Rules (Apache Kafka's RequestHeader.json / ResponseHeader.json):

- Request header v1: api_key int16, api_version int16, correlation_id int32,
  client_id nullable *legacy* string (int16 length; -1 is null).
  v2 adds tagged fields after client_id; client_id stays a legacy string.
  v0 (no client_id) was removed by KIP-896 and is not supported.
- A request uses header v2 exactly when its API version is flexible, which
  kio records as the request schema's ``__header_schema__``.
- ApiVersions is special: v3+ requests use header v2, *including versions
  newer than any we know*, so that a client probing with a future version can
  still be answered (with a v0 ApiVersionsResponse carrying
  UNSUPPORTED_VERSION). Negative ApiVersions versions use header v1.
- For any other API key or version kio does not know, only the first eight
  bytes (api_key, api_version, correlation_id) are read, and
  ``UnsupportedVersion`` carries them so the broker can answer or close.
- Response header v0 is the correlation id; v1 adds tagged fields. Flexible
  responses use v1, except ApiVersions responses, which always use v0 (a
  client must read the response before it knows which versions we speak).
- Tagged fields in request headers are skipped: none are defined.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kio.index import KioIndexError, load_request_schema, load_response_schema

from .errors import MalformedRequest, MalformedResponse, UnsupportedVersion

__all__ = [
    "API_VERSIONS_KEY",
    "RequestHeader",
    "encode_request_header",
    "encode_response_header",
    "parse_request_header",
    "parse_response_header",
    "request_header_version",
    "response_header_version",
]

API_VERSIONS_KEY = 18

_FIXED = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_EMPTY_TAGGED_FIELDS = b"\x00"


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A parsed request header. ``client_id`` is None when the client sent null
    (Apache Kafka treats that as an empty client id)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


# Only known (api_key, api_version) pairs are cached: the remote chooses them,
# and must not be able to grow the cache without bound.
_request_header_versions: dict[tuple[int, int], int] = {}
_response_header_versions: dict[tuple[int, int], int] = {}


def request_header_version(api_key: int, api_version: int) -> int | None:
    """The request header version (1 or 2) for this API version, or None if
    kio does not know it (ApiVersions: always known, see module rules)."""
    if api_key == API_VERSIONS_KEY:
        return 2 if api_version >= 3 else 1
    version = _request_header_versions.get((api_key, api_version))
    if version is None:
        try:
            schema = load_request_schema(api_key, api_version)
        except KioIndexError:
            return None
        version = int(schema.__header_schema__.__version__)
        _request_header_versions[api_key, api_version] = version
    return version


def response_header_version(api_key: int, api_version: int) -> int:
    """The response header version (0 or 1) for this API version.

    :raises UnsupportedVersion: kio does not know this API key or version
        (with correlation id -1: there is no request to blame).
    """
    if api_key == API_VERSIONS_KEY:
        return 0
    version = _response_header_versions.get((api_key, api_version))
    if version is None:
        try:
            schema = load_response_schema(api_key, api_version)
        except KioIndexError:
            raise UnsupportedVersion(api_key, api_version, -1) from None
        version = int(schema.__header_schema__.__version__)
        _response_header_versions[api_key, api_version] = version
    return version


class _BadHeader(Exception):
    """A header does not parse; callers turn it into the right ProtocolError."""


def _read_uvarint(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    while True:
        if offset >= end:
            raise _BadHeader("header ends inside a varint")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, offset
        shift += 7
        if shift > 28:
            raise _BadHeader("header has a varint longer than 5 bytes")


def _skip_tagged_fields(data: bytes | memoryview, offset: int) -> int:
    count, offset = _read_uvarint(data, offset)
    for _ in range(count):
        _tag, offset = _read_uvarint(data, offset)
        size, offset = _read_uvarint(data, offset)
        offset += size
        if offset > len(data):
            raise _BadHeader("header ends inside a tagged field")
    return offset


def _read_client_id(data: bytes | memoryview, offset: int) -> tuple[str | None, int]:
    if len(data) < offset + 2:
        raise _BadHeader("header ends before client_id")
    (length,) = _INT16.unpack_from(data, offset)
    offset += 2
    if length == -1:
        return None, offset
    if length < 0:
        raise _BadHeader(f"header has a client_id of length {length}")
    end = offset + length
    if end > len(data):
        raise _BadHeader("header ends inside client_id")
    try:
        return str(data[offset:end], "utf-8"), end
    except UnicodeDecodeError:
        raise _BadHeader("header has a client_id that is not UTF-8") from None


def parse_request_header(data: bytes | memoryview) -> tuple[RequestHeader, int]:
    """Parse the header at the start of a request frame.

    Returns the header and the offset at which the body starts.

    :raises UnsupportedVersion: the API key or version is unknown (carries
        api_key, api_version and correlation_id).
    :raises MalformedRequest: the header is truncated or invalid.
    """
    if len(data) < _FIXED.size:
        raise MalformedRequest(f"request frame of {len(data)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _FIXED.unpack_from(data, 0)
    header_version = request_header_version(api_key, api_version)
    if header_version is None:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    try:
        client_id, offset = _read_client_id(data, _FIXED.size)
        if header_version >= 2:
            offset = _skip_tagged_fields(data, offset)
    except _BadHeader as error:
        raise MalformedRequest(
            f"request {error}",
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
        ) from None
    return RequestHeader(api_key, api_version, correlation_id, client_id), offset


def encode_request_header(header: RequestHeader, header_version: int) -> bytes:
    """Encode a request header of version 1 or 2."""
    if header_version not in (1, 2):
        raise ValueError(f"request header version {header_version} is not supported")
    fixed = _FIXED.pack(header.api_key, header.api_version, header.correlation_id)
    if header.client_id is None:
        client_id = _INT16.pack(-1)
    else:
        raw = header.client_id.encode()
        if len(raw) > 0x7FFF:
            raise ValueError("client_id is longer than 32767 bytes")
        client_id = _INT16.pack(len(raw)) + raw
    tagged = _EMPTY_TAGGED_FIELDS if header_version == 2 else b""
    return fixed + client_id + tagged


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    """Encode a response header of version 0 or 1 (empty tagged fields)."""
    if header_version == 0:
        return _INT32.pack(correlation_id)
    if header_version == 1:
        return _INT32.pack(correlation_id) + _EMPTY_TAGGED_FIELDS
    raise ValueError(f"response header version {header_version} is not supported")


def parse_response_header(data: bytes | memoryview, header_version: int) -> tuple[int, int]:
    """Parse a response header; return the correlation id and the body offset.

    :raises MalformedResponse: the header is truncated (the remote's fault).
    """
    if len(data) < 4:
        raise MalformedResponse(f"response frame of {len(data)} bytes has no correlation id")
    (correlation_id,) = _INT32.unpack_from(data, 0)
    offset = 4
    if header_version >= 1:
        try:
            offset = _skip_tagged_fields(data, offset)
        except _BadHeader as error:
            raise MalformedResponse(f"response {error}") from None
    return correlation_id, offset
