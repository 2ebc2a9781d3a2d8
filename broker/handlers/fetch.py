"""Fetch: chunk index lookup, ranged reads (cache first), baseOffset rewrite, long poll.

Sessionless: every answer carries session id 0, which tells clients to send full fetch
requests. Records are never decoded; only batch headers are walked to number them.
The first batch of a response is returned even when it is larger than the byte limits
(as Kafka does since KIP-74), so a consumer can always make progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from broker.entities import build, ms
from broker.handlers import api, response_class
from metadata import log as log_layer
from metadata import topics as topics_layer
from metadata import txns
from metadata.chunk_cache import read_chunks_cached
from protocol.codec import Gathered
from protocol.records import iter_batches, numbered_parts

API_KEY = 1
READ_COMMITTED = 1
ENTRIES_PER_READ = 16
# A read of this many partitions or fewer is a handful of point reads and short ranges:
# the metadata store may run it without a thread switch. read_committed also lists the
# aborted transactions, which is not bounded; such a read stays quick while each partition
# has at most QUICK_ABORT_MARKERS abort markers to read, and goes to a thread otherwise.
QUICK_READ_PARTITIONS = 16
QUICK_ABORT_MARKERS = 64
LEADER_EPOCH = 0  # no replication, no truncation: one epoch forever


@dataclass(slots=True)
class _Wanted:
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    topic: topics_layer.Topic | None
    missing: ErrorCode  # the error for a topic that is not (or no longer) there
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)
    records: Gathered | bytes = b""
    entries: list[log_layer.ChunkEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Read:
    state: log_layer.PartitionState | None
    last_stable_offset: int
    entries: list[log_layer.ChunkEntry]
    aborted: list[tuple[int, int]]


class _LongRead(Exception):
    """A quick read found more abort markers than it may read."""


def _read_partitions(
    agent: Any, wanted: list[_Wanted], read_committed: bool, abort_marker_limit: int = 0
) -> Any:
    def txn(tr: Any) -> list[_Read]:
        out = []
        for w in wanted:
            if w.topic is None:
                out.append(_Read(None, -1, [], []))
                continue
            tid = w.topic.topic_id
            state = log_layer.get_partition(tr, agent.sub, tid, w.partition)
            if state is None:
                out.append(_Read(None, -1, [], []))
                continue
            lso = txns.last_stable_offset(tr, agent.sub, tid, w.partition, state.high_watermark)
            end = lso if read_committed else state.high_watermark
            entries: list[log_layer.ChunkEntry] = []
            aborted: list[tuple[int, int]] = []
            if state.log_start_offset <= w.fetch_offset < end:
                # Only the entries a budget of partition_max_bytes can take from.
                entries = read_chunks_cached(
                    tr,
                    agent.chunks,
                    agent.sub,
                    tid,
                    w.partition,
                    w.fetch_offset,
                    ENTRIES_PER_READ,
                    w.partition_max_bytes,
                    state.high_watermark,
                )
                if read_committed:
                    found = txns.aborted_between(
                        tr,
                        agent.sub,
                        tid,
                        w.partition,
                        w.fetch_offset,
                        end,
                        scan_limit=abort_marker_limit,
                    )
                    if found is None:
                        raise _LongRead
                    aborted = found
            out.append(_Read(state, lso, entries, aborted))
        return out

    return txn


async def _read_states(
    agent: Any, wanted: list[_Wanted], read_committed: bool, quick: bool
) -> list[_Read]:
    if quick:
        try:
            return await agent.kv.read(
                _read_partitions(agent, wanted, read_committed, QUICK_ABORT_MARKERS), quick=True
            )
        except _LongRead:
            pass
    return await agent.kv.read(_read_partitions(agent, wanted, read_committed))


def _select(
    entries_data: list[tuple[log_layer.ChunkEntry, bytes | memoryview]],
    fetch_offset: int,
    end_offset: int,
    budget: int,
    must_take_one: bool,
) -> tuple[Gathered, int]:
    """Batches from fetch_offset on, within budget bytes; returns (records, bytes used).

    The records are the selected batches' new heads (their offsets) and views of their
    bodies where they are (the cache): nothing is copied here."""
    pieces: list[bytes | memoryview] = []
    used = 0
    for entry, data in entries_data:
        next_offset = entry.base_offset
        for view in iter_batches(data):
            batch_first = next_offset
            next_offset += view.last_offset_delta + 1
            if next_offset <= fetch_offset:
                continue
            if batch_first >= end_offset:  # read_committed: not past the last stable offset
                return Gathered(pieces), used
            if used + view.size > budget and not (must_take_one and used == 0):
                return Gathered(pieces), used
            pieces += numbered_parts(view, batch_first, LEADER_EPOCH)
            used += view.size
    return Gathered(pieces), used


@api(API_KEY, 4, 17)
async def handle(request: Any, ctx: Any) -> Any:
    agent = ctx.agent
    version = ctx.api_version
    if getattr(request, "session_id", 0) != 0 and getattr(request, "session_epoch", -1) > 0:
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "error_code": ErrorCode.fetch_session_id_not_found,
                "session_id": 0,
                "responses": [],
            },
        )
    # Resolve every requested partition once.
    topic_order: list[tuple[Any, list[_Wanted]]] = []
    for fetch_topic in request.topics:
        topic_id = getattr(fetch_topic, "topic_id", None)
        if version >= 13:
            topic = await agent.topic_by_id(topic_id.bytes) if topic_id is not None else None
            missing = ErrorCode.unknown_topic_id
            ref: Any = topic_id
        else:
            topic = await agent.topic(fetch_topic.topic)
            missing = ErrorCode.unknown_topic_or_partition
            ref = fetch_topic.topic
        parts = []
        for fp in fetch_topic.partitions:
            w = _Wanted(fp.partition, fp.fetch_offset, fp.partition_max_bytes, topic, missing)
            if topic is None:
                w.error = missing
                w.topic = None
            elif not 0 <= fp.partition < topic.partitions:
                w.error = ErrorCode.unknown_topic_or_partition
                w.topic = None
            parts.append(w)
        topic_order.append((ref, parts))
    wanted = [w for _ref, parts in topic_order for w in parts]

    max_wait = ms(request.max_wait) / 1000
    min_bytes = max(int(request.min_bytes), 0)
    max_bytes = int(getattr(request, "max_bytes", 2**31 - 1))
    deadline = anyio.current_time() + max_wait
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    quick = len(wanted) <= QUICK_READ_PARTITIONS
    keys = [(w.topic.topic_id, w.partition) for w in wanted if w.topic is not None]
    # Watched from before the first read: an append between a read and the wait wakes it.
    with agent.notifier.watch(keys) as watch:
        while True:
            watch.arm()
            states = await _read_states(agent, wanted, read_committed, quick)
            reads: list[tuple[str, int, int]] = []
            for w, read in zip(wanted, states, strict=True):
                if w.topic is None:
                    continue
                state, entries = read.state, read.entries
                if state is None:  # deleted since the request came
                    w.error = w.missing
                    w.high_watermark = w.last_stable_offset = w.log_start_offset = -1
                    w.aborted, w.entries, w.records = [], [], b""
                    continue
                w.high_watermark = state.high_watermark
                w.last_stable_offset = read.last_stable_offset
                w.log_start_offset = state.log_start_offset
                w.aborted = read.aborted
                if not state.log_start_offset <= w.fetch_offset <= state.high_watermark:
                    w.error = ErrorCode.offset_out_of_range
                w.entries = entries
                for e in w.entries:
                    reads.append((e.object_key, e.start, e.start + e.length))
                behind = bool(entries) and entries[-1].last_offset + 1 < state.high_watermark
                if behind and (
                    any(e.object_key not in agent.cache for e in entries)
                    or agent.read_ahead.was_read_ahead(entries[-1].object_key)
                ):
                    # Reading behind the cache: have the next stretch there for the next Fetch.
                    agent.read_ahead.request(
                        w.topic.topic_id,
                        w.partition,
                        # From the last entry read: the next Fetch may start inside it.
                        entries[-1].base_offset,
                        w.partition_max_bytes,
                    )
            blobs = await agent.reader.read_many(reads) if reads else []
            i = 0
            total = 0
            for w in wanted:
                if not w.entries:
                    continue
                entries_data = []
                for e in w.entries:
                    entries_data.append((e, blobs[i]))
                    i += 1
                budget = max(0, min(w.partition_max_bytes, max_bytes - total))
                end = w.last_stable_offset if read_committed else w.high_watermark
                w.records, used = _select(
                    entries_data, w.fetch_offset, end, budget, must_take_one=total == 0
                )
                total += used
            remaining = deadline - anyio.current_time()
            has_error = any(w.error != ErrorCode.none for w in wanted)
            if total >= min_bytes or remaining <= 0 or has_error or not wanted:
                break
            ctx.end_turn()  # a Fetch takes no effect: what comes after it need not wait
            with anyio.move_on_after(remaining):
                await watch.wait()

    responses = []
    for ref, parts in topic_order:
        responses.append(
            {
                "topic": ref if version < 13 else None,
                "topic_id": ref if version >= 13 else None,
                "partitions": [
                    {
                        "partition_index": w.partition,
                        "error_code": w.error,
                        "high_watermark": w.high_watermark,
                        "last_stable_offset": w.last_stable_offset,
                        "log_start_offset": w.log_start_offset,
                        "aborted_transactions": (
                            [
                                {"producer_id": pid, "first_offset": first}
                                for pid, first in w.aborted
                            ]
                            if read_committed
                            else None
                        ),
                        "preferred_read_replica": -1,
                        "records": w.records if w.error == ErrorCode.none else b"",
                    }
                    for w in parts
                ],
            }
        )
    return build(
        response_class(request),
        {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses},
    )
