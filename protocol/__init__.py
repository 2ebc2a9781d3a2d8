"""The Kafka wire protocol, sans I/O: bytes in, frames and kio entities out.

- ``framing``: size-prefixed frames (``ServerConnection``, ``ClientConnection``).
- ``headers``: request headers v1/v2 and response headers v0/v1.
- ``codec``: kio request/response entities (the only user of kio's reader and writer).
- ``bounds``: lengths and nulls of a body, checked before kio's reader allocates.
- ``records``: zero-copy record batch views, validation, offset rebasing.
- ``compression``: the record batch codecs, off the hot path.
- ``errors``: every error says whose fault it is.

This package imports none of ours (broker, storage, metadata) and does no I/O.
"""
