"""Cleaning compacted partitions in the metadata store: how dirty a partition is, and the
commits that put cleaned bytes in place of a stretch of its entries.

A compacted partition (cleanup.policy holds "compact") is cleaned in rounds, as Apache
Kafka's log cleaner cleans a log (the pure core is storage.cleaner): a round maps the
latest offset of each key in the *dirty* part, from the first dirty offset to the first
uncleanable one, then rewrites the partition from its log start to the round's end,
stretch by stretch, and finally moves the first dirty offset to the round's end.

Rules:

- (CLEANER, topic_id, partition) holds (first_dirty_offset,); absent, the partition was
  never cleaned and all of it is dirty.
- The first uncleanable offset (`Dirt.end_offset`) is the base offset of the first entry
  that may not be cleaned yet: one holding an offset at or past the last stable offset
  (an open transaction's records, or beyond), or whose newest record is younger than
  min.compaction.lag.ms. Rounds work on whole entries.
- The dirty ratio is Kafka's: dirty bytes over all bytes below the first uncleanable
  offset. `Dirt.oldest_dirty_ms` (the oldest newest-record timestamp of a dirty entry)
  lets max.compaction.lag.ms force a round whatever the ratio.
- `commit_stretch` replaces a contiguous stretch of entries (exactly the entries between
  its first and last, each still as the round read it) by the cleaned entries of one
  new object, or by none when nothing of the stretch is left. Cleaned entries hold fewer
  bytes and may leave gaps between offsets; they never hold an offset outside the
  stretch's range. If any input changed (retention, DeleteRecords, a compaction, a
  deleted topic, another round), nothing of the log changes and the output is dead.
- Unlike a compaction commit, a stretch commit changes the partition's byte count, so it
  reads and writes the PARTITION key (and may conflict with a produce commit on the same
  partition, which then retries). High watermark and log start offset stay as they are.
- A stretch commit also clears from the aborted index the transactions whose ABORT
  markers it removed. `finish_round` moves the first dirty offset forward, never back.
- Every function here is a pure transaction function: it may run more than once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from metadata import keys
from metadata.compaction import L2, JobResult, discard_output
from metadata.kv import ReadTransaction, Transaction
from metadata.lifecycle import (
    ObjectRecord,
    put_object,
    tally,
    unreference_many,
)
from metadata.log import (
    ChunkEntry,
    PartitionState,
    clear_chunk_range,
    decode_entry,
    entry_keys,
    entry_rows,
    get_partition,
    iter_entries,
    put_partition,
    read_chunks,
)
from metadata.topics import get_topic_by_id
from metadata.txns import last_stable_offset

PAGE = 1024  # entries read at a time while measuring


@dataclass(frozen=True, slots=True)
class Dirt:
    """A compacted partition's state for the cleaner, as one transaction saw it."""

    log_start_offset: int
    first_dirty_offset: int
    end_offset: int  # the first uncleanable offset
    dirty_bytes: int  # of the entries holding offsets in [first_dirty_offset, end_offset)
    cleanable_bytes: int  # of the entries below end_offset
    oldest_dirty_ms: int | None  # the smallest max timestamp of a dirty entry

    @property
    def ratio(self) -> float:
        return self.dirty_bytes / self.cleanable_bytes if self.cleanable_bytes else 0.0

    def worth_cleaning(self, now_ms: int, min_ratio: float, max_lag_ms: int) -> bool:
        """Kafka's rule: something dirty can be cleaned, and either enough of it to pass
        min.cleanable.dirty.ratio or a dirty record older than max.compaction.lag.ms."""
        if self.end_offset <= self.first_dirty_offset or not self.dirty_bytes:
            return False
        overdue = self.oldest_dirty_ms is not None and self.oldest_dirty_ms < now_ms - max_lag_ms
        return self.ratio >= min_ratio or overdue


def first_dirty_offset(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int
) -> int:
    raw = tr.get(sub.key(keys.CLEANER, topic_id, partition))
    return 0 if raw is None else int(keys.unpack_value(raw)[0])


def measure(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    now_ms: int,
    min_lag_ms: int,
) -> Dirt | None:
    """The partition's dirt; None for a partition that does not exist."""
    state = get_partition(tr, sub, topic_id, partition)
    if state is None:
        return None
    stable = last_stable_offset(tr, sub, topic_id, partition, state.high_watermark)
    first_dirty = max(first_dirty_offset(tr, sub, topic_id, partition), state.log_start_offset)
    end = stable  # unless an entry before it may not be cleaned yet
    clean_bytes = dirty_bytes = 0
    oldest: int | None = None
    for entry in iter_entries(tr, sub, topic_id, partition, page=PAGE):
        if entry.last_offset >= stable or entry.max_timestamp > now_ms - min_lag_ms:
            end = entry.base_offset
            break
        if entry.last_offset >= first_dirty:
            dirty_bytes += entry.length
            oldest = entry.max_timestamp if oldest is None else min(oldest, entry.max_timestamp)
        else:
            clean_bytes += entry.length
    # An entry that straddles the first dirty offset counts as dirty, as Kafka counts the
    # segment holding it: the rest of it has not been mapped yet.
    return Dirt(
        state.log_start_offset,
        first_dirty,
        max(end, state.log_start_offset),
        dirty_bytes,
        clean_bytes + dirty_bytes,
        oldest,
    )


def stretch_entries(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    from_offset: int,
    end_offset: int,
    max_bytes: int,
) -> list[ChunkEntry]:
    """The next stretch of a round: entries from from_offset on, wholly below end_offset,
    holding at most max_bytes (at least one entry)."""
    out: list[ChunkEntry] = []
    size = 0
    for entry in read_chunks(tr, sub, topic_id, partition, from_offset, limit=PAGE):
        if entry.last_offset >= end_offset or (out and size + entry.length > max_bytes):
            break
        out.append(entry)
        size += entry.length
    return out


def _changed(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    inputs: Sequence[ChunkEntry],
) -> str | None:
    """Why the stretch no longer holds (None: it is exactly the entries it was)."""
    if get_topic_by_id(tr, sub, topic_id) is None:
        return f"topic {topic_id.hex()} was deleted"
    begin = sub.key(keys.CHUNK, topic_id, partition, inputs[0].last_offset)
    end = sub.key(keys.CHUNK, topic_id, partition, inputs[-1].last_offset) + b"\x00"
    found = [decode_entry(sub, k, v) for k, v in tr.get_range(begin, end)]
    if found != list(inputs):
        return (
            f"the entries of offsets {inputs[0].base_offset}-{inputs[-1].last_offset} of "
            f"partition {partition} changed"
        )
    return None


def _check_outputs(inputs: Sequence[ChunkEntry], outputs: Sequence[ChunkEntry], key: str) -> None:
    first, last = inputs[0].base_offset, inputs[-1].last_offset
    previous = first - 1
    for entry in outputs:
        if entry.object_key != key or not previous < entry.base_offset <= entry.last_offset <= last:
            raise ValueError(
                f"a cleaned entry of offsets {entry.base_offset}-{entry.last_offset} does not "
                f"fit the stretch {first}-{last} in order"
            )
        previous = entry.last_offset
    if sum(e.length for e in outputs) > sum(e.length for e in inputs):
        raise ValueError("cleaned entries hold more bytes than the stretch they replace")


def commit_stretch(
    tr: Transaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    inputs: Sequence[ChunkEntry],
    object_key: str | None,
    object_size: int,
    outputs: Sequence[ChunkEntry],
    now_ms: int,
    delete_delay_ms: int,
    removed_abort_markers: Sequence[int] = (),
) -> JobResult:
    """Replace the stretch `inputs` by `outputs` (entries of the uploaded object_key, or
    none and no object when nothing of the stretch is left), if the stretch is unchanged.

    The aborted transactions whose ABORT markers (by offset) the cleaning removed from the
    stretch leave the aborted index in the same transaction: a reader must never find an
    aborted transaction whose marker it cannot reach (it would take that producer's later
    transactions for aborted)."""
    if not inputs:
        raise ValueError("a stretch of no entries")
    if object_key is None and outputs:
        raise ValueError("cleaned entries without an object")
    reason = _changed(tr, sub, topic_id, partition, inputs)
    if reason is not None:
        if object_key is not None:
            discard_output(tr, sub, object_key, object_size, L2, now_ms)
        return JobResult(False, reason)
    if object_key is not None:
        _check_outputs(inputs, outputs, object_key)
    state = get_partition(tr, sub, topic_id, partition)
    assert state is not None  # the entries are there, so is the partition
    clear_chunk_range(tr, sub, topic_id, partition, inputs[0].last_offset, inputs[-1].last_offset)
    tr.clear_many([entry_keys(sub, topic_id, partition, e)[1] for e in inputs])
    tr.set_many([row for e in outputs for row in entry_rows(sub, topic_id, partition, e)])
    counts = Counter(e.object_key for e in inputs)
    unreference_many(tr, sub, list(counts.items()), now_ms, delete_delay_ms)
    if object_key is not None:
        record = ObjectRecord(object_size, len(outputs), now_ms, None, L2)
        if not outputs:  # the object holds nothing any entry names
            record = ObjectRecord(object_size, 0, now_ms, now_ms, L2)
            tr.set(sub.key(keys.DEAD_OBJECT, now_ms, object_key), keys.pack_value((object_size,)))
        put_object(tr, sub, object_key, record)
        tally(tr, sub, "objects", 1)
        tally(tr, sub, "object_bytes", object_size)
    first, last = inputs[0].base_offset, inputs[-1].last_offset
    for marker_offset in removed_abort_markers:
        if not first <= marker_offset <= last:
            raise ValueError(f"an abort marker at {marker_offset} outside the stretch")
        tr.clear(sub.key(keys.ABORTED, topic_id, partition, marker_offset))
    tally(tr, sub, "chunk_entries", len(outputs) - len(inputs))
    removed = sum(e.length for e in inputs) - sum(e.length for e in outputs)
    if state.log_bytes is not None:
        state = PartitionState(
            state.high_watermark, state.log_start_offset, max(0, state.log_bytes - removed)
        )
        put_partition(tr, sub, topic_id, partition, state)
    return JobResult(True)


def finish_round(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, partition: int, end_offset: int
) -> None:
    """The round cleaned up to end_offset: the dirty part starts there now (unless a later
    round already moved it further)."""
    if first_dirty_offset(tr, sub, topic_id, partition) < end_offset:
        tr.set(sub.key(keys.CLEANER, topic_id, partition), keys.pack_value((end_offset,)))


def forget_partition(tr: Transaction, sub: keys.Subspace, topic_id: bytes, partition: int) -> None:
    """A deleted topic's partition: nothing left to clean."""
    tr.clear(sub.key(keys.CLEANER, topic_id, partition))
