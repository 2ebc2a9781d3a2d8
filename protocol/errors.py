"""Errors raised by the protocol layer, each saying whose fault it is.

Rules:

- ``ProtocolError`` and its subclasses mean the *remote* peer broke the Kafka
  protocol. A broker closes the connection on ``MalformedFrame``,
  ``FrameTooLarge`` and ``MalformedRequest``. ``UnsupportedVersion`` is a
  ``ProtocolError`` too (Apache Kafka closes the connection), except for an
  ApiVersions request, which is answered with a v0 ApiVersionsResponse carrying
  UNSUPPORTED_VERSION: catch ``UnsupportedVersion`` before ``ProtocolError``.
- ``LocalProtocolError`` means *this* side tried to do something the protocol
  forbids (encode a value out of range, feed data after end of stream).
- ``RecordBatchError`` is about the records of one partition: it carries the
  Kafka ``ErrorCode`` to put on that partition; the connection stays open.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "FrameTooLarge",
    "LocalProtocolError",
    "MalformedFrame",
    "MalformedRequest",
    "MalformedResponse",
    "ProtocolError",
    "RecordBatchError",
    "UnsupportedVersion",
]


class ProtocolError(Exception):
    """The remote peer sent bytes that break the Kafka protocol (its fault)."""


class MalformedFrame(ProtocolError):
    """A size prefix is impossible (negative), or the stream ended mid-frame."""


class FrameTooLarge(ProtocolError):
    """A size prefix announces a frame larger than this connection accepts."""

    def __init__(self, size: int, max_frame_size: int) -> None:
        super().__init__(
            f"remote announced a frame of {size} bytes, over the limit of {max_frame_size}"
        )
        self.size = size
        self.max_frame_size = max_frame_size


class MalformedRequest(ProtocolError):
    """A frame whose header or body does not parse.

    ``api_key``, ``api_version`` and ``correlation_id`` are set when at least
    the first eight bytes of the header could be read, for logging.
    """

    def __init__(
        self,
        message: str,
        *,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class MalformedResponse(ProtocolError):
    """A response frame (received by a client) that does not parse."""


class UnsupportedVersion(ProtocolError):
    """The remote asked for an API key or version this codec does not know.

    ``client_id`` is known only when the header itself could be parsed (as it
    can for an ApiVersions request of any version); otherwise it is None.
    """

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        client_id: str | None = None,
    ) -> None:
        super().__init__(
            f"remote sent API key {api_key} version {api_version} "
            f"(correlation id {correlation_id}), which is not supported"
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id


class LocalProtocolError(Exception):
    """This side tried to do something the protocol forbids (our fault)."""


class RecordBatchError(Exception):
    """Record batches of one partition are unacceptable; answer ``error_code``.

    Raised for bytes the producer sent (its fault) and for stored bytes that
    fail to parse; the message says which check failed.
    """

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    def __repr__(self) -> str:
        return f"RecordBatchError({self.error_code.name}, {self.message!r})"
