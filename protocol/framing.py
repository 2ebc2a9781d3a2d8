"""Kafka framing, sans I/O: bytes in, complete frames out.

Rules:

- Every request and response is ``[int32 size][size bytes]``, big-endian. The
  size does not count itself.
- A negative size is a ``MalformedFrame``; a size over ``max_frame_size`` is a
  ``FrameTooLarge`` (Kafka's ``socket.request.max.bytes``, 100 MiB by default).
  Both are raised as soon as the 4-byte prefix has arrived, before the body is
  buffered, and again on every later call: the connection is dead.
- ``receive_data(b"")`` means the peer closed its side (as in h11). A frame
  left half-received at that point is a ``MalformedFrame``.
- Frames are returned as ``bytes`` without the size prefix. Received bytes are
  kept as they came (views of them), and each frame is copied out once: a frame
  that spans many reads is joined from them in one step, not grown in a buffer.
- Nothing here touches a socket: the caller reads and writes.

``ClientConnection`` is the client side (used by tests and tools): it encodes
requests with fresh correlation ids and matches responses to them.
"""

from __future__ import annotations

import struct
from collections import deque

from kio.static.protocol import RequestPayload

from .codec import Response, decode_response, encode_request
from .errors import FrameTooLarge, LocalProtocolError, MalformedFrame, ProtocolError

__all__ = [
    # The errors this module raises, re-exported for its callers.
    "FrameTooLarge",
    "LocalProtocolError",
    "MalformedFrame",
    "ProtocolError",
    "DEFAULT_MAX_FRAME_SIZE",
    "ClientConnection",
    "Response",
    "ServerConnection",
    "frame",
]

DEFAULT_MAX_FRAME_SIZE = 104_857_600
"""100 MiB, Apache Kafka's default ``socket.request.max.bytes``."""

_SIZE = struct.Struct(">i")


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its 4-byte big-endian size."""
    if len(payload) > 0x7FFFFFFF:
        raise LocalProtocolError(f"a frame of {len(payload)} bytes does not fit an int32 size")
    return _SIZE.pack(len(payload)) + payload


class _FrameReader:
    """Splits a byte stream into size-prefixed frames."""

    __slots__ = ("_chunks", "_offset", "_buffered", "_size", "_max_frame_size", "_eof", "_error")

    def __init__(self, max_frame_size: int) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must not be negative")
        # What was received and not yet returned: the received bytes objects, of which
        # the first is used up to _offset.
        self._chunks: deque[bytes] = deque()
        self._offset = 0
        self._buffered = 0
        self._size = -1  # the size of the frame being received, once its prefix is read
        self._max_frame_size = max_frame_size
        self._eof = False
        self._error: ProtocolError | None = None

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return self._buffered + (4 if self._size >= 0 else 0)

    @property
    def at_eof(self) -> bool:
        """True once ``receive_data(b"")`` signalled the end of the stream."""
        return self._eof

    @property
    def pending_frame_size(self) -> int:
        """The size of the frame whose prefix was read by ``next_frame`` and whose body
        has not all arrived yet; -1 when there is none."""
        return self._size

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise LocalProtocolError("received data after the end of the stream")
        if not data:
            self._eof = True
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer
        self._chunks.append(data)
        self._buffered += len(data)

    def next_frame(self) -> bytes | None:
        if self._error is not None:
            raise self._error
        size = self._size
        if size < 0 and self._buffered >= 4:
            first = self._chunks[0]
            if len(first) - self._offset >= 4:
                (size,) = _SIZE.unpack_from(first, self._offset)
                self._skip(4)
            else:
                (size,) = _SIZE.unpack(self._take(4))
            if size < 0:
                self._error = MalformedFrame(f"remote sent a negative frame size ({size})")
                raise self._error
            if size > self._max_frame_size:
                self._error = FrameTooLarge(size, self._max_frame_size)
                raise self._error
            self._size = size
        if size >= 0 and self._buffered >= size:
            self._size = -1
            return self._take(size)
        if self._eof and self.buffered:
            self._error = MalformedFrame(
                f"stream ended inside a frame ({self.buffered} bytes left unparsed)"
            )
            raise self._error
        return None

    def _skip(self, n: int) -> None:
        """Drop n bytes that lie in the first chunk."""
        self._buffered -= n
        self._offset += n
        if self._offset == len(self._chunks[0]):
            self._chunks.popleft()
            self._offset = 0

    def _take(self, n: int) -> bytes:
        """The next n received bytes (n <= buffered), copied once at most."""
        if n == 0:
            return b""
        chunks = self._chunks
        first, offset = chunks[0], self._offset
        if len(first) - offset >= n:
            self._skip(n)
            if offset == 0 and len(first) == n:
                return first  # a whole chunk: no copy
            return first[offset : offset + n]
        self._buffered -= n
        parts: list[bytes | memoryview] = [memoryview(chunks.popleft())[offset:]]
        n -= len(parts[0])
        while n and n >= len(chunks[0]):
            chunk = chunks.popleft()
            parts.append(chunk)
            n -= len(chunk)
        if n:
            parts.append(memoryview(chunks[0])[:n])
        self._offset = n
        return b"".join(parts)


class ServerConnection:
    """The broker side of one connection: request frames in.

    Feed received bytes to ``receive_data`` and call ``next_frame`` until it
    returns None. Responses are complete frames already (see
    ``protocol.codec.encode_response``); the caller writes them.
    """

    __slots__ = ("_reader",)

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._reader = _FrameReader(max_frame_size)

    @property
    def max_frame_size(self) -> int:
        return self._reader.max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return self._reader.buffered

    @property
    def at_eof(self) -> bool:
        return self._reader.at_eof

    @property
    def pending_frame_size(self) -> int:
        """The announced size of the frame still arriving (after a ``next_frame`` call
        that returned None), or -1: lets the caller account for memory before reading
        the body."""
        return self._reader.pending_frame_size

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the socket; ``b""`` means the peer closed."""
        self._reader.receive_data(data)

    def next_frame(self) -> bytes | None:
        """Return the next complete request frame (no size prefix), or None.

        :raises MalformedFrame: negative size, or the stream ended mid-frame.
        :raises FrameTooLarge: size over ``max_frame_size``.
        """
        return self._reader.next_frame()


class ClientConnection:
    """The client side of one connection: requests out, matched responses in.

    ``send_request`` returns the bytes to write. Responses are matched to their
    requests by correlation id, which tells which schema decodes them. A
    Produce request with ``acks == 0`` expects no response.
    """

    __slots__ = ("_reader", "_client_id", "_next_correlation_id", "_pending")

    def __init__(
        self,
        client_id: str | None = "bucketlog",
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        first_correlation_id: int = 0,
    ) -> None:
        self._reader = _FrameReader(max_frame_size)
        self._client_id = client_id
        self._next_correlation_id = first_correlation_id
        self._pending: dict[int, tuple[int, int]] = {}

    @property
    def pending(self) -> int:
        """Requests sent whose response has not arrived."""
        return len(self._pending)

    def send_request(
        self, request: RequestPayload, *, correlation_id: int | None = None
    ) -> tuple[int, bytes]:
        """Encode ``request``; return its correlation id and the frame to write."""
        if correlation_id is None:
            correlation_id = self._next_correlation_id
            self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        if correlation_id in self._pending:
            raise LocalProtocolError(f"correlation id {correlation_id} is already in flight")
        data = encode_request(request, correlation_id=correlation_id, client_id=self._client_id)
        if not (request.__api_key__ == 0 and getattr(request, "acks", None) == 0):
            self._pending[correlation_id] = (request.__api_key__, request.__version__)
        return correlation_id, data

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the socket; ``b""`` means the peer closed."""
        self._reader.receive_data(data)

    def next_response(self) -> Response | None:
        """Return the next complete response, or None if more data is needed.

        :raises ProtocolError: bad framing, an unknown correlation id, or a
            body that does not parse.
        """
        payload = self._reader.next_frame()
        if payload is None:
            return None
        if len(payload) < 4:
            raise MalformedFrame(f"response frame of {len(payload)} bytes has no correlation id")
        (correlation_id,) = _SIZE.unpack_from(payload, 0)
        try:
            api_key, api_version = self._pending.pop(correlation_id)
        except KeyError:
            raise ProtocolError(
                f"remote answered correlation id {correlation_id}, which is not in flight"
            ) from None
        return decode_response(payload, api_key, api_version)
