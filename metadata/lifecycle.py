"""Object lifecycle in the metadata store: log start offsets, references, the dead queue.

Rules:

- Every object that ever held committed chunk entries has an (OBJECT, key) record: its
  size, how many chunk entries still name it, when it was made, since when nothing
  names it (None while something does), and its level (0 for an ingest file, 1 or 2 for
  a compaction's output, None for a record written before levels). `log.commit_ingest`
  and `metadata.compaction` write it.
- A chunk entry is removed only here (`drop_entries`), which counts its object down. At
  zero the object goes on the dead queue, (DEAD_OBJECT, due_ms, key), due one delete
  delay later, so that a reader who looked the index up just before still gets its
  bytes (a level-0 object also leaves the compaction queue). Its OBJECT record stays
  until the object is gone from the store: an object without a record is an orphan (an
  upload whose commit never came), one with a record is either referenced or queued, and
  the orphan sweep leaves it alone.
- An object's key is never used again, so a queued object is never referenced again.
- A partition's log start offset only moves forward, and never past its high
  watermark. Entries wholly below it are no longer readable and are dropped in bounded
  steps, each step one transaction (FoundationDB: < 10 MB, < 5 s).
- A deleted topic's chunk entries are dropped the same way, from (DELETED_TOPIC, topic
  id), after the topic itself is gone.
- Every function here is a pure transaction function: it may run more than once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from metadata import keys
from metadata.errors import MetadataError
from metadata.kv import ReadTransaction, Transaction, decode_i64
from metadata.log import (
    INGEST_LEVEL,
    ChunkEntry,
    PartitionState,
    decode_entry,
    entry_keys,
    get_partition,
    iter_entries,
    put_partition,
)

# Chunk entries one step reads or drops at most: a few hundred KB of keys and values.
STEP_ENTRIES = 1000
PAGE = 64  # entries read at once: most steps look at a few
NO_LIMIT = -1  # retention.ms and retention.bytes: keep everything


# Cluster-wide tallies (atomic adds, never a conflict): what the store and index hold.
TALLIES = ("objects", "object_bytes", "chunk_entries")


def tally(tr: Transaction, sub: keys.Subspace, name: str, delta: int) -> None:
    tr.add(sub.key(keys.CLUSTER, "tally", name), delta)


def read_tallies(tr: ReadTransaction, sub: keys.Subspace) -> dict[str, int]:
    """Objects and their bytes in the store (referenced or waiting for deletion), and
    chunk entries in the index, as counted since they were first counted."""
    return {name: decode_i64(tr.get(sub.key(keys.CLUSTER, "tally", name))) for name in TALLIES}


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    size: int
    live_entries: int
    created_ms: int  # when written at its level (promoted to level 1: when promoted)
    dead_since_ms: int | None
    level: int | None = None  # None: written before levels, never compacted


@dataclass(frozen=True, slots=True)
class DeadObject:
    due_ms: int
    object_key: str
    size: int


@dataclass(frozen=True, slots=True)
class Step:
    """What one bounded step did: entries dropped, and whether more work is left."""

    dropped: int
    log_start_offset: int
    more: bool


# -- objects ------------------------------------------------------------------------------


def get_object(tr: ReadTransaction, sub: keys.Subspace, object_key: str) -> ObjectRecord | None:
    return _decode_object(tr.get(sub.key(keys.OBJECT, object_key)))


def get_objects(
    tr: ReadTransaction, sub: keys.Subspace, object_keys: Sequence[str]
) -> list[ObjectRecord | None]:
    """`get_object` of each key, read together."""
    raws = tr.get_many([sub.key(keys.OBJECT, object_key) for object_key in object_keys])
    return [_decode_object(raw) for raw in raws]


def _decode_object(raw: bytes | None) -> ObjectRecord | None:
    if raw is None:
        return None
    values = keys.unpack_value(raw)
    size, live, created = (int(v) for v in values[:3])
    dead_since = values[3] if len(values) > 3 else None
    level = values[4] if len(values) > 4 else None
    return ObjectRecord(
        size,
        live,
        created,
        None if dead_since is None else int(dead_since),
        None if level is None else int(level),
    )


def put_object(tr: Transaction, sub: keys.Subspace, object_key: str, record: ObjectRecord) -> None:
    tr.set(sub.key(keys.OBJECT, object_key), _encode_object(record))


def _encode_object(record: ObjectRecord) -> bytes:
    return keys.pack_value(
        (
            record.size,
            record.live_entries,
            record.created_ms,
            record.dead_since_ms,
            record.level,
        )
    )


def unreference_many(
    tr: Transaction,
    sub: keys.Subspace,
    counts: Sequence[tuple[str, int]],
    now_ms: int,
    delete_delay_ms: int,
) -> None:
    """`count` chunk entries naming the object are gone, for each (object key, count),
    the objects named once each; an object left with none is queued for deletion. Their
    records are read together and written together."""
    record_keys = [sub.key(keys.OBJECT, object_key) for object_key, _count in counts]
    writes: list[tuple[bytes, bytes]] = []
    clears: list[bytes] = []
    for (object_key, count), record_key, raw in zip(
        counts, record_keys, tr.get_many(record_keys), strict=True
    ):
        record = _decode_object(raw)
        if record is None:
            continue  # written before objects had records, or already queued and deleted
        live = max(0, record.live_entries - count)
        if live == 0 and record.dead_since_ms is None:
            record = ObjectRecord(record.size, 0, record.created_ms, now_ms, record.level)
            writes.append(
                (
                    sub.key(keys.DEAD_OBJECT, now_ms + delete_delay_ms, object_key),
                    keys.pack_value((record.size,)),
                )
            )
            if record.level == INGEST_LEVEL:
                clears.append(sub.key(keys.L0_OBJECT, record.created_ms, object_key))
        else:
            record = ObjectRecord(
                record.size, live, record.created_ms, record.dead_since_ms, record.level
            )
        writes.append((record_key, _encode_object(record)))
    tr.set_many(writes)
    tr.clear_many(clears)


def due_dead_objects(
    tr: ReadTransaction, sub: keys.Subspace, now_ms: int, limit: int = STEP_ENTRIES
) -> list[DeadObject]:
    """Queued objects whose delete delay is over, oldest first."""
    begin, _end = sub.range(keys.DEAD_OBJECT)
    end = sub.key(keys.DEAD_OBJECT, now_ms + 1)
    out = []
    for key, value in tr.get_range(begin, end, limit=limit):
        _tag, due, object_key = sub.unpack(key)
        (size,) = keys.unpack_value(value)
        out.append(DeadObject(int(due), str(object_key), int(size)))
    return out


def forget_deleted(tr: Transaction, sub: keys.Subspace, deleted: list[DeadObject]) -> None:
    """The objects are gone from the store: drop their queue entries and records."""
    tr.clear_many([sub.key(keys.DEAD_OBJECT, dead.due_ms, dead.object_key) for dead in deleted])
    record_keys = list(dict.fromkeys(sub.key(keys.OBJECT, dead.object_key) for dead in deleted))
    gone = []
    for record_key, raw in zip(record_keys, tr.get_many(record_keys), strict=True):
        record = _decode_object(raw)
        if record is not None and record.live_entries == 0:
            gone.append(record_key)
            tally(tr, sub, "objects", -1)
            tally(tr, sub, "object_bytes", -record.size)
    tr.clear_many(gone)


def known_objects(tr: ReadTransaction, sub: keys.Subspace, object_keys: list[str]) -> set[str]:
    """Which of the keys have an OBJECT record (referenced, or queued for deletion)."""
    return {k for k in object_keys if tr.get(sub.key(keys.OBJECT, k)) is not None}


# -- chunk entries ------------------------------------------------------------------------


def drop_entries(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    dropped: Sequence[tuple[int, ChunkEntry]],
    now_ms: int,
    delete_delay_ms: int,
) -> None:
    """Remove each (partition, entry) of the topic and its copy in the reverse index,
    all together, and count their objects down together."""
    tr.clear_many([key for p, e in dropped for key in entry_keys(sub, topic_id, p, e)])
    tally(tr, sub, "chunk_entries", -len(dropped))
    counts = Counter(e.object_key for _p, e in dropped)
    unreference_many(tr, sub, list(counts.items()), now_ms, delete_delay_ms)


def _drop(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    state: PartitionState,
    entries: list[ChunkEntry],
    log_start_offset: int,
    now_ms: int,
    delete_delay_ms: int,
) -> None:
    """Drop entries (the partition's first ones) and set the new log start offset."""
    drop_entries(tr, sub, topic_id, [(partition, e) for e in entries], now_ms, delete_delay_ms)
    dropped_bytes = sum(e.length for e in entries)
    log_bytes = None if state.log_bytes is None else max(0, state.log_bytes - dropped_bytes)
    put_partition(
        tr,
        sub,
        topic_id,
        partition,
        PartitionState(state.high_watermark, log_start_offset, log_bytes),
    )


def advance_log_start(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    offset: int,
    now_ms: int,
    delete_delay_ms: int,
    limit: int = STEP_ENTRIES,
) -> Step:
    """DeleteRecords: the log starts at `offset` from now on (-1: the high watermark).

    Entries wholly below it are dropped, up to `limit` in this step. Raises MetadataError
    OFFSET_OUT_OF_RANGE for an offset past the high watermark (or negative but -1), and
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist.
    """
    state = get_partition(tr, sub, topic_id, partition)
    if state is None:
        raise MetadataError(ErrorCode.unknown_topic_or_partition)
    if offset == -1:
        offset = state.high_watermark
    if offset < 0 or offset > state.high_watermark:
        raise MetadataError(
            ErrorCode.offset_out_of_range,
            f"Cannot delete records of partition {partition} up to offset {offset}: "
            f"its high watermark is {state.high_watermark}",
        )
    start = max(state.log_start_offset, offset)
    return _drop_below(tr, sub, topic_id, partition, state, start, now_ms, delete_delay_ms, limit)


def drop_below_log_start(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    now_ms: int,
    delete_delay_ms: int,
    limit: int = STEP_ENTRIES,
) -> Step:
    """Drop up to `limit` entries lying wholly below the log start offset."""
    state = get_partition(tr, sub, topic_id, partition)
    if state is None:
        return Step(0, -1, False)
    return _drop_below(
        tr, sub, topic_id, partition, state, state.log_start_offset, now_ms, delete_delay_ms,
        limit,
    )  # fmt: skip


def _drop_below(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    state: PartitionState,
    log_start_offset: int,
    now_ms: int,
    delete_delay_ms: int,
    limit: int,
) -> Step:
    below: list[ChunkEntry] = []
    more = False
    for entry in iter_entries(tr, sub, topic_id, partition, page=PAGE):
        if entry.last_offset >= log_start_offset:
            break
        if len(below) == limit:
            more = True
            break
        below.append(entry)
    if below or log_start_offset != state.log_start_offset:
        _drop(tr, sub, topic_id, partition, state, below, log_start_offset, now_ms,
              delete_delay_ms)  # fmt: skip
    return Step(len(below), log_start_offset, more)


def apply_retention(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    delete_delay_ms: int,
    limit: int = STEP_ENTRIES,
) -> Step:
    """One step of time and size retention, as Kafka deletes whole segments.

    From the oldest entry on, an entry goes when its newest record is older than
    `retention_ms` (by max timestamp), or while the partition without it still holds at
    least `retention_bytes`; the first entry that may stay ends the step. The log start
    offset moves to the first offset after the last entry dropped; when every entry goes
    it is the high watermark, as Kafka rolls and deletes its active segment. Entries
    already below the log start offset go too. NO_LIMIT (-1) turns either rule off.
    """
    state = get_partition(tr, sub, topic_id, partition)
    if state is None:
        return Step(0, -1, False)
    log_bytes = state.log_bytes
    if log_bytes is None and retention_bytes != NO_LIMIT:
        log_bytes = partition_bytes(tr, sub, topic_id, partition)
        state = PartitionState(state.high_watermark, state.log_start_offset, log_bytes)
    cutoff = now_ms - retention_ms
    doomed: list[ChunkEntry] = []
    remaining = log_bytes or 0
    start = state.log_start_offset
    stays = False  # an entry stays, or more than one step takes are left
    for entry in iter_entries(tr, sub, topic_id, partition, page=PAGE):
        expired = retention_ms != NO_LIMIT and entry.max_timestamp < cutoff
        too_big = retention_bytes != NO_LIMIT and remaining - entry.length >= retention_bytes
        if len(doomed) == limit or not (entry.last_offset < start or expired or too_big):
            stays = True
            break
        doomed.append(entry)
        remaining -= entry.length
    if not doomed:
        return Step(0, start, False)
    if stays:
        new_start = max(start, doomed[-1].last_offset + 1)
    else:
        # Every entry is gone: the log starts at its end, as Kafka rolls and deletes its
        # active segment (offsets after the last entry belong to no entry).
        new_start = state.high_watermark
    _drop(tr, sub, topic_id, partition, state, doomed, new_start, now_ms, delete_delay_ms)
    return Step(len(doomed), new_start, len(doomed) == limit and stays)


def partition_bytes(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int
) -> int:
    """The bytes of every chunk entry of the partition (for a partition stored before the
    partition state counted them)."""
    begin, end = sub.range(keys.CHUNK, topic_id, partition)
    return sum(decode_entry(sub, k, v).length for k, v in tr.get_range(begin, end))


# -- deleted topics -----------------------------------------------------------------------


def deleted_topics(tr: ReadTransaction, sub: keys.Subspace) -> list[tuple[bytes, int]]:
    """(topic id, partition count) of deleted topics whose entries are not all dropped."""
    begin, end = sub.range(keys.DELETED_TOPIC)
    out = []
    for key, value in tr.get_range(begin, end):
        (partitions, _deleted_ms) = keys.unpack_value(value)
        out.append((bytes(sub.unpack(key)[1]), int(partitions)))
    return out


def reap_deleted_topic(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partitions: int,
    now_ms: int,
    delete_delay_ms: int,
    limit: int = STEP_ENTRIES,
) -> bool:
    """Drop up to `limit` chunk entries of a deleted topic; True when none is left (its
    DELETED_TOPIC record is then cleared too)."""
    begin, end = sub.range(keys.CHUNK, topic_id)
    rows = tr.get_range(begin, end, limit=limit)
    dropped = [(int(sub.unpack(key)[2]), decode_entry(sub, key, value)) for key, value in rows]
    drop_entries(tr, sub, topic_id, dropped, now_ms, delete_delay_ms)
    if len(rows) < limit:
        tr.clear(sub.key(keys.DELETED_TOPIC, topic_id))
        return True
    return False
