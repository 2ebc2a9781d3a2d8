"""Request decoding and response encoding with kio entities.

Rules:

- This is the only module that imports kio's reader (``kio.serial``;
  ``protocol.bounds`` reads its field introspection, ``protocol.writers`` its
  choice of writers): kio's reader API has changed between releases, so it is
  wrapped here and nowhere else. Entities are written by ``protocol.writers``,
  kio's bytes with less Python per field.
- Every body is checked by ``protocol.bounds`` before kio's reader sees it: kio
  reserves memory for any array length the remote announces, and reads a null
  array as None where the schema allows none. Both are a ``MalformedRequest``
  (``MalformedResponse``, or ``ValueError`` from ``decode_entity``).
- ``decode_request`` takes one frame (no size prefix) and returns the header
  and the kio request entity. Unknown API keys/versions raise
  ``UnsupportedVersion`` with the correlation id; bytes that do not parse raise
  ``MalformedRequest``. Bytes after the body are ignored, as Apache Kafka
  does (``RequestContext.parseRequest`` never checks for a remainder).
- ``encode_response`` returns the complete frame: size prefix, the header the
  response's API version calls for (``protocol.headers``), and the body. The
  body is written as a list of parts joined once, so the records bytes of a
  FetchResponse are copied exactly once, into the frame. Records may be given
  as ``bytes``, a ``bytearray``, a ``memoryview`` over a cache, or ``Gathered``
  pieces (numbered batch heads and views of cached batch bodies), which are
  laid out in the frame in order without being joined first.
  ``encode_response_parts`` returns the frame as parts instead, with the large
  ones (records) not copied at all, for a writer that sends them in order.
- kio readers and writers are built once per entity class and cached. Produce
  requests for a few partitions are read by ``protocol.produce`` instead, which
  leaves their records as views of the frame and checks lengths and nulls itself.
- The client-side pair ``encode_request`` / ``decode_response`` serves tests
  and tools.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader
from kio.static.protocol import Entity, RequestPayload, ResponsePayload

from . import bounds, produce, writers
from .errors import (
    LocalProtocolError,
    MalformedRequest,
    MalformedResponse,
    UnsupportedVersion,
)
from .headers import (
    API_VERSIONS_KEY,
    RequestHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    request_header_version,
    response_header_version,
)

__all__ = [
    # The errors this module raises, re-exported for its callers.
    "LocalProtocolError",
    "MalformedRequest",
    "MalformedResponse",
    "UnsupportedVersion",
    "Request",
    "Response",
    "Gathered",
    "decode_entity",
    "decode_request",
    "decode_response",
    "encode_entity",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "request_schema",
    "response_schema",
]

E = TypeVar("E", bound=Entity)
_Reader = Callable[[bytes | memoryview, int], tuple[Any, int]]

_SIZE = struct.Struct(">i")
_MAX_FRAME = 0x7FFFFFFF
# encode_response_parts passes parts of this size or more through without joining them.
LARGE_PART = 64 * 1024


class Gathered:
    """A bytes value given as pieces, for a records field of a response.

    kio's writers take only ``len()`` of a bytes value and hand the value itself to
    ``write``; ``encode_response_parts`` then lays the pieces out in its place. Nothing
    else may read it as bytes.
    """

    __slots__ = ("pieces", "nbytes")

    def __init__(self, pieces: list[bytes | memoryview]) -> None:
        self.pieces = pieces
        self.nbytes = sum(map(len, pieces))

    def __len__(self) -> int:
        return self.nbytes


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header and its kio body entity."""

    header: RequestHeader
    body: RequestPayload


@dataclass(frozen=True, slots=True)
class Response:
    """A decoded response: its correlation id and its kio body entity."""

    correlation_id: int
    body: ResponsePayload


_readers: dict[type[Entity], _Reader] = {}


def _reader(entity_type: type[Entity]) -> _Reader:
    reader = _readers.get(entity_type)
    if reader is None:
        reader = cast(_Reader, entity_reader(entity_type))
        _readers[entity_type] = reader
    return reader


# Built once per entity class and kept (protocol.writers caches them).
_writer = writers.entity_writer


# Only known (api_key, api_version) pairs are cached: the remote chooses them, so the
# cache holds at most the pairs kio has.
_request_schemas: dict[tuple[int, int], type[RequestPayload]] = {}


def request_schema(api_key: int, api_version: int) -> type[RequestPayload] | None:
    """kio's request class for this API version, or None if unknown."""
    schema = _request_schemas.get((api_key, api_version))
    if schema is not None:
        return schema
    try:
        schema = load_request_schema(api_key, api_version)
    except KioIndexError:
        return None
    _request_schemas[api_key, api_version] = schema
    return schema


def response_schema(api_key: int, api_version: int) -> type[ResponsePayload] | None:
    """kio's response class for this API version, or None if unknown."""
    try:
        return load_response_schema(api_key, api_version)
    except KioIndexError:
        return None


def _read_only(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    # kio's native reader refuses writable buffers.
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    return view if view.readonly else view.toreadonly()


def decode_request(frame: bytes | bytearray | memoryview) -> Request:
    """Decode one request frame (without its size prefix).

    :raises UnsupportedVersion: kio does not know the API key or version;
        for ApiVersions the client id is filled in when the header parsed.
    :raises MalformedRequest: the header or body does not parse.
    """
    data = _read_only(frame)
    try:
        header, offset = parse_request_header(data)
    except MalformedRequest as error:
        # A client probing with a future ApiVersions version must still get an
        # answer even if that version's header is one we cannot parse.
        if error.api_key == API_VERSIONS_KEY and error.correlation_id is not None:
            assert error.api_version is not None
            if request_schema(API_VERSIONS_KEY, error.api_version) is None:
                raise UnsupportedVersion(
                    API_VERSIONS_KEY, error.api_version, error.correlation_id
                ) from None
        raise
    schema = request_schema(header.api_key, header.api_version)
    if schema is None:
        raise UnsupportedVersion(
            header.api_key, header.api_version, header.correlation_id, header.client_id
        )
    try:
        body = None
        if header.api_key == produce.API_KEY and header.api_version in produce.VERSIONS:
            try:
                body = produce.decode_produce_body(data, offset, header.api_version)
            except produce.ManyPartitions:
                pass
        if body is None:
            bounds.check(schema, data, offset)
            body, _consumed = _reader(schema)(data, offset)
    except Exception as error:
        # Whatever kio's reader or protocol.produce raises here is about the bytes given.
        raise MalformedRequest(
            f"{schema.__name__} v{header.api_version} body does not parse: {error}",
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
        ) from error
    return Request(header, body)


def _frame_parts(head: bytes, entity: Entity) -> writers.Parts:
    parts = writers.Parts((b"", head))
    try:
        _writer(type(entity))(parts, entity)
    except Exception as error:
        raise LocalProtocolError(f"cannot encode {type(entity).__name__}: {error}") from error
    size = sum(map(len, parts))
    if size > _MAX_FRAME:
        raise LocalProtocolError(f"a frame of {size} bytes does not fit an int32 size")
    parts[0] = _SIZE.pack(size)
    return parts


def _encode_frame(head: bytes, entity: Entity) -> bytes:
    return b"".join(_frame_parts(head, entity))


def encode_response(correlation_id: int, response: ResponsePayload) -> bytes:
    """Encode ``response`` as a complete frame: size prefix, header, body."""
    return b"".join(encode_response_parts(correlation_id, response, join_below=0))


def encode_response_parts(
    correlation_id: int, response: ResponsePayload, *, join_below: int = LARGE_PART
) -> list[bytes | bytearray | memoryview]:
    """``encode_response`` without the final copy: the frame as a list of parts, in order.

    Every run of parts smaller than ``join_below`` bytes is joined into one; larger parts
    (the records of a Fetch answer) are returned as given, so the caller can write the
    frame to a socket without copying them once more.
    """
    header_version = response_header_version(response.__api_key__, response.__version__)
    parts = _frame_parts(encode_response_header(correlation_id, header_version), response)
    out: list[bytes | bytearray | memoryview] = []
    run: list[bytes | memoryview] = []
    # kio hands a Gathered records value to write() as it is (see Gathered).
    for part in cast("list[bytes | memoryview | Gathered]", parts):
        for piece in part.pieces if isinstance(part, Gathered) else (part,):
            if len(piece) < join_below:
                run.append(piece)
                continue
            if run:
                out.append(b"".join(run))
                run = []
            out.append(piece)
    if run:
        out.append(b"".join(run))
    return out


def encode_request(
    request: RequestPayload, *, correlation_id: int, client_id: str | None = None
) -> bytes:
    """Encode ``request`` as a complete frame: size prefix, header, body."""
    api_key = int(request.__api_key__)
    api_version = int(request.__version__)
    header_version = request_header_version(api_key, api_version)
    if header_version is None:
        raise LocalProtocolError(f"API key {api_key} version {api_version} is unknown")
    header = RequestHeader(api_key, api_version, correlation_id, client_id)
    return _encode_frame(encode_request_header(header, header_version), request)


def decode_response(
    frame: bytes | bytearray | memoryview, api_key: int, api_version: int
) -> Response:
    """Decode one response frame (without its size prefix) to the request's
    API key and version.

    An ApiVersions response that does not parse as the version asked for is
    read as v0, as the Java client does: a broker answers a version it lacks
    with a v0 UNSUPPORTED_VERSION response. ``body.__version__`` tells which.

    :raises MalformedResponse: the frame does not parse.
    """
    schema = response_schema(api_key, api_version)
    if schema is None:
        raise LocalProtocolError(f"API key {api_key} version {api_version} is unknown")
    data = _read_only(frame)
    correlation_id, offset = parse_response_header(
        data, response_header_version(api_key, api_version)
    )
    try:
        bounds.check(schema, data, offset)
        body, consumed = _reader(schema)(data, offset)
        if api_key == API_VERSIONS_KEY and offset + consumed != len(data):
            raise MalformedResponse(f"{len(data) - offset - consumed} bytes left over")
    except Exception as error:
        fallback = response_schema(API_VERSIONS_KEY, 0)
        if api_key == API_VERSIONS_KEY and api_version != 0 and fallback is not None:
            try:
                bounds.check(fallback, data, offset)
                body, consumed = _reader(fallback)(data, offset)
            except Exception:
                pass
            else:
                if offset + consumed == len(data):
                    return Response(correlation_id, body)
        raise MalformedResponse(
            f"{schema.__name__} (correlation id {correlation_id}) does not parse: {error}"
        ) from error
    return Response(correlation_id, body)


def encode_entity(entity: Entity) -> bytes:
    """Encode any kio entity alone (no header, no size prefix), e.g. a
    ConsumerProtocolAssignment carried as bytes inside SyncGroup."""
    parts = writers.Parts()
    _writer(type(entity))(parts, entity)
    return b"".join(parts)


def decode_entity(entity_type: type[E], data: bytes | bytearray | memoryview) -> E:
    """Decode a kio entity from ``data`` (bytes after it are ignored).

    :raises ValueError: the bytes do not parse.
    """
    view = _read_only(data)
    try:
        bounds.check(entity_type, view, 0)
        entity, _consumed = _reader(entity_type)(view, 0)
    except Exception as error:
        raise ValueError(f"{entity_type.__name__} does not parse: {error}") from error
    return cast(E, entity)
