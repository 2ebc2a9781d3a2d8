"""Fetch: chunk index lookup, ranged reads (cache first), baseOffset rewrite, long poll.

A Fetch goes plan → read → select → answer:

- plan: resolve each requested partition once (topic by name or by id) into a `_Partition`
  that carries everything about it from then on;
- read: one metadata read gives each partition its state and the chunk entries a budget
  of partition_max_bytes can take from; then the entries' bytes are read (cache first),
  and each partition keeps its own (entry, bytes) pairs;
- select: walk the batch headers of those bytes and take the batches from fetch_offset
  on, within the partition's and the request's byte budgets;
- answer: the response, in the order of the request.

An object named by an entry may be gone by the time its bytes are read: entries read
more than the delete delay ago (a slow read, a stale cached entry). Then the entries of
the Fetch's partitions are forgotten and the index is read again, once: it names where
the bytes are now (a compacted object), or the partition's log start has moved past
them and the answer is OFFSET_OUT_OF_RANGE, as for any read below the log start.

With fewer than min_bytes selected, the Fetch waits for any of its partitions to change
(up to max_wait) and reads again; it watches them from before its first read, so an
append between a read and the wait is never missed. A tailing consumer asks again at once
for the end it was just given: when each partition of a Fetch is asked for at the end this
agent's last read found, and nothing was committed to it since (the notifier's note,
dropped by every notification), the Fetch waits first and reads only then. Every answer
still comes from a read made after the wait.

Sessionless: every answer carries session id 0, which tells clients to send full fetch
requests. Records are never decoded; only batch headers are walked to number them.
The first batch of a response is returned even when it is larger than the byte limits
(as Kafka does since KIP-74), so a consumer can always make progress.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import AgentServices, HandlerContext
from broker.costs import charge
from broker.entities import build, ms
from broker.handlers import api, response_class
from broker.metrics import Meter
from broker.sync import Notifier
from metadata import log as log_layer
from metadata import topics as topics_layer
from metadata import txns
from metadata.chunk_cache import read_chunks_cached
from protocol.codec import Gathered
from protocol.records import iter_batches, numbered_parts
from storage.objectstore import ObjectNotFoundError

API_KEY = 1
READ_COMMITTED = 1
ENTRIES_PER_READ = 16
# A chunk-index miss reads this many budgets ahead (within ENTRIES_PER_READ) into the
# chunk cache: a consumer's next Fetch starts where this one ends, and finds them held.
INDEX_READ_AHEAD = 4
# A read of this many partitions or fewer is a handful of point reads and short ranges:
# the metadata store may run it without a thread switch. read_committed also lists the
# aborted transactions, which is not bounded; such a read stays quick while each partition
# has at most QUICK_ABORT_MARKERS abort markers to read, and goes to a thread otherwise.
QUICK_READ_PARTITIONS = 16
QUICK_ABORT_MARKERS = 64
LEADER_EPOCH = 0  # no replication, no truncation: one epoch forever

Chunk = tuple[log_layer.ChunkEntry, bytes | memoryview]  # an entry and its bytes


@dataclass(slots=True)
class _Partition:
    """One requested partition: what was asked, what was read, and what is answered."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    topic: topics_layer.Topic | None  # None: nothing to read (see error)
    missing: ErrorCode  # the error for a topic that is not (or no longer) there
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)
    entries: list[log_layer.ChunkEntry] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    records: Gathered | bytes = b""
    record_count: int = 0  # of records

    def gone(self) -> None:
        """The topic was deleted since the request came: an error, and nothing else."""
        self.error = self.missing
        self.high_watermark = self.last_stable_offset = self.log_start_offset = -1
        self.aborted, self.entries, self.chunks, self.records = [], [], [], b""


@dataclass(frozen=True, slots=True)
class _State:
    """What one metadata read found for one partition."""

    state: log_layer.PartitionState | None
    last_stable_offset: int
    entries: list[log_layer.ChunkEntry]
    aborted: list[tuple[int, int]]


_NOTHING = _State(None, -1, [], [])


@dataclass(frozen=True, slots=True)
class _Plan:
    """The request's partitions, grouped as it named their topics."""

    topics: list[tuple[Any, list[_Partition]]]  # (name, or id from v13; its partitions)
    partitions: list[_Partition]


# -- plan ---------------------------------------------------------------------------------


async def _plan(request: Any, ctx: HandlerContext, version: int) -> _Plan:
    agent = ctx.agent
    checked = agent.authorizer is not None  # with authorization off, nothing more is paid
    topics: list[tuple[Any, list[_Partition]]] = []
    for fetch_topic in request.topics:
        topic: topics_layer.Topic | None
        if version >= 13:
            topic_id = fetch_topic.topic_id
            topic = await agent.topic_by_id(topic_id.bytes) if topic_id is not None else None
            missing, ref = ErrorCode.unknown_topic_id, topic_id
        else:
            topic = await agent.topic(fetch_topic.topic)
            missing, ref = ErrorCode.unknown_topic_or_partition, fetch_topic.topic
        refused = False
        if checked and (topic is not None or version < 13):
            # Checked before existence, as Kafka: a topic one may not read is not revealed.
            name = topic.name if topic is not None else fetch_topic.topic
            refused = not access.authorize(ctx, Operation.READ, ResourceType.TOPIC, name)
        parts = []
        for fp in fetch_topic.partitions:
            p = _Partition(fp.partition, fp.fetch_offset, fp.partition_max_bytes, topic, missing)
            if refused:
                p.error = ErrorCode.topic_authorization_failed
                p.topic = None
            elif topic is None:
                p.error = missing
            elif not 0 <= fp.partition < topic.partitions:
                p.error = ErrorCode.unknown_topic_or_partition
                p.topic = None
            parts.append(p)
        topics.append((ref, parts))
    return _Plan(topics, [p for _ref, parts in topics for p in parts])


# -- read ---------------------------------------------------------------------------------


def _read_states(
    agent: AgentServices,
    partitions: Sequence[_Partition],
    read_committed: bool,
    abort_marker_limit: int,
) -> Any:
    """The metadata read: each partition's state, entries and aborted transactions; None
    when a partition has more than abort_marker_limit abort markers (0: no limit)."""

    def txn(tr: Any) -> list[_State] | None:
        out = []
        for p in partitions:
            if p.topic is None:
                out.append(_NOTHING)
                continue
            tid = p.topic.topic_id
            state = log_layer.get_partition(tr, agent.sub, tid, p.partition)
            if state is None:
                out.append(_NOTHING)
                continue
            lso = txns.last_stable_offset(tr, agent.sub, tid, p.partition, state.high_watermark)
            end = lso if read_committed else state.high_watermark
            entries: list[log_layer.ChunkEntry] = []
            aborted: list[tuple[int, int]] = []
            if state.log_start_offset <= p.fetch_offset < end:
                # Only the entries a budget of partition_max_bytes can take from.
                entries = read_chunks_cached(
                    tr,
                    agent.chunks,
                    agent.sub,
                    tid,
                    p.partition,
                    p.fetch_offset,
                    ENTRIES_PER_READ,
                    p.partition_max_bytes,
                    state.high_watermark,
                    wider=INDEX_READ_AHEAD,
                )
                if read_committed:
                    found = txns.aborted_between(
                        tr,
                        agent.sub,
                        tid,
                        p.partition,
                        p.fetch_offset,
                        end,
                        scan_limit=abort_marker_limit,
                    )
                    if found is None:
                        return None
                    aborted = found
            out.append(_State(state, lso, entries, aborted))
        return out

    return txn


async def _read_metadata(
    agent: AgentServices, partitions: list[_Partition], read_committed: bool
) -> list[_State]:
    states: list[_State] | None = None
    if len(partitions) <= QUICK_READ_PARTITIONS:
        states = await agent.kv.read(
            _read_states(agent, partitions, read_committed, QUICK_ABORT_MARKERS), quick=True
        )
    if states is None:  # too many partitions or abort markers for a quick read
        states = await agent.kv.read(_read_states(agent, partitions, read_committed, 0))
    assert states is not None
    return states


def _take_state(agent: AgentServices, p: _Partition, read: _State) -> None:
    """Keep what the metadata read found on the partition; tell read-ahead what it read."""
    state, entries = read.state, read.entries
    if state is None:
        p.gone()
        return
    p.high_watermark = state.high_watermark
    p.last_stable_offset = read.last_stable_offset
    p.log_start_offset = state.log_start_offset
    p.aborted = read.aborted
    if not state.log_start_offset <= p.fetch_offset <= state.high_watermark:
        p.error = ErrorCode.offset_out_of_range
    p.entries = entries
    if p.topic is not None:
        agent.read_ahead.note_fetch(p.topic.topic_id, p.partition, entries, state.high_watermark)


async def _read(agent: AgentServices, partitions: list[_Partition], read_committed: bool) -> None:
    """Read every partition's state and the bytes of its entries, onto the partition."""
    try:
        owners, blobs = await _read_once(agent, partitions, read_committed)
    except ObjectNotFoundError:
        # Entries read too long ago: the index says where the bytes are now.
        for p in partitions:
            if p.topic is not None:
                agent.chunks.forget(p.topic.topic_id, p.partition)
        owners, blobs = await _read_once(agent, partitions, read_committed)
    for p in partitions:
        p.chunks = []
    for (p, entry), blob in zip(owners, blobs, strict=True):
        p.chunks.append((entry, blob))


async def _read_once(
    agent: AgentServices, partitions: list[_Partition], read_committed: bool
) -> tuple[list[tuple[_Partition, log_layer.ChunkEntry]], list[bytes | memoryview]]:
    states = await _read_metadata(agent, partitions, read_committed)
    for p, read in zip(partitions, states, strict=True):
        if p.topic is not None:
            _take_state(agent, p, read)
    owners = [(p, e) for p in partitions for e in p.entries]
    ranges = [(e.object_key, e.start, e.start + e.length) for _p, e in owners]
    with charge(lambda: _weights(owners)):
        blobs = await agent.reader.read_many(ranges) if ranges else []
    return owners, blobs


def _weights(owners: list[tuple[_Partition, log_layer.ChunkEntry]]) -> dict[str, float]:
    """The GETs' charge (broker.costs), by the bytes asked of each topic."""
    weights: dict[str, float] = {}
    for p, e in owners:
        if p.topic is not None:
            weights[p.topic.name] = weights.get(p.topic.name, 0) + e.length
    return weights


# -- select -------------------------------------------------------------------------------


def _select(
    chunks: Sequence[Chunk],
    fetch_offset: int,
    end_offset: int,
    budget: int,
    must_take_one: bool,
    counted: list[int] | None = None,
) -> tuple[Gathered, int]:
    """Batches from fetch_offset on, within budget bytes; returns (records, bytes used).

    The records are the selected batches' new heads (their offsets) and views of their
    bodies where they are (the cache): nothing is copied here."""
    pieces: list[bytes | memoryview] = []
    used = 0
    for entry, data in chunks:
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
            if counted is not None:
                counted[0] += view.record_count
    return Gathered(pieces), used


def _select_all(partitions: list[_Partition], max_bytes: int, read_committed: bool) -> int:
    """Select each partition's records within the budgets; the bytes selected in all."""
    total = 0
    for p in partitions:
        if not p.chunks:
            continue
        budget = max(0, min(p.partition_max_bytes, max_bytes - total))
        end = p.last_stable_offset if read_committed else p.high_watermark
        counted = [0]
        p.records, used = _select(p.chunks, p.fetch_offset, end, budget, total == 0, counted)
        p.record_count = counted[0]
        total += used
    return total


# -- answer -------------------------------------------------------------------------------


def _answer(request: Any, version: int, plan: _Plan, read_committed: bool) -> Any:
    responses = []
    for ref, parts in plan.topics:
        responses.append(
            {
                "topic": ref if version < 13 else None,
                "topic_id": ref if version >= 13 else None,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": (
                            [
                                {"producer_id": pid, "first_offset": first}
                                for pid, first in p.aborted
                            ]
                            if read_committed
                            else None
                        ),
                        "preferred_read_replica": -1,
                        "records": p.records if p.error == ErrorCode.none else b"",
                    }
                    for p in parts
                ],
            }
        )
    return build(
        response_class(request),
        {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses},
    )


@api(API_KEY, 4, 17)
async def handle(request: Any, ctx: HandlerContext) -> Any:
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
    plan = await _plan(request, ctx, version)
    partitions = plan.partitions
    min_bytes = max(int(request.min_bytes), 0)
    max_bytes = int(getattr(request, "max_bytes", 2**31 - 1))
    # time.monotonic, not anyio.current_time: the same clock for what is relative here,
    # without asking for the running loop (a getpid() on Python 3.11) twice per Fetch.
    deadline = time.monotonic() + ms(request.max_wait) / 1000
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    keys = [(p.topic.topic_id, p.partition) for p in partitions if p.topic is not None]
    notifier = agent.notifier
    with notifier.watch(keys) as watch:
        if min_bytes > 0 and _at_noted_ends(notifier, partitions, read_committed):
            # Each partition ends where this agent's last read of it found it, and nothing
            # was committed to it since (another agent's commit is found by the watermark
            # poll, which notifies): a read now would find nothing. Wait, then read.
            ctx.end_turn()
            await watch.wait_until(deadline)
        while True:
            watch.arm()
            await _read(agent, partitions, read_committed)
            if not watch.fired:  # what was read is current until the next notification
                _note_ends(notifier, partitions)
            total = _select_all(partitions, max_bytes, read_committed)
            remaining = deadline - time.monotonic()
            has_error = any(p.error != ErrorCode.none for p in partitions)
            if total >= min_bytes or remaining <= 0 or has_error or not partitions:
                break
            ctx.end_turn()  # a Fetch takes no effect: what comes after it need not wait
            await watch.wait_until(deadline)  # a timer, not a cancel scope
    _meter(agent.meter, partitions)
    return _answer(request, version, plan, read_committed)


def _at_noted_ends(notifier: Notifier, partitions: list[_Partition], read_committed: bool) -> bool:
    """Whether every partition is asked for at the end that the notifier's note of it
    says (the high watermark, or the last stable offset for read_committed)."""
    if not partitions:
        return False
    for p in partitions:
        if p.topic is None or p.error != ErrorCode.none:
            return False
        noted = notifier.noted((p.topic.topic_id, p.partition))
        if noted is None:
            return False
        high_watermark, last_stable_offset = cast(tuple[int, int], noted)
        if p.fetch_offset != (last_stable_offset if read_committed else high_watermark):
            return False
    return True


def _note_ends(notifier: Notifier, partitions: list[_Partition]) -> None:
    for p in partitions:
        if p.topic is not None and p.error == ErrorCode.none:
            notifier.note((p.topic.topic_id, p.partition), (p.high_watermark, p.last_stable_offset))


def _meter(meter: Meter, partitions: list[_Partition]) -> None:
    """Count what the Fetch answers, per topic (broker.metrics)."""
    named = set()
    for p in partitions:
        if p.topic is None:
            continue  # a topic not there: no name of the client's is counted
        name = p.topic.name
        named.add(name)
        if p.error != ErrorCode.none:
            meter.error(name, "Fetch", p.error.name)
        elif p.records:
            meter.fetched(name, p.record_count, len(p.records))
    for name in named:
        meter.request(name, "Fetch")
