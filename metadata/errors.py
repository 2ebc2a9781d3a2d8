"""Domain errors of the metadata layers: each carries the Kafka error code to answer with."""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class MetadataError(Exception):
    def __init__(self, error_code: ErrorCode, message: str = "") -> None:
        super().__init__(message or error_code.name)
        self.error_code = error_code
        self.message = message
