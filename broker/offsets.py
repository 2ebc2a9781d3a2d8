"""Offset lookups by timestamp, answered exactly as Apache Kafka answers them.

By timestamp T: the first offset, in log order, whose record timestamp is >= T. The
chunk index narrows the search to the first run whose max timestamp is >= T; inside it
the first batch whose max timestamp is >= T is decoded (off the hot path) and its first
record with timestamp >= T is the answer.

Max timestamp: the first batch (in offset order) holding the partition's largest
timestamp, and inside it the first record carrying that timestamp.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from broker.context import AgentServices
from metadata import log as log_layer
from protocol.records import iter_batches, iter_records

PAGE = 256
NOT_FOUND = (-1, -1)


async def _entries(
    agent: AgentServices, topic_id: bytes, partition: int
) -> list[log_layer.ChunkEntry]:
    """Every chunk entry of the partition, in offset order."""

    def txn(tr: Any) -> list[log_layer.ChunkEntry]:
        state = log_layer.get_partition(tr, agent.sub, topic_id, partition)
        if state is None:
            return []
        out: list[log_layer.ChunkEntry] = []
        start = state.log_start_offset
        while True:
            page = log_layer.read_chunks(tr, agent.sub, topic_id, partition, start, PAGE)
            out.extend(page)
            if len(page) < PAGE:
                return out
            start = page[-1].last_offset + 1

    result: list[log_layer.ChunkEntry] = await agent.kv.read(txn)
    return result


def _batches(entry: log_layer.ChunkEntry, data: bytes) -> Iterator[tuple[int, Any]]:
    offset = entry.base_offset
    for view in iter_batches(data):
        yield offset, view
        offset += view.last_offset_delta + 1


async def offset_for_timestamp(
    agent: AgentServices, topic_id: bytes, partition: int, timestamp: int, log_start: int
) -> tuple[int, int]:
    """(offset, timestamp) of the first record with timestamp >= the given one."""
    for entry in await _entries(agent, topic_id, partition):
        if entry.max_timestamp < timestamp:
            continue
        data = await agent.reader.read(entry.object_key, entry.start, entry.start + entry.length)
        for first, view in _batches(entry, data):
            if view.max_timestamp < timestamp:
                continue
            for record in iter_records(view):
                offset = first + record.offset_delta
                if record.timestamp >= timestamp and offset >= log_start:
                    return offset, record.timestamp
    return NOT_FOUND


async def offset_of_max_timestamp(
    agent: AgentServices, topic_id: bytes, partition: int, log_start: int
) -> tuple[int, int]:
    best: log_layer.ChunkEntry | None = None
    for entry in await _entries(agent, topic_id, partition):
        if best is None or entry.max_timestamp > best.max_timestamp:
            best = entry
    if best is None:
        return NOT_FOUND
    data = await agent.reader.read(best.object_key, best.start, best.start + best.length)
    for first, view in _batches(best, data):
        if view.max_timestamp != best.max_timestamp:
            continue
        for record in iter_records(view):
            if record.timestamp == view.max_timestamp:
                return max(first + record.offset_delta, log_start), record.timestamp
    return NOT_FOUND
