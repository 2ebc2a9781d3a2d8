"""Produce request bodies, decoded without copying their records.

A Produce request is almost all records. kio's reader copies each partition's records out
of the frame into a new bytes object; here they are views of the frame instead, and the
rest (a few names and numbers) becomes the same kio entities kio's reader would build,
with the same values: plain ints and strings, the timeout as a timedelta, null records as
None. What does not parse raises (struct.error, ValueError, UnicodeDecodeError), as
kio's reader behind ``protocol.bounds`` does, and the caller reports it as a malformed
request: that includes a null array of topics or partitions, which Kafka's schema does
not allow. No length read here sizes anything before the bytes it announces are there.
"""

from __future__ import annotations

import datetime
import importlib
import struct
from functools import cache
from typing import Any

API_KEY = 0
# A request for more partitions than this is left to kio's reader: it builds each
# partition's entity in native code, faster than Python does, and the copy it saves
# here is then small beside that (the saving is about 30 us per MiB of records).
MAX_PARTITIONS = 8
# Versions whose layout this module reads: 3-8 classic, 9-11 flexible (compact fields and
# tagged fields). Later versions name topics by id.
VERSIONS = range(3, 12)
FIRST_FLEXIBLE = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


class ManyPartitions(Exception):
    """The request names more than MAX_PARTITIONS partitions: read it with kio instead."""


@cache
def _classes(version: int) -> tuple[Any, Any, Any]:
    module = importlib.import_module(f"kio.schema.produce.v{version}.request")
    return module.ProduceRequest, module.TopicProduceData, module.PartitionProduceData


def decode_produce_body(data: bytes | memoryview, offset: int, version: int) -> Any:
    """The ProduceRequest of `version` whose body starts at data[offset]; each
    partition's records are a memoryview of data (None when null).

    :raises ManyPartitions: before reading any records, when there are too many.
    """
    if version not in VERSIONS:
        raise ValueError(f"Produce v{version} is not read here")
    request_cls, topic_cls, partition_cls = _classes(version)
    flexible = version >= FIRST_FLEXIBLE
    view = memoryview(data)
    size = len(data)

    def length(position: int) -> tuple[int, int]:
        """A string, bytes or array length at position: -1 for null."""
        if flexible:
            value, position = _uvarint(data, position)
            return value - 1, position
        return _I32.unpack_from(data, position)[0], position + 4

    def string(position: int, where: str, nullable: bool) -> tuple[str | None, int]:
        if flexible:
            n, position = length(position)
        else:
            n = _I16.unpack_from(data, position)[0]
            position += 2
        if n < 0:
            if n == -1 and nullable:
                return None, position
            raise _null_or_negative(where, n)
        end = position + n
        if end > size:
            raise ValueError("a string past the end of the request")
        return str(view[position:end], "utf-8"), end

    def tags(position: int) -> int:
        if not flexible:
            return position
        count, position = _uvarint(data, position)
        for _ in range(count):
            _tag, position = _uvarint(data, position)
            n, position = _uvarint(data, position)
            position += n
        if position > size:
            raise ValueError("tagged fields past the end of the request")
        return position

    transactional_id, offset = string(offset, "ProduceRequest.transactional_id", True)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(data, offset)
    offset += 6
    topic_count, offset = length(offset)
    if topic_count > MAX_PARTITIONS:
        raise ManyPartitions
    if topic_count < 0:
        raise _null_or_negative("ProduceRequest.topic_data", topic_count)
    topics = []
    total = 0
    for _ in range(topic_count):
        name, offset = string(offset, "TopicProduceData.name", False)
        partition_count, offset = length(offset)
        total += max(partition_count, 0)
        if total > MAX_PARTITIONS:
            raise ManyPartitions
        if partition_count < 0:
            raise _null_or_negative("TopicProduceData.partition_data", partition_count)
        partitions = []
        for _ in range(partition_count):
            index = _I32.unpack_from(data, offset)[0]
            n, offset = length(offset + 4)
            records: memoryview | None = None
            if n >= 0:
                end = offset + n
                if end > size:
                    raise ValueError("records past the end of the request")
                records = view[offset:end]
                offset = end
            elif n != -1:
                raise ValueError(f"a records length of {n}")
            offset = tags(offset)
            partitions.append(partition_cls(index=index, records=records))
        offset = tags(offset)
        topics.append(topic_cls(name=name, partition_data=tuple(partitions)))
    tags(offset)
    return request_cls(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(topics),
    )


def _null_or_negative(where: str, length: int) -> ValueError:
    if length == -1:
        # Apache Kafka's generated readers say it in these words.
        return ValueError(f"non-nullable field {where} was serialized as null")
    return ValueError(f"{where} has a negative length ({length})")


def _uvarint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's lengths and counts)."""
    value = 0
    for shift in range(0, 35, 7):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
    raise ValueError("a varint longer than 5 bytes")
