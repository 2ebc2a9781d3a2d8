"""Cleaning a compacted partition (cleanup.policy=compact): the pure core, with the
semantics of Apache Kafka's log cleaner (Cleaner, MemoryRecords.filterTo,
CleanedTransactionMetadata, SkimpyOffsetMap). Batches in, batches out; no I/O.

A round, as Kafka's Cleaner.doClean runs one:

1. ``build_key_map`` reads the dirty batches, from the first dirty offset to ``end`` (the
   first uncleanable offset), and maps each key to its latest offset until the map is
   full. The round covers the offsets below the ``end_offset`` it returns.
2. ``clean`` reads the partition's batches from its start, cleaned and dirty alike, and
   yields per batch what replaces it: the same bytes, a rebuilt batch, an empty batch
   (a header) or nothing.
3. The next round starts at that ``end_offset``; when it reaches ``end``, the partition
   is clean.

Rules:

- Offsets never change. A batch keeps its base offset and last offset delta however
  many records go (protocol.records ``rebuild_batch``, ``empty_batch``); a batch whose
  records all stay, with no delete horizon to set, is passed on byte for byte.
- A data record stays when it is past the map (offset > ``latest_offset``), or when it
  has a key, is the latest offset seen for it, and has a value or is a tombstone whose
  batch's delete horizon has not passed. Keyless records in the cleaned range go (Kafka
  counts them as invalid).
- Tombstones and transaction markers go in two passes: the pass that first keeps one
  sets its batch's delete horizon (now + delete.retention.ms); a pass after the horizon
  drops it. A consumer that reads the partition within delete.retention.ms sees it.
- Transactions are followed in offset order from the partition's aborted index: the data
  of an aborted transaction goes at once; its ABORT marker stays while any of that data
  was seen in the pass (and the transaction stays in the aborted index), then goes like
  a tombstone. A COMMIT marker may go once no data of its transaction is left.
- Kept even when empty: a producer's last batch (its epoch and last sequence fence and
  deduplicate it), and the batch that ends just before the first uncleanable offset (so
  the log's next offset stays known).
- The key map is bounded by a byte budget (log.cleaner.dedupe.buffer.size), filled to
  ``log.cleaner.io.buffer.load.factor`` of the entries that budget holds. Keys are kept
  as 16-byte BLAKE2b digests: a collision (odds near 2^-65 among 2^32 keys) would make a
  record look superseded, the risk Kafka takes with its MD5 digests.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeAlias

from protocol.records import (
    ControlRecordType,
    Record,
    RecordBatchView,
    control_record_type,
    empty_batch,
    iter_records,
    rebuild_batch,
)

__all__ = [
    "DEFAULT_DEDUPE_BUFFER_SIZE",
    "DEFAULT_LOAD_FACTOR",
    "ENTRY_BYTES",
    "KEY_HASH_SIZE",
    "AbortedTxn",
    "BatchRetention",
    "CleanedBatch",
    "CleanerStats",
    "KeyMap",
    "KeyMapRound",
    "LastBatch",
    "build_key_map",
    "clean",
]

DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024
"""log.cleaner.dedupe.buffer.size: Kafka's default, in bytes."""
DEFAULT_LOAD_FACTOR = 0.9
"""log.cleaner.io.buffer.load.factor: how full the key map may get."""
KEY_HASH_SIZE = 16

ENTRY_BYTES = 192
"""What one key map entry costs in CPython, at most: a dict slot, a 16-byte bytes object
and an int. Measured with tracemalloc on CPython 3.11 (tests/storage/test_cleaner.py):
112-145 bytes per entry held, and up to 175 at the peak of a dict resize, when the old and
new tables coexist (a dict grows by up to 4x at 2/3 full). Rounded up for other CPython
versions. Kafka's own map takes 24 bytes per entry (an MD5 digest and a long)."""


# --- the key map -----------------------------------------------------------------------


class KeyMap:
    """Kafka's OffsetMap: the hash of each key to the latest offset seen for it.

    ``latest_offset`` is the highest offset the map covers: a record past it was not
    looked at when the map was built, so the map says nothing about it. ``put``
    advances it, as Kafka's does.
    """

    __slots__ = ("_offsets", "capacity", "latest_offset")

    def __init__(
        self,
        buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
        load_factor: float = DEFAULT_LOAD_FACTOR,
    ) -> None:
        self.capacity = int(buffer_size // ENTRY_BYTES * load_factor)
        if self.capacity < 1:
            # Kafka asserts the same: a map that holds no key never lets cleaning progress.
            raise ValueError(
                f"a key map of {buffer_size} bytes at load factor {load_factor} holds no key "
                f"({ENTRY_BYTES} bytes each)"
            )
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._offsets)

    def __repr__(self) -> str:
        return (
            f"KeyMap(size={len(self._offsets)}, capacity={self.capacity}, "
            f"latest_offset={self.latest_offset})"
        )

    @property
    def full(self) -> bool:
        return len(self._offsets) >= self.capacity

    def put(self, key: bytes, offset: int) -> None:
        """Map ``key`` to ``offset``.

        :raises ValueError: a new key when the map is full (the caller checks ``full``).
        """
        digest = hashlib.blake2b(key, digest_size=KEY_HASH_SIZE).digest()
        if len(self._offsets) >= self.capacity and digest not in self._offsets:
            raise ValueError(f"the key map is full ({self.capacity} keys)")
        self._offsets[digest] = offset
        if offset > self.latest_offset:
            self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The offset mapped for ``key``, or -1."""
        return self._offsets.get(hashlib.blake2b(key, digest_size=KEY_HASH_SIZE).digest(), -1)

    def clear(self) -> None:
        self._offsets.clear()
        self.latest_offset = -1


# --- transactions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction on the partition: its producer, its first offset and the
    offset of its ABORT marker."""

    producer_id: int
    first_offset: int
    marker_offset: int


@dataclass(slots=True)
class _OpenAbort:
    first_offset: int
    last_data_offset: int | None = None  # of the last batch of it seen in this pass


class _Transactions:
    """Kafka's CleanedTransactionMetadata: which transactions are open where a pass is.

    An aborted transaction opens for its producer at the first batch that ends at or
    after its first offset, and closes at its ABORT marker; transactional data of that
    producer in between is aborted. Other transactional data opens a committed
    transaction, which its COMMIT marker closes.
    """

    __slots__ = ("_pending", "_aborted", "_committed")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self._pending = deque(sorted(aborted, key=lambda txn: txn[1]))
        self._aborted: dict[int, _OpenAbort] = {}
        self._committed: set[int] = set()

    def _open_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0][1] <= offset:
            producer_id, first_offset = self._pending.popleft()
            self._aborted.setdefault(producer_id, _OpenAbort(first_offset))

    def on_data_batch(self, batch: RecordBatchView) -> bool:
        """Whether ``batch`` belongs to an aborted transaction (and may go)."""
        self._open_up_to(batch.last_offset)
        if not batch.is_transactional:
            return False
        txn = self._aborted.get(batch.producer_id)
        if txn is None:
            self._committed.add(batch.producer_id)
            return False
        txn.last_data_offset = batch.last_offset
        return True

    def on_control_batch(
        self, batch: RecordBatchView, kind: ControlRecordType | None, empty: bool
    ) -> tuple[bool, AbortedTxn | None]:
        """Whether the marker ``batch`` may go; and the transaction it aborts when that
        must stay in the aborted index because data of it was seen in this pass."""
        self._open_up_to(batch.last_offset)
        if empty:
            return True, None  # emptied by an earlier pass
        producer_id = batch.producer_id
        if kind is ControlRecordType.ABORT:
            txn = self._aborted.pop(producer_id, None)
            if txn is not None and txn.last_data_offset is not None:
                return False, AbortedTxn(producer_id, txn.first_offset, batch.last_offset)
            return True, None
        if kind is ControlRecordType.COMMIT:
            if producer_id in self._committed:
                self._committed.discard(producer_id)
                return False, None
            return True, None
        return False, None  # a control record this broker does not know: keep it


# --- building the key map ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyMapRound:
    """What ``build_key_map`` covered: the offsets below ``end_offset``; ``full`` when the
    map filled before the end asked for, so another round must follow."""

    end_offset: int
    full: bool


def build_key_map(
    batches: Iterable[RecordBatchView],
    start: int,
    end: int,
    key_map: KeyMap,
    aborted: Iterable[tuple[int, int]] = (),
) -> KeyMapRound:
    """Fill ``key_map`` (cleared first) from the keyed records of ``batches`` with offsets
    in [start, end), as Kafka's Cleaner.buildOffsetMap does.

    ``batches`` are one partition's, in offset order, reaching ``end`` (earlier ones are
    read for their transactions only). ``aborted`` is the partition's aborted index over
    the same offsets, (producer_id, first_offset) as ``metadata.txns.aborted_between``
    gives it: records of aborted transactions are left out, and control batches never
    count. ``start`` is the first dirty offset, ``end`` the first uncleanable one.

    The map stops the moment it is full, before the next key: ``latest_offset`` is then
    the last offset put, and the round ends after it, maybe within a batch (the next
    round takes up the rest from there). Otherwise ``latest_offset`` moves to ``end - 1``,
    across any gap in the offsets.
    """
    key_map.clear()
    txns = _Transactions(aborted)
    for batch in batches:
        if batch.base_offset >= end:
            break
        if batch.is_control:
            records = list(iter_records(batch))
            kind = control_record_type(records[0].key) if records else None
            txns.on_control_batch(batch, kind, empty=not records)
        elif not txns.on_data_batch(batch) and batch.last_offset >= start:
            base = batch.base_offset
            for record in iter_records(batch):
                offset = base + record.offset_delta
                if record.key is None or offset < start or offset >= end:
                    continue
                if key_map.full:
                    return KeyMapRound(key_map.latest_offset + 1, full=True)
                key_map.put(record.key, offset)
        if batch.last_offset >= start:
            key_map.latest_offset = max(key_map.latest_offset, min(batch.last_offset, end - 1))
    key_map.latest_offset = max(key_map.latest_offset, end - 1)
    return KeyMapRound(key_map.latest_offset + 1, full=False)


# --- cleaning ----------------------------------------------------------------------------


class BatchRetention(Enum):
    """Kafka's RecordFilter.BatchRetention: what may become of a batch as a whole."""

    RETAIN_EMPTY = "retain_empty"  # kept, as an empty batch if no record stays
    DELETE = "delete"  # dropped, whatever its records
    DELETE_EMPTY = "delete_empty"  # dropped if no record stays


LastBatch: TypeAlias = tuple[int | None, int]
"""A producer's last batch on the partition: (the last offset of its last data batch, or
None when its last batch is a marker; its epoch)."""


@dataclass(frozen=True, slots=True)
class CleanedBatch:
    """What one input batch becomes.

    ``data`` replaces ``source`` in the cleaned log: ``source``'s own bytes when
    ``unchanged`` (a view of the buffer it came from), a new batch, or None when it goes.
    ``aborted_txn`` is set on an ABORT marker whose transaction stays in the aborted index.
    """

    source: RecordBatchView
    retention: BatchRetention
    data: bytes | memoryview | None
    unchanged: bool
    records_read: int
    records_kept: int
    keyless_records: int
    aborted_txn: AbortedTxn | None = None

    @property
    def emptied(self) -> bool:
        """Kept as a header only."""
        return self.data is not None and self.records_kept == 0


@dataclass(slots=True)
class CleanerStats:
    """Totals of a cleaning pass (Kafka's CleanerStats), and ``aborted_txns``: the aborted
    transactions whose ABORT markers the pass kept because it saw data of theirs."""

    records_read: int = 0
    records_kept: int = 0
    keyless_records: int = 0
    bytes_read: int = 0
    bytes_kept: int = 0
    batches_read: int = 0
    batches_kept: int = 0
    batches_unchanged: int = 0
    batches_emptied: int = 0
    aborted_txns: list[AbortedTxn] = field(default_factory=list)

    def add(self, cleaned: CleanedBatch) -> None:
        self.records_read += cleaned.records_read
        self.records_kept += cleaned.records_kept
        self.keyless_records += cleaned.keyless_records
        self.bytes_read += cleaned.source.size
        self.batches_read += 1
        if cleaned.data is not None:
            self.bytes_kept += len(cleaned.data)
            self.batches_kept += 1
            self.batches_unchanged += cleaned.unchanged
            self.batches_emptied += cleaned.emptied
        if cleaned.aborted_txn is not None:
            self.aborted_txns.append(cleaned.aborted_txn)


def clean(
    batches: Iterable[RecordBatchView],
    key_map: KeyMap,
    *,
    now_ms: int,
    delete_retention_ms: int,
    upper_bound: int,
    aborted: Iterable[tuple[int, int]] = (),
    last_batch_of_producers: Mapping[int, LastBatch] | None = None,
    stats: CleanerStats | None = None,
) -> Iterator[CleanedBatch]:
    """Clean ``batches`` against ``key_map``, yielding what each becomes, in order
    (Kafka's Cleaner.cleanInto with its record filter).

    ``batches`` are one partition's, in offset order, from its start to the round's end
    at least; ``aborted`` is its aborted index over the same offsets, (producer_id,
    first_offset). A transaction whose ABORT marker lies before the first batch given
    must not be in it: it would stay open and take its producer's later transactional
    data for aborted. ``last_batch_of_producers`` maps each active producer to its
    ``LastBatch``. ``upper_bound`` is the first uncleanable offset (the ``end`` given to
    ``build_key_map``): the batch that ends just before it is kept, even empty.
    ``stats``, when given, adds up every batch yielded.

    The cleaned batches' aborted index is then the ``aborted_txn`` of the batches yielded
    (``stats.aborted_txns``): an aborted transaction whose marker was among ``batches``
    and is not there has no data left, and leaves the index.

    :raises RecordBatchError: records that do not decode.
    """
    txns = _Transactions(aborted)
    producers = last_batch_of_producers or {}
    for batch in batches:
        cleaned = _clean_batch(
            batch, key_map, txns, producers, now_ms, delete_retention_ms, upper_bound
        )
        if stats is not None:
            stats.add(cleaned)
        yield cleaned


def _is_last_of_producer(batch: RecordBatchView, producers: Mapping[int, LastBatch]) -> bool:
    last = producers.get(batch.producer_id)
    if last is None:
        return False
    last_data_offset, epoch = last
    if last_data_offset is not None:
        return batch.last_offset == last_data_offset
    return batch.is_control and batch.producer_epoch == epoch


def _clean_batch(
    batch: RecordBatchView,
    key_map: KeyMap,
    txns: _Transactions,
    producers: Mapping[int, LastBatch],
    now_ms: int,
    delete_retention_ms: int,
    upper_bound: int,
) -> CleanedBatch:
    horizon = batch.delete_horizon_ms
    records: list[Record] | None = None
    aborted_txn: AbortedTxn | None = None
    if batch.is_control:
        records = list(iter_records(batch))
        kind = control_record_type(records[0].key) if records else None
        can_discard, aborted_txn = txns.on_control_batch(batch, kind, empty=not records)
        # A marker outlives its transaction's data by delete.retention.ms, as a tombstone.
        discard_records = can_discard and horizon is not None and horizon <= now_ms
    else:
        can_discard = txns.on_data_batch(batch)
        discard_records = can_discard

    if batch.has_producer_id and _is_last_of_producer(batch, producers):
        retention = BatchRetention.RETAIN_EMPTY
    elif batch.next_offset == upper_bound:
        retention = BatchRetention.RETAIN_EMPTY
    elif discard_records:
        retention = BatchRetention.DELETE
    else:
        retention = BatchRetention.DELETE_EMPTY

    if retention is BatchRetention.DELETE:
        return CleanedBatch(batch, retention, None, False, batch.record_count, 0, 0, aborted_txn)

    keyless = 0
    if discard_records:
        read = batch.record_count
        kept: list[Record] = []
    elif records is not None:  # a control batch keeps its records
        read = len(records)
        kept = records
    else:
        records = list(iter_records(batch))
        read = len(records)
        kept = []
        latest = key_map.latest_offset
        base = batch.base_offset
        tombstones_expired = horizon is not None and now_ms >= horizon
        for record in records:
            offset = base + record.offset_delta
            if offset > latest:
                kept.append(record)
            elif record.key is None:
                keyless += 1
            elif offset >= key_map.get(record.key) and (
                record.value is not None or not tombstones_expired
            ):
                kept.append(record)

    if kept:
        needs_horizon = horizon is None and (
            (can_discard and batch.is_control) or any(r.value is None for r in kept)
        )
        if len(kept) == read and not needs_horizon:
            data: bytes | memoryview | None = batch.data
            unchanged = True
        else:
            new_horizon = now_ms + delete_retention_ms if needs_horizon else horizon
            data = rebuild_batch(batch, kept, delete_horizon_ms=new_horizon)
            unchanged = False
    elif retention is BatchRetention.RETAIN_EMPTY:
        data, unchanged = empty_batch(batch), False
    else:
        data, unchanged = None, False
    return CleanedBatch(batch, retention, data, unchanged, read, len(kept), keyless, aborted_txn)
