"""Partition logs: high watermarks, log start offsets and the chunk index.

`commit_ingest` is the one transaction that makes an uploaded ingest file part of the
logs. For every partition it touches it reads the high watermark, checks each batch's
producer sequence, gives accepted batches dense offsets from the watermark, writes one
chunk entry per run of byte-contiguous accepted batches and advances the watermark. A
rejected batch keeps its bytes in the object but gets no offsets and no entry.

A chunk entry and its copy in the object's reverse index (OBJECT_CHUNK) are written and
cleared together: `entry_rows` and `entry_keys` name both (`put_entry` writes one entry),
and metadata.compaction, which replaces many entries at once, clears them with ranges
where it can (`clear_chunk_range`, `reverse_index_range`). The ingest file is a
level-0 object (`INGEST_LEVEL`), queued for compaction (L0_OBJECT) from its commit on.

Offsets never move backwards: the watermark only grows, and it is read from the store.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from metadata import keys, producers, txns
from metadata.kv import ReadTransaction, Transaction

NOT_CONTROL = -1
ABORT_MARKER = 0
COMMIT_MARKER = 1
INGEST_LEVEL = 0  # the level of an ingest file (metadata.compaction)


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int
    log_start_offset: int
    # Bytes of the partition's chunk entries; None for a partition stored before it was
    # counted (metadata.lifecycle counts it when it needs it).
    log_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    """A run of consecutive batches of one partition inside one object."""

    object_key: str
    start: int
    length: int
    base_offset: int
    last_offset: int
    batch_count: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """One produce batch, already uploaded inside an ingest file, waiting for offsets."""

    topic_id: bytes
    partition: int
    start: int  # byte range inside the object
    length: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool = False
    control: int = NOT_CONTROL  # a transaction marker: ABORT_MARKER or COMMIT_MARKER


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    duplicate: bool = False  # a producer's retry, answered with the original's offsets


def get_partition(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int
) -> PartitionState | None:
    return decode_partition(tr.get(partition_key(sub, topic_id, partition)))


def partition_key(sub: keys.Subspace, topic_id: bytes, partition: int) -> bytes:
    return sub.key(keys.PARTITION, topic_id, partition)


def decode_partition(raw: bytes | None) -> PartitionState | None:
    if raw is None:
        return None
    values = keys.unpack_value(raw)
    log_bytes = values[2] if len(values) > 2 else None
    return PartitionState(
        int(values[0]), int(values[1]), None if log_bytes is None else int(log_bytes)
    )


def put_partition(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, partition: int, state: PartitionState
) -> None:
    tr.set(*partition_row(sub, topic_id, partition, state))


def partition_row(
    sub: keys.Subspace, topic_id: bytes, partition: int, state: PartitionState
) -> tuple[bytes, bytes]:
    """The key and value `put_partition` writes."""
    return (
        partition_key(sub, topic_id, partition),
        keys.pack_value((state.high_watermark, state.log_start_offset, state.log_bytes)),
    )


def decode_entry(sub: keys.Subspace, key: bytes, value: bytes) -> ChunkEntry:
    last_offset = sub.unpack(key)[3]
    object_key, start, length, base, count, max_ts = keys.unpack_value(value)
    return ChunkEntry(
        object_key, int(start), int(length), int(base), int(last_offset), int(count), int(max_ts)
    )


def entry_value(entry: ChunkEntry) -> bytes:
    """The value of the entry's CHUNK key (its last offset is in the key): the packed
    object key, then what the reverse index holds (a packed tuple is its packed
    elements one after another)."""
    return keys.pack_value((entry.object_key,)) + _reverse_value(entry)


def _reverse_value(entry: ChunkEntry) -> bytes:
    """The value of the entry's copy in the reverse index of its object."""
    return keys.pack_value(
        (entry.start, entry.length, entry.base_offset, entry.batch_count, entry.max_timestamp)
    )


def entry_keys(
    sub: keys.Subspace, topic_id: bytes, partition: int, entry: ChunkEntry
) -> tuple[bytes, bytes]:
    """The entry's CHUNK key and the key of its copy in the reverse index."""
    return (
        sub.key(keys.CHUNK, topic_id, partition, entry.last_offset),
        sub.key(keys.OBJECT_CHUNK, entry.object_key, topic_id, partition, entry.last_offset),
    )


def put_entry(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, partition: int, entry: ChunkEntry
) -> None:
    """Write a chunk entry and its copy in the reverse index of its object."""
    tr.set_many(entry_rows(sub, topic_id, partition, entry))


def entry_rows(
    sub: keys.Subspace, topic_id: bytes, partition: int, entry: ChunkEntry
) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
    """The keys and values `put_entry` writes: the chunk entry, and its copy in the
    reverse index of its object."""
    chunk_key, reverse_key = entry_keys(sub, topic_id, partition, entry)
    return (chunk_key, entry_value(entry)), (reverse_key, _reverse_value(entry))


def clear_chunk_range(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, partition: int, first: int, last: int
) -> None:
    """Remove the partition's entries whose last offsets lie in [first, last] (their
    copies in the reverse index stay: see reverse_index_range)."""
    tr.clear_range(
        sub.key(keys.CHUNK, topic_id, partition, first),
        sub.key(keys.CHUNK, topic_id, partition, last) + b"\x00",
    )


def reverse_index_range(sub: keys.Subspace, object_key: str) -> tuple[bytes, bytes]:
    """The keys of the object's reverse index: (begin, end)."""
    return sub.range(keys.OBJECT_CHUNK, object_key)


def object_entries(
    tr: ReadTransaction, sub: keys.Subspace, object_key: str, limit: int = 0
) -> list[tuple[bytes, int, ChunkEntry]]:
    """(topic id, partition, entry) of the chunk entries naming the object, from its
    reverse index, in (topic, partition, offset) order. Empty for an object committed
    before the reverse index existed."""
    return [(t, p, e) for t, p, e, _value in stored_object_entries(tr, sub, object_key, limit)]


def stored_object_entries(
    tr: ReadTransaction, sub: keys.Subspace, object_key: str, limit: int = 0
) -> list[tuple[bytes, int, ChunkEntry, bytes]]:
    """`object_entries`, each with the value of its CHUNK key as stored (`entry_value`):
    the packed object key followed by the reverse index's value, since a packed tuple is
    its packed elements one after the other."""
    begin, end = reverse_index_range(sub, object_key)
    head = keys.pack_value((object_key,))
    out = []
    for key, value in tr.get_range(begin, end, limit=limit):
        _tag, _object, topic_id, partition, last_offset = sub.unpack(key)
        start, length, base, count, max_ts = keys.unpack_value(value)
        entry = ChunkEntry(
            object_key,
            int(start),
            int(length),
            int(base),
            int(last_offset),
            int(count),
            int(max_ts),
        )
        out.append((bytes(topic_id), int(partition), entry, head + value))
    return out


def partition_end_in_object(
    tr: ReadTransaction, sub: keys.Subspace, object_key: str, topic_id: bytes, partition: int
) -> int | None:
    """Where the partition's bytes in the object end (its last entry there, from the
    object's reverse index); None when no entry of the partition names the object."""
    begin, end = sub.range(keys.OBJECT_CHUNK, object_key, topic_id, partition)
    found = tr.get_range(begin, end, limit=1, reverse=True)
    if not found:
        return None
    start, length, *_rest = keys.unpack_value(found[0][1])
    return int(start) + int(length)


def iter_entries(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    from_offset: int = 0,
    page: int = 256,
) -> Iterator[ChunkEntry]:
    """Entries holding offsets >= from_offset, in offset order, read `page` at a time as
    they are used (a caller that stops early reads no more)."""
    _begin, end = sub.range(keys.CHUNK, topic_id, partition)
    begin = sub.key(keys.CHUNK, topic_id, partition, from_offset)
    while True:
        rows = tr.get_range(begin, end, limit=page)
        for key, value in rows:
            yield decode_entry(sub, key, value)
        if len(rows) < page:
            return
        begin = rows[-1][0] + b"\x00"


def read_chunks(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    from_offset: int,
    limit: int = 0,
    max_bytes: int | None = None,
) -> list[ChunkEntry]:
    """Entries holding offsets >= from_offset, in offset order.

    With max_bytes, the entries stop once those after the first hold max_bytes or more
    (the first may start before from_offset, so it does not count): a reader with that
    budget could not use any further entry.
    """
    _begin, end = sub.range(keys.CHUNK, topic_id, partition)
    begin = sub.key(keys.CHUNK, topic_id, partition, from_offset)
    if max_bytes is None:
        return [decode_entry(sub, k, v) for k, v in tr.get_range(begin, end, limit=limit)]
    rows = _pages(tr, begin, end, limit)
    return within_budget((decode_entry(sub, k, v) for k, v in rows), max_bytes)


FIRST_PAGE = 32


def _pages(
    tr: ReadTransaction, begin: bytes, end: bytes, limit: int
) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of [begin, end), limit at most (0: all), read in pages of FIRST_PAGE
    that double: a reader that stops at a budget reads few more than it takes (one page
    of `limit` would read and build them all)."""
    page, taken = FIRST_PAGE, 0
    while True:
        want = min(page, limit - taken) if limit else page
        rows = tr.get_range(begin, end, limit=want)
        yield from rows
        taken += len(rows)
        if len(rows) < want or (limit and taken >= limit):
            return
        begin = rows[-1][0] + b"\x00"  # the first key after the last one read
        page *= 2


def within_budget(entries: Iterable[ChunkEntry], max_bytes: int) -> list[ChunkEntry]:
    """The entries up to the one with which those after the first hold max_bytes or more
    (the first may start before the offset asked for, so it does not count): a reader
    with that budget could not use any further entry. Takes from `entries` lazily."""
    out: list[ChunkEntry] = []
    after_first = 0
    for entry in entries:
        out.append(entry)
        if len(out) > 1:
            after_first += entry.length
            if after_first >= max_bytes:
                break
    return out


def _run_entry(object_key: str, run: list[PendingBatch], next_offset: int) -> ChunkEntry:
    """The chunk entry of a run of accepted batches ending just before next_offset."""
    first, last = run[0], run[-1]
    return ChunkEntry(
        object_key,
        first.start,
        last.start + last.length - first.start,
        next_offset - sum(b.last_offset_delta + 1 for b in run),
        next_offset - 1,
        len(run),
        max(b.max_timestamp for b in run),
    )


def _check_in_transaction(
    tr: Transaction,
    sub: keys.Subspace,
    producer: producers.ProducerIdentity | None,
    cache: dict[str, txns.Txn | None],
    topic_id: bytes,
    partition: int,
) -> producers.SequenceCheck:
    """A transactional batch needs an ongoing transaction that holds its partition."""
    if producer is None or producer.transactional_id is None:
        return producers.SequenceCheck(ErrorCode.invalid_txn_state)
    tid = producer.transactional_id
    if tid not in cache:
        cache[tid] = txns.get_txn(tr, sub, tid)
    txn = cache[tid]
    if (
        txn is None
        or txn.state != txns.TxnState.ONGOING
        or (topic_id, partition) not in txn.partitions
    ):
        return producers.SequenceCheck(ErrorCode.invalid_txn_state)
    return producers.SequenceCheck()


def commit_ingest(
    tr: Transaction,
    sub: keys.Subspace,
    object_key: str,
    object_size: int,
    now_ms: int,
    batches: Sequence[PendingBatch],
    expired: Collection[int] = (),
    written: list[tuple[bytes, int, ChunkEntry]] | None = None,
) -> list[AppendResult]:
    """Give the batches of one uploaded object their offsets; results in input order.

    Batches of one partition must appear in the order they were received. The batches
    at the indexes in `expired` are refused with REQUEST_TIMED_OUT and not written:
    their producers were answered so, or may have given up on them. Each chunk entry
    written is appended to `written`, with its partition, in offset order per partition
    (a caller that retries the transaction empties it before each attempt).

    The partitions' states and the producers' records are read in one batch and the
    entries, states and records written in one batch (each statement of SQLite's costs
    a wait for the GIL beside a busy event loop; FoundationDB has the reads in flight
    together). Only a transactional batch or a marker reads and writes on its own.
    """
    results: list[AppendResult | None] = [None] * len(batches)
    by_partition: dict[tuple[bytes, int], list[int]] = {}
    for i, batch in enumerate(batches):
        by_partition.setdefault((batch.topic_id, batch.partition), []).append(i)
    states, identities, producer_states = _read_for_ingest(tr, sub, batches, by_partition)

    rows: list[tuple[bytes, bytes]] = []  # written together at the end
    live_chunks = 0  # entries written, all partitions
    added = 0  # bytes of the entries written for the partition at hand

    def write_run(run: list[PendingBatch], topic_id: bytes, partition: int, hwm: int) -> None:
        nonlocal live_chunks, added
        if run:
            entry = _run_entry(object_key, run, hwm)
            rows.extend(entry_rows(sub, topic_id, partition, entry))
            if written is not None:
                written.append((topic_id, partition, entry))
            live_chunks += 1
            added += entry.length

    txn_cache: dict[str, txns.Txn | None] = {}
    for (topic_id, partition), indexes in by_partition.items():
        state = states[topic_id, partition]
        if state is None:  # deleted (or shrunk) while the object was uploading
            for i in indexes:
                results[i] = AppendResult(ErrorCode.unknown_topic_or_partition)
            continue
        hwm = state.high_watermark
        added = 0
        run: list[PendingBatch] = []
        changed: set[int] = set()  # producers whose state here changed
        open_txns: dict[int, int | None] = {}
        for i in indexes:
            batch = batches[i]
            pid = batch.producer_id
            if i in expired:
                write_run(run, topic_id, partition, hwm)
                run = []
                results[i] = AppendResult(ErrorCode.request_timed_out)
                continue
            if batch.control != NOT_CONTROL:
                # A marker written by the transaction coordinator: no sequence checks.
                txns.close_open(
                    tr, sub, topic_id, partition, pid, hwm, batch.control == ABORT_MARKER
                )
                open_txns[pid] = None
            elif pid >= 0:
                pkey = (pid, topic_id, partition)
                last_seq = producers.last_sequence_of(batch.base_sequence, batch.last_offset_delta)
                check = producers.check_batch(
                    identities[pid],
                    producer_states[pkey],
                    batch.producer_epoch,
                    batch.base_sequence,
                    last_seq,
                )
                if (
                    check.error == ErrorCode.none
                    and check.duplicate_of is None
                    and batch.transactional
                ):
                    check = _check_in_transaction(
                        tr, sub, identities[pid], txn_cache, topic_id, partition
                    )
                if check.error != ErrorCode.none or check.duplicate_of is not None:
                    write_run(run, topic_id, partition, hwm)
                    run = []
                    results[i] = AppendResult(
                        check.error,
                        check.duplicate_of if check.duplicate_of is not None else -1,
                        state.log_start_offset,
                        duplicate=check.duplicate_of is not None,
                    )
                    continue
                producer_states[pkey] = producers.record_append(
                    producer_states[pkey], batch.producer_epoch, batch.base_sequence, last_seq, hwm
                )
                changed.add(pid)
                if batch.transactional:
                    if pid not in open_txns:
                        open_txns[pid] = txns.open_first_offset(tr, sub, topic_id, partition, pid)
                    if open_txns[pid] is None:
                        txns.mark_open(tr, sub, topic_id, partition, pid, hwm)
                        open_txns[pid] = hwm
            if run and run[-1].start + run[-1].length != batch.start:
                write_run(run, topic_id, partition, hwm)
                run = []
            run.append(batch)
            results[i] = AppendResult(ErrorCode.none, hwm, state.log_start_offset)
            hwm += batch.last_offset_delta + 1
        write_run(run, topic_id, partition, hwm)
        if hwm != state.high_watermark:
            log_bytes = None if state.log_bytes is None else state.log_bytes + added
            rows.append(
                partition_row(
                    sub, topic_id, partition, PartitionState(hwm, state.log_start_offset, log_bytes)
                )
            )
        for pid in changed:
            pstate = producer_states[pid, topic_id, partition]
            assert pstate is not None  # record_append returns a state
            rows.append(producers.partition_state_row(sub, pid, topic_id, partition, pstate))

    if live_chunks:
        # The object's record and the tallies (metadata.lifecycle); it waits for
        # compaction (metadata.compaction).
        rows.append(
            (
                sub.key(keys.OBJECT, object_key),
                keys.pack_value((object_size, live_chunks, now_ms, None, INGEST_LEVEL)),
            )
        )
        rows.append((sub.key(keys.L0_OBJECT, now_ms, object_key), keys.pack_value(())))
        for name, delta in (
            ("objects", 1),
            ("object_bytes", object_size),
            ("chunk_entries", live_chunks),
        ):
            tr.add(sub.key(keys.CLUSTER, "tally", name), delta)
    tr.set_many(rows)
    return [r if r is not None else AppendResult(ErrorCode.unknown_server_error) for r in results]


def _read_for_ingest(
    tr: Transaction,
    sub: keys.Subspace,
    batches: Sequence[PendingBatch],
    by_partition: dict[tuple[bytes, int], list[int]],
) -> tuple[
    dict[tuple[bytes, int], PartitionState | None],
    dict[int, producers.ProducerIdentity | None],
    dict[tuple[int, bytes, int], producers.PartitionProducerState | None],
]:
    """What commit_ingest reads, in one batch: each partition's state, and each
    idempotent producer's record and its state in each partition it writes to."""
    pids: dict[int, None] = {}
    pairs: dict[tuple[int, bytes, int], None] = {}
    for batch in batches:
        if batch.control == NOT_CONTROL and batch.producer_id >= 0:
            pids[batch.producer_id] = None
            pairs[batch.producer_id, batch.topic_id, batch.partition] = None
    wanted = [partition_key(sub, t, p) for t, p in by_partition]
    wanted += [producers.producer_key(sub, pid) for pid in pids]
    wanted += [producers.partition_state_key(sub, *pair) for pair in pairs]
    found = iter(tr.get_many(wanted))
    states = {tp: decode_partition(next(found)) for tp in by_partition}
    identities = {pid: producers.decode_producer(pid, next(found)) for pid in pids}
    producer_states = {pair: producers.decode_partition_state(next(found)) for pair in pairs}
    return states, identities, producer_states
