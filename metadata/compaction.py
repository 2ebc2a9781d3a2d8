"""Compaction in the metadata store: planning jobs, and committing them by re-pointing.

Levels. An ingest file is level 0: it holds many partitions, a little of each. A level-1
job merges up to `max_inputs` level-0 objects older than a minimum age into one object
that holds, per partition, the batches of all its inputs in offset order. A level-2 job
merges a partition's consecutive entries in up to `l2_max_inputs` level-1 objects into
one run of a new object, with the runs of the partitions of its topic next to it (after
it, then before it) whose level-1 data has waited half as long at least, while they fit
the job whole (a level-1 object holds them one after the other, so the job reads them in
one range; and they leave level 1 together, so that they fall due together after: jobs
of several partitions' runs, which a catch-up read of the topic reads with one GET
each). It starts once the partition's level-1 entries hold `max_bytes`, or come from
`l2_max_inputs` objects, or the oldest of them has waited `max_wait_ms` (less on a topic
whose retention span is shorter: waiting longer than a run may cover gains nothing). A
level-0 object whose every entry is already long (`Limits.promote_bytes`) is promoted to
level 1 as it is, by its metadata alone. Batches are copied byte for byte; no offset
ever changes.

Rules:

- Jobs are planned from the metadata, never by listing the store: level-0 objects wait
  in (L0_OBJECT, created_ms, key) by age, partitions with entries in level-1 objects in
  (L1_PARTITION, topic, partition), and an object's entries are found in its reverse
  index (OBJECT_CHUNK). Objects without a level (written before levels existed) have no
  reverse index and are never picked.
- A plan claims what it takes for `lease_ms` (the claim lives in the queue row), so that
  jobs planned meanwhile take other inputs; once the claim expires (its agent died) any
  agent may plan the inputs again. A claim only saves work: the commit checks all it
  changes, so two jobs over the same entries commit at most once.
- A plan is bounded: at most `max_inputs` objects (`l2_max_inputs` at level 2),
  `max_bytes` of entries (what the job reads and holds) and `max_entries` entries (what
  its commit clears and writes, so that it fits FoundationDB's limits: < 10 MB, < 5 s).
  Every input object gives a level-2 job one entry at least, so `max_entries` bounds its
  objects too, whatever `l2_max_inputs` is.
- `commit_prepared` is the one transaction that makes a job's output part of the logs
  (`prepare_commit` works out before it what it compares and writes; `commit_job` does
  both). Its reads of a key come before its writes to it, so that it can be worked out
  on a snapshot (`KV.transact_optimistic`: SQLite's writer lock held only to ask its
  reads again and make its writes). Only
  if the topics still exist and every input entry is still exactly what the plan read
  does it replace them with the output's entries, write the output's OBJECT record and
  reverse index, and unreference each input by the entries it lost (so that an input
  left with none goes to the dead queue). Otherwise nothing of the logs changes and the
  output is recorded dead, due for deletion at once: no reader can know its key.
- High watermarks, log start offsets, producer state, transactions and aborted markers
  are never touched, nor a partition's byte count: the output's entries hold the same
  bytes as the inputs' did. A commit reads no PARTITION key, so produce commits never
  conflict with it.
- Every function here is a pure transaction function: it may run more than once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from typing import Any

from metadata import keys
from metadata.kv import ReadTransaction, Transaction
from metadata.lifecycle import ObjectRecord, get_objects, put_object, tally, unreference_many
from metadata.log import (
    INGEST_LEVEL,
    ChunkEntry,
    decode_entry,
    entry_keys,
    entry_rows,
    entry_value,
    iter_entries,
    read_chunks,
    reverse_index_range,
    stored_object_entries,
)

L1 = 1
L2 = 2
NOBODY = -1  # the node id of an unclaimed row
SCAN = 256  # queue rows (or entries) one plan looks at, at most
RECORDS_AHEAD = 32  # entries of a level-2 plan whose objects' records are read together
PASSED_OVER = 8  # runs inside one object a level-2 plan passes over, at most
# A partition joins the level-2 job of the one before it once its level-1 data has waited
# this share of the wait that makes a partition due on its own (`_joining`).
JOIN_WAIT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Limits:
    max_inputs: int = 32  # objects of a level-1 job
    max_bytes: int = 64 * 1024 * 1024
    max_entries: int = 2_000
    l2_max_inputs: int = 256  # objects of a level-2 job
    # A level-0 object whose every entry holds at least this many bytes enters level 1
    # as it is (`promote_l1`); 0: none does.
    promote_bytes: int = 128 * 1024


@dataclass(frozen=True, slots=True)
class JobEntry:
    """A chunk entry of one partition, as a plan read it or a commit writes it."""

    topic_id: bytes
    partition: int
    entry: ChunkEntry
    # The entry's CHUNK value as the plan read it, where it read that (empty: a commit
    # packs it from `entry`, which gives the same bytes).
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one job merges: input entries in (topic, partition, offset) order."""

    level: int  # the output's level
    entries: tuple[JobEntry, ...]
    queued: tuple[tuple[int, str], ...] = ()  # (created_ms, key) of level-0 inputs
    # Of a level-2 job, per partition it claimed: (topic id, partition, when what its
    # run leaves in level 1 came there at the earliest): the plan's time, or, when a
    # limit or a gap cut the run, when the level-1 object holding its last entry came to
    # level 1 (what is left came in that object or, nearly always, after it).
    level_one_rows: tuple[tuple[bytes, int, int], ...] = ()

    @property
    def input_keys(self) -> list[str]:
        return list(dict.fromkeys(e.entry.object_key for e in self.entries))

    @property
    def input_bytes(self) -> int:
        return sum(e.entry.length for e in self.entries)

    def partitions(self) -> list[tuple[bytes, int, list[ChunkEntry]]]:
        """(topic id, partition, its entries in offset order), in (topic, partition) order."""
        return [(t, p, [e.entry for e in group]) for t, p, group in _grouped(self.entries)]


@dataclass(frozen=True, slots=True)
class JobResult:
    committed: bool
    reason: str = ""  # why the job was dropped


def _sorted(entries: list[JobEntry]) -> tuple[JobEntry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.topic_id, e.partition, e.entry.last_offset)))


def _claimed(value: tuple[Any, ...], now_ms: int) -> bool:
    """Whether a queue row's claim (node_id, expires_ms) holds at now_ms."""
    return len(value) >= 2 and int(value[0]) != NOBODY and int(value[1]) > now_ms


# -- level 0 -> level 1 -------------------------------------------------------------------


def plan_l1(
    tr: Transaction,
    sub: keys.Subspace,
    node_id: int,
    now_ms: int,
    min_age_ms: int,
    limits: Limits,
    lease_ms: int,
) -> Plan | None:
    """Claim the oldest unclaimed level-0 objects at least `min_age_ms` old that fit the
    limits together (two at least: one alone gains nothing); None when there are not two.
    `select_l1`, `promote_l1` and `claim_l1` in one transaction."""
    selection = select_l1(tr, sub, now_ms, min_age_ms, limits)
    promote_l1(tr, sub, selection, now_ms)
    return claim_l1(tr, sub, selection, node_id, now_ms, lease_ms)


@dataclass(frozen=True, slots=True)
class L1Selection:
    """What a level-1 plan read: the level-0 objects it would claim, with their entries, and
    the queue rows it would drop."""

    chosen: tuple[tuple[int, str, tuple[JobEntry, ...]], ...]  # (created_ms, key, entries)
    dropped: tuple[tuple[int, str], ...]  # (created_ms, key) of rows leaving the queue
    # Level-0 objects that enter level 1 as they are, (created_ms, key, entries).
    promoted: tuple[tuple[int, str, tuple[JobEntry, ...]], ...] = ()


def select_l1(
    tr: ReadTransaction, sub: keys.Subspace, now_ms: int, min_age_ms: int, limits: Limits
) -> L1Selection:
    """Read which level-0 objects a level-1 plan takes; it writes nothing, so that it can
    run in a read transaction (on SQLite: without the write lock that produce commits
    wait for), `claim_l1` then claiming them in a short one.

    A job is taken once it is full (max_inputs objects, or the next object would pass
    max_bytes or max_entries) or its oldest object is twice min_age_ms old: objects that
    reach the minimum age a few at a time (an object store's flushes of a few MB every
    quarter of a second) wait a little for the others, so that each level-1 object holds
    as long a run of each partition as the limits allow, and a level-2 job of a partition
    reads fewer, longer ranges.

    An object whose every entry holds at least `promote_bytes` is not merged: it enters
    level 1 as it is, by its metadata alone (`promote_l1`), and waits there for level 2
    like a level-1 object. A job merges consecutive entries up to the output's entry
    size (256 KiB by default); with `promote_bytes` half of that, it would merge each of
    these with one smaller neighbour at most, and every entry of at least that size it
    copies unchanged. A one-partition topic's flushes under load are such objects (a
    Java producer's batch of 256 KiB each); merging them wrote every byte once more,
    beside the flushes, for little a read gains.

    An object that alone passes max_bytes or max_entries leaves the queue: it stays a
    level-0 object until retention takes it. So does the oldest object when it fits a job
    with none of the objects after it (each too large to go with it, as when every file
    holds more than half the limits): otherwise it would stay first in line, planned with
    nothing, forever. An object holding entries of a deleted topic waits until garbage
    collection has dropped them (a commit would be refused).
    """
    begin, _end = sub.range(keys.L0_OBJECT)
    end = sub.key(keys.L0_OBJECT, now_ms - min_age_ms + 1)
    chosen: list[tuple[int, str, tuple[JobEntry, ...]]] = []
    dropped: list[tuple[int, str]] = []
    promoted: list[tuple[int, str, tuple[JobEntry, ...]]] = []
    total_bytes = total_entries = 0
    passed_over = False
    full = False
    topics: dict[bytes, bool] = {}
    rows = tr.get_range(begin, end, limit=SCAN)
    for row_key, value in rows:
        if len(chosen) == limits.max_inputs:
            full = True
            break
        if _claimed(keys.unpack_value(value), now_ms):
            continue
        _tag, created, object_key = sub.unpack(row_key)
        created, object_key = int(created), str(object_key)
        found = tuple(
            JobEntry(t, p, e, value)
            for t, p, e, value in stored_object_entries(tr, sub, object_key)
        )
        size = sum(e.entry.length for e in found)
        if not found or size > limits.max_bytes or len(found) > limits.max_entries:
            dropped.append((created, object_key))  # nothing left, or never fits a job
            continue
        if not all(_topic_exists(tr, sub, topics, e.topic_id) for e in found):
            continue
        if limits.promote_bytes and all(e.entry.length >= limits.promote_bytes for e in found):
            promoted.append((created, object_key, found))
            continue
        if total_bytes + size > limits.max_bytes or total_entries + len(found) > limits.max_entries:
            if len(chosen) >= 2:
                full = True
                break
            passed_over = True
            continue  # may fit a later job; look for smaller ones to go with
        chosen.append((created, object_key, found))
        total_bytes += size
        total_entries += len(found)
    else:
        full = len(chosen) == limits.max_inputs or len(rows) == SCAN
    if len(chosen) == 1 and passed_over:
        dropped.append(chosen[0][:2])  # fits with none after it
    if len(chosen) < 2 or not (full or now_ms - chosen[0][0] >= 2 * min_age_ms):
        chosen = []  # nothing to merge yet, or a job that can still grow
    return L1Selection(tuple(chosen), tuple(dropped), tuple(promoted))


def has_work(tr: ReadTransaction, sub: keys.Subspace) -> bool:
    """Whether any level-0 object waits for level 1 or any partition has level-1 entries:
    two reads of one row each, for an agent that starts compaction only once there is any."""
    return any(
        tr.get_range(*sub.range(tag), limit=1) for tag in (keys.L0_OBJECT, keys.L1_PARTITION)
    )


def claim_l1(
    tr: Transaction,
    sub: keys.Subspace,
    selection: L1Selection,
    node_id: int,
    now_ms: int,
    lease_ms: int,
) -> Plan | None:
    """Claim what `select_l1` chose and drop the rows it dropped, each only if its row is
    still unclaimed (another agent may have planned it since); the plan, or None when
    there is nothing to claim or another agent claimed one of the objects first."""
    dropped = [sub.key(keys.L0_OBJECT, created, key) for created, key in selection.dropped]
    row_keys = [sub.key(keys.L0_OBJECT, created, key) for created, key, _ in selection.chosen]
    found = tr.get_many(dropped + row_keys)  # read together, written together
    tr.clear_many(
        [
            row_key
            for row_key, raw in zip(dropped, found[: len(dropped)], strict=True)
            if raw is not None and not _claimed(keys.unpack_value(raw), now_ms)
        ]
    )
    if not selection.chosen:
        return None
    for raw in found[len(dropped) :]:
        if raw is None or _claimed(keys.unpack_value(raw), now_ms):
            return None  # planned meanwhile: the next plan reads again
    claim = _claim(node_id, now_ms, lease_ms)
    tr.set_many([(row_key, claim) for row_key in row_keys])
    return Plan(
        L1,
        _sorted([e for _c, _k, found in selection.chosen for e in found]),
        queued=tuple((created, key) for created, key, _found in selection.chosen),
    )


def promote_l1(tr: Transaction, sub: keys.Subspace, selection: L1Selection, now_ms: int) -> int:
    """Move the selection's promoted objects from level 0 to level 1 as they are: each
    leaves the queue, its record says level 1 since now_ms, and its partitions' level-1
    rows grow by its entries, as a level-1 job's commit would have made them with a copy.
    Only objects still queued, unclaimed and alive are moved (another agent may have
    planned one, or retention taken it whole, since the selection read them); their
    entries, and so every reader's view of the logs, stay as they are. The objects moved."""
    if not selection.promoted:
        return 0
    row_keys = [sub.key(keys.L0_OBJECT, created, key) for created, key, _ in selection.promoted]
    object_keys = [key for _created, key, _found in selection.promoted]
    rows = tr.get_many(row_keys)
    records = get_objects(tr, sub, object_keys)
    moved: list[tuple[bytes, str, ObjectRecord, tuple[JobEntry, ...]]] = []
    for (_created, key, found), row_key, raw, record in zip(
        selection.promoted, row_keys, rows, records, strict=True
    ):
        if raw is None or _claimed(keys.unpack_value(raw), now_ms):
            continue
        if record is None or record.dead_since_ms is not None or record.level != INGEST_LEVEL:
            continue
        moved.append((row_key, key, record, found))
    if not moved:
        return 0
    grown: dict[tuple[bytes, int], tuple[int, int, int]] = {}  # bytes, objects, first offset
    for _row_key, _key, _record, found in moved:
        for topic_id, partition, group in _grouped(found):
            size, objects, first = grown.get((topic_id, partition), (0, 0, 2**63))
            grown[(topic_id, partition)] = (
                size + sum(e.entry.length for e in group),
                objects + 1,
                min(first, group[0].entry.base_offset),
            )
    _add_level_one(tr, sub, grown, now_ms)
    tr.clear_many([row_key for row_key, _key, _record, _found in moved])
    for _row_key, key, record, _found in moved:
        # Its time becomes now, as a level-1 job's output's is its commit's: a level-1
        # record's time says when the object came to level 1, which level 2 waits from.
        put_object(tr, sub, key, replace(record, level=L1, created_ms=now_ms))
    return len(moved)


def _topic_exists(
    tr: ReadTransaction, sub: keys.Subspace, known: dict[bytes, bool], topic_id: bytes
) -> bool:
    if topic_id not in known:
        known[topic_id] = tr.get(sub.key(keys.TOPIC, topic_id)) is not None
    return known[topic_id]


def _claim(node_id: int, now_ms: int, lease_ms: int) -> bytes:
    return keys.pack_value((node_id, now_ms + lease_ms))


# -- level 1 -> level 2 -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _L1Row:
    """(L1_PARTITION, topic, partition): roughly what of the partition waits in level 1
    (retention may have taken some since, and a job that takes part of an object's
    entries of the partition counts the object as gone, as does the next one: a plan
    reads the entries themselves, and a row goes only when they say it is empty).

    `oldest_ms`: when the oldest of it arrived in level 1. Set when the row is created,
    kept while the row grows, and moved on (never back) when a job or a plan takes the
    head of the row: to when the level-1 object holding the run's last entry came to
    level 1, or, when the run took all of the row's level 1, to the plan's time (what is
    left came in that object or after it). Rows written before this field have
    five fields and read as 0: their partitions are due for level 2 at once rather than
    never, since a partition that gets no more level-1 data never has its row written
    again to start a wait, and its data has waited since before the upgrade anyway.
    """

    size: int  # bytes
    objects: int
    first_offset: int
    node_id: int = NOBODY
    expires_ms: int = 0
    oldest_ms: int = 0

    def pack(self) -> bytes:
        return keys.pack_value(
            (
                self.size,
                self.objects,
                self.first_offset,
                self.node_id,
                self.expires_ms,
                self.oldest_ms,
            )
        )

    @staticmethod
    def unpack(raw: bytes) -> _L1Row:
        return _L1Row(*(int(v) for v in keys.unpack_value(raw)))

    def unclaimed(self) -> _L1Row:
        return replace(self, node_id=NOBODY, expires_ms=0)

    def due(self, now_ms: int, limits: Limits, max_wait_ms: int) -> bool:
        """Whether a level-2 job should start: enough bytes, enough objects, or data that
        has waited long enough (and two objects to merge at least)."""
        return (
            self.size >= limits.max_bytes
            or self.objects >= limits.l2_max_inputs
            or (self.objects >= 2 and now_ms - self.oldest_ms >= max_wait_ms)
        )


@dataclass(frozen=True, slots=True)
class _Run:
    """A run of consecutive level-1 entries of one partition, as `_level_one_run` found it."""

    entries: list[ChunkEntry]
    ended: bool  # an entry after it ends it (False: a later one may extend it)
    last_created_ms: int  # when the object holding its last entry came to level 1
    # A limit or a gap in the offsets ended it while level-1 entries went on (False: it
    # holds all of the partition's level 1 up to a level-0 entry, or up to its end).
    cut: bool = False
    # An entry of a level-0 object still queued for level 1 comes next (before anything,
    # when there are no entries): the partition's level 1 is not complete there yet.
    queued_next: bool = False


def _level_one_run(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    first_offset: int,
    limits: Limits,
    max_span_ms: int | None,
    records: dict[str, ObjectRecord | None],
) -> _Run:
    """The first run of consecutive entries in level-1 objects from first_offset on,
    within the limits and, by their timestamps, max_span_ms. `records` holds the objects'
    records read so far by the plan (the partitions of a job share their objects)."""
    run: list[ChunkEntry] = []
    run_bytes = 0
    objects: set[str] = set()
    lowest_ts = highest_ts = 0
    skipped = 0
    for entry in _with_records(tr, sub, topic_id, partition, first_offset, records):
        key = entry.object_key
        record = records[key]
        if record is None or record.level != L1:
            if _queued(tr, sub, key, record):
                return _run(run, True, records, queued_next=True)
            if run:
                return _run(run, True, records)
            skipped += 1
            if skipped > SCAN:
                break  # level-1 entries this far on are for a later plan
            continue
        if run:
            span = max(highest_ts, entry.max_timestamp) - min(lowest_ts, entry.max_timestamp)
            if (
                entry.base_offset != run[-1].last_offset + 1
                or run_bytes + entry.length > limits.max_bytes
                or len(run) == limits.max_entries
                or (key not in objects and len(objects) == limits.l2_max_inputs)
                or (max_span_ms is not None and span > max_span_ms)
            ):
                return _run(run, True, records, cut=True)
        else:
            lowest_ts = highest_ts = entry.max_timestamp
        run.append(entry)
        run_bytes += entry.length
        objects.add(key)
        lowest_ts = min(lowest_ts, entry.max_timestamp)
        highest_ts = max(highest_ts, entry.max_timestamp)
    return _run(run, False, records)


def _with_records(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    first_offset: int,
    records: dict[str, ObjectRecord | None],
) -> Iterator[ChunkEntry]:
    """The partition's entries from first_offset on, each with its object's record in
    `records` by the time it comes: the records of the next RECORDS_AHEAD entries' objects
    are read together (a read each would give up SQLite's thread's GIL each time, under
    the writer lock)."""
    entries = iter_entries(tr, sub, topic_id, partition, first_offset, SCAN)
    while ahead := list(islice(entries, RECORDS_AHEAD)):
        unknown = list(dict.fromkeys(e.object_key for e in ahead if e.object_key not in records))
        records.update(zip(unknown, get_objects(tr, sub, unknown), strict=True))
        yield from ahead


def _run(
    run: list[ChunkEntry],
    ended: bool,
    records: Mapping[str, ObjectRecord | None],
    *,
    cut: bool = False,
    queued_next: bool = False,
) -> _Run:
    last = records.get(run[-1].object_key) if run else None
    return _Run(run, ended, 0 if last is None else last.created_ms, cut, queued_next)


def _queued(tr: ReadTransaction, sub: keys.Subspace, key: str, record: ObjectRecord | None) -> bool:
    """Whether the object is a level-0 object still queued for level 1 (not one left out
    of the queue for good, too large for a job, nor one past its references)."""
    if record is None or record.level != INGEST_LEVEL or record.dead_since_ms is not None:
        return False
    return tr.get(sub.key(keys.L0_OBJECT, record.created_ms, key)) is not None


def plan_l2(
    tr: Transaction,
    sub: keys.Subspace,
    node_id: int,
    now_ms: int,
    limits: Limits,
    lease_ms: int,
    max_span_ms: Mapping[bytes, int] | None = None,
    cleaned_topics: Collection[bytes] = (),
    *,
    max_wait_ms: int,
    after: tuple[bytes, int] | None = None,
) -> Plan | None:
    """Claim a partition whose level-1 entries are due for level 2 (they hold max_bytes,
    come from l2_max_inputs objects, or the oldest of them has waited max_wait_ms), and
    plan its first run of consecutive level-1 entries (those of two objects at least; a
    run inside one object is read in one piece already, and is passed over). The
    partitions of the topic next to it (the ones after it, then the ones before it)
    whose level-1 data has waited `JOIN_WAIT_SHARE` of the wait at least join the job
    while their runs fit its limits whole: a level-1 object holds the partitions of a
    topic one after the other, so that the job reads their runs in one range of each
    object (a job per partition would read each object once per partition), and they
    leave level 1 together, so that they fall due together after (partitions of a topic
    fill at about one rate: without the share each fell due a moment after the one
    before it, and joined no job but its own; without the ones before it, a half-due
    partition just before a due one fell due a pass later to find its followers taken).

    `max_span_ms` per topic: the most a run may cover by its entries' max timestamps (so
    that retention by time never waits long for the rest of an object); such a topic's
    level-1 data waits at most that long too, since a longer wait makes no longer runs.
    None when no partition has such a run.

    Level 1 leaves for level 2 in offset order: a partition whose level-1 data begins
    at, or just after, an entry of a level-0 object still queued for a level-1 job waits
    for that object, and so does a run inside one object that ends at such an entry.
    Taken on, the partition's later data would leave that entry to reach level 1 alone
    between level-2 entries, a run no plan can take: its object, dead but for it, kept
    until retention (most flushes are promoted as they are, while the few holding a
    small entry wait for a level-1 job).

    `cleaned_topics` (compacted topics) are left to their cleaner, which writes objects of
    one partition itself: their rows go.

    The rows are looked at from the partition `after` on (the last one its caller
    planned), then from the first: partitions take turns, whatever their number, rather
    than the first ones in key order taking every job while those after them wait.
    """
    begin, end = sub.range(keys.L1_PARTITION)
    plan_in = partial(
        _plan_l2_in,
        tr,
        sub,
        node_id=node_id,
        now_ms=now_ms,
        limits=limits,
        lease_ms=lease_ms,
        spans=max_span_ms or {},
        cleaned_topics=cleaned_topics,
        max_wait_ms=max_wait_ms,
    )
    if after is None:
        return plan_in(begin, end)
    cursor = sub.key(keys.L1_PARTITION, *after) + b"\x00"
    return plan_in(cursor, end) or plan_in(begin, cursor)


def _plan_l2_in(
    tr: Transaction,
    sub: keys.Subspace,
    begin: bytes,
    end: bytes,
    *,
    node_id: int,
    now_ms: int,
    limits: Limits,
    lease_ms: int,
    spans: Mapping[bytes, int],
    cleaned_topics: Collection[bytes],
    max_wait_ms: int,
) -> Plan | None:
    """`plan_l2` over the rows in [begin, end)."""
    rows = tr.get_range(begin, end, limit=SCAN)
    records: dict[str, ObjectRecord | None] = {}  # read once for every row looked at
    rewritten = -1  # the index of the last row before this one the plan wrote or cleared
    for index, (row_key, value) in enumerate(rows):
        row = _L1Row.unpack(value)
        if row.node_id != NOBODY and row.expires_ms > now_ms:
            continue
        _tag, topic_id, partition = sub.unpack(row_key)
        topic_id, partition = bytes(topic_id), int(partition)
        if topic_id in cleaned_topics:
            tr.clear(row_key)
            rewritten = index
            continue
        span = spans.get(topic_id)
        wait_ms = max_wait_ms if span is None else min(max_wait_ms, span)
        if not row.due(now_ms, limits, wait_ms):
            continue
        if _behind_level_zero(tr, sub, topic_id, partition, row.first_offset, records):
            continue
        found = _first_run(
            tr, sub, row_key, row, topic_id, partition, now_ms, limits, wait_ms, span, records
        )
        if found is None:
            rewritten = index
            continue
        row, run = found  # the row less the runs passed over before the run
        group = [(row_key, row, topic_id, partition, run)]
        join = partial(
            _joining, tr, sub, group=group, now_ms=now_ms, limits=limits, wait_ms=wait_ms,
            span=span, records=records,
        )  # fmt: skip
        for next_key, next_value in rows[index + 1 :]:
            joined = join(next_key, next_value)
            if joined is None:
                break
            group.append(joined)
        # Then the partitions before the first, which were not due on their own: left
        # out, each would fall due a pass later to find its followers taken, a job of
        # one run. A row this plan rewrote ends the group there: `_first_run` found no
        # run in it, and reading it again would read the plan's own write, which a
        # plan worked out on a snapshot cannot (metadata.optimistic: it would run
        # again under the writer lock).
        for prev_key, prev_value in reversed(rows[rewritten + 1 : index]):
            joined = join(prev_key, prev_value, before=True)
            if joined is None:
                break
            group.insert(0, joined)
        entries: list[JobEntry] = []
        claimed_rows = []
        claims = []
        for key, member, member_topic, member_partition, member_run in group:
            first = member_run.entries[0]
            claimed = replace(
                member,
                first_offset=first.base_offset,
                node_id=node_id,
                expires_ms=now_ms + lease_ms,
            )
            claims.append((key, claimed.pack()))
            entries += (JobEntry(member_topic, member_partition, e) for e in member_run.entries)
            # What the run leaves came to level 1 after this plan, unless a limit or a
            # gap cut it: then when the object of its last entry came there, or after.
            arrived = member_run.last_created_ms if member_run.cut else now_ms
            claimed_rows.append((member_topic, member_partition, arrived))
        tr.set_many(claims)
        return Plan(L2, tuple(entries), level_one_rows=tuple(claimed_rows))
    return None


def _behind_level_zero(
    tr: ReadTransaction,
    sub: keys.Subspace,
    topic_id: bytes,
    partition: int,
    first_offset: int,
    records: dict[str, ObjectRecord | None],
) -> bool:
    """Whether the partition's entry just before its level-1 data is in a level-0 object
    still queued for level 1. Such a partition waits: its level-1 data came there first
    only because its objects were promoted as they were, while the object before them
    waits for a level-1 job. Taken now, its run would go to level 2 without that entry,
    which, arriving in level 1 after it, would find level-2 data next to it and, a run
    inside one object, be passed over for good: its level-1 object kept (for the rest of
    retention) for one partition's entry."""
    begin, _end = sub.range(keys.CHUNK, topic_id, partition)
    before = tr.get_range(
        begin, sub.key(keys.CHUNK, topic_id, partition, first_offset), limit=1, reverse=True
    )
    if not before:
        return False
    key = decode_entry(sub, *before[0]).object_key
    if key not in records:
        records[key] = get_objects(tr, sub, [key])[0]
    return _queued(tr, sub, key, records[key])


def _first_run(
    tr: Transaction,
    sub: keys.Subspace,
    row_key: bytes,
    row: _L1Row,
    topic_id: bytes,
    partition: int,
    now_ms: int,
    limits: Limits,
    wait_ms: int,
    span: int | None,
    records: dict[str, ObjectRecord | None],
) -> tuple[_L1Row, _Run] | None:
    """The due partition's first run of two objects at least, with its row less the runs
    inside one object passed over before it (for good); None when it has none now. The
    row is brought up to date either way."""
    offset = row.first_offset
    for _ in range(PASSED_OVER):
        run = _level_one_run(tr, sub, topic_id, partition, offset, limits, span, records)
        if not run.entries:
            if not run.queued_next:
                tr.clear(row_key)  # nothing (left) in level 1: the row was stale
            return None  # (or it waits for the level-0 entry at its head)
        first = run.entries[0]
        if len({e.object_key for e in run.entries}) >= 2:
            return row, run
        run_bytes = sum(e.length for e in run.entries)
        oldest = max(row.oldest_ms, run.last_created_ms)
        if not run.ended:
            # The partition's last level-1 entries, in one object: they wait for the
            # next level-1 objects of the partition.
            tr.set(row_key, _L1Row(run_bytes, 1, first.base_offset, oldest_ms=oldest).pack())
            return None
        if run.queued_next:
            # Before a level-0 entry still to come to level 1: the run grows with it.
            return None
        # A run inside one object that can grow no more: passed over for good.
        left_bytes, left_objects = row.size - run_bytes, row.objects - 1
        row = _L1Row(
            max(1, left_bytes),
            max(1, left_objects),
            run.entries[-1].last_offset + 1,
            oldest_ms=oldest,
        )
        tr.set(row_key, row.pack())
        # The counts are a guide only (`_took_level_one`): where they say nothing is
        # left, the entries after are read (a row found stale there is cleared).
        if left_bytes > 0 and left_objects > 0 and not row.due(now_ms, limits, wait_ms):
            return None  # what is left is not due yet
        offset = row.first_offset
    return None


def _joining(
    tr: Transaction,
    sub: keys.Subspace,
    row_key: bytes,
    value: bytes,
    group: list[tuple[bytes, _L1Row, bytes, int, _Run]],
    now_ms: int,
    limits: Limits,
    wait_ms: int,
    span: int | None,
    records: dict[str, ObjectRecord | None],
    *,
    before: bool = False,
) -> tuple[bytes, _L1Row, bytes, int, _Run] | None:
    """The row's partition with its run, if it joins the group's job: the partition of
    the same topic next after the group's last (before its first, with before), unclaimed
    and due by `JOIN_WAIT_SHARE` of the wait, with a run of two objects at least that fits
    the job's limits whole beside the group's runs. None ends the group on that side."""
    _key, _row, topic_id, edge, _run = group[0] if before else group[-1]
    _tag, row_topic, row_partition = sub.unpack(row_key)
    wanted = edge - 1 if before else edge + 1
    if bytes(row_topic) != topic_id or int(row_partition) != wanted:
        return None
    row = _L1Row.unpack(value)
    if row.node_id != NOBODY and row.expires_ms > now_ms:
        return None
    if not row.due(now_ms, limits, int(wait_ms * JOIN_WAIT_SHARE)):
        return None
    if _behind_level_zero(tr, sub, topic_id, int(row_partition), row.first_offset, records):
        return None
    run = _level_one_run(
        tr, sub, topic_id, int(row_partition), row.first_offset, limits, span, records
    )
    if len({e.object_key for e in run.entries}) < 2:
        return None  # left to a plan of its own
    runs = [member[4] for member in group] + [run]
    total_bytes = sum(e.length for r in runs for e in r.entries)
    total_entries = sum(len(r.entries) for r in runs)
    objects = {e.object_key for r in runs for e in r.entries}
    if (
        total_bytes > limits.max_bytes
        or total_entries > limits.max_entries
        or len(objects) > limits.l2_max_inputs
    ):
        return None
    return row_key, row, topic_id, int(row_partition), run


# -- output -------------------------------------------------------------------------------


def output_entries(
    plan: Plan, object_key: str, chunk_starts: Sequence[int], entry_bytes: int
) -> list[JobEntry]:
    """The entries of a job's output object.

    The object holds one chunk per partition, in `plan.partitions()` order, starting at
    `chunk_starts`: the bytes of that partition's input entries back to back in offset
    order. Consecutive input entries (by offset) become one entry while it holds at most
    entry_bytes (an input entry larger than that stays whole).
    """
    out: list[JobEntry] = []
    partitions = plan.partitions()
    if len(chunk_starts) != len(partitions):
        raise ValueError(f"{len(chunk_starts)} chunks for {len(partitions)} partitions")
    for (topic_id, partition, entries), position in zip(partitions, chunk_starts, strict=True):
        for group in _runs(entries, entry_bytes):
            length = sum(e.length for e in group)
            entry = ChunkEntry(
                object_key,
                position,
                length,
                group[0].base_offset,
                group[-1].last_offset,
                sum(e.batch_count for e in group),
                max(e.max_timestamp for e in group),
            )
            out.append(JobEntry(topic_id, partition, entry))
            position += length
    return out


def _runs(entries: list[ChunkEntry], entry_bytes: int) -> list[list[ChunkEntry]]:
    """Entries (in offset order) in groups of consecutive offsets, each group at most
    entry_bytes (or one entry, larger)."""
    groups: list[list[ChunkEntry]] = []
    size = 0
    for entry in entries:
        if (
            groups
            and entry.base_offset == groups[-1][-1].last_offset + 1
            and size + entry.length <= entry_bytes
        ):
            groups[-1].append(entry)
            size += entry.length
        else:
            groups.append([entry])
            size = entry.length
    return groups


def _grouped(entries: Sequence[JobEntry]) -> list[tuple[bytes, int, list[JobEntry]]]:
    """Job entries in (topic, partition) order, grouped by partition."""
    out: list[tuple[bytes, int, list[JobEntry]]] = []
    for e in entries:
        if not out or (out[-1][0], out[-1][1]) != (e.topic_id, e.partition):
            out.append((e.topic_id, e.partition, []))
        out[-1][2].append(e)
    return out


def _check_output(plan: Plan, outputs: Sequence[JobEntry]) -> None:
    """The output must hold exactly the inputs' offsets and bytes, partition by partition."""

    def summary(entries: Sequence[JobEntry]) -> dict[tuple[bytes, int], tuple[int, int, int]]:
        counts: dict[tuple[bytes, int], tuple[int, int, int]] = {}
        for topic_id, partition, group in _grouped(entries):
            old = counts.get((topic_id, partition), (0, 0, 0))
            counts[(topic_id, partition)] = (
                old[0] + sum(e.entry.length for e in group),
                old[1] + sum(e.entry.last_offset - e.entry.base_offset + 1 for e in group),
                old[2] + sum(e.entry.batch_count for e in group),
            )
        return counts

    if summary(plan.entries) != summary(outputs):
        raise ValueError("a compaction's output entries do not hold its inputs")


# -- commit -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PartitionCheck:
    """What a commit compares and clears of one partition's input entries, as stored."""

    topic_id: bytes
    partition: int
    begin: bytes  # the CHUNK key of its first input entry
    end: bytes  # just past the CHUNK key of its last
    expected: dict[bytes, bytes]  # each input entry's CHUNK key and value
    entries: list[ChunkEntry]


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """A job's commit with everything that does not read the store worked out: the
    output checked against the plan, the keys and values the commit compares and
    writes. Built outside the transaction (`prepare_commit`), so that a store with one
    writer at a time (SQLite) holds its lock only for the reads and writes themselves."""

    plan: Plan
    object_key: str
    object_size: int
    outputs: tuple[JobEntry, ...]
    checks: tuple[_PartitionCheck, ...]
    rows: tuple[tuple[bytes, bytes], ...]  # the outputs' CHUNK and OBJECT_CHUNK keys, values
    unreferenced: tuple[tuple[str, int], ...]  # each input object, and the entries it loses
    # The inputs' copies in the reverse index, cleared by key or, of objects a job takes
    # whole (level 1), by range.
    reverse_keys: tuple[bytes, ...]
    reverse_ranges: tuple[tuple[bytes, bytes], ...]


def prepare_commit(
    sub: keys.Subspace, plan: Plan, object_key: str, object_size: int, outputs: Sequence[JobEntry]
) -> PreparedCommit:
    """Check that the outputs hold the inputs (ValueError if not) and work out the
    commit's keys and values; reads nothing, so it runs before the transaction."""
    _check_output(plan, outputs)
    checks = []
    for topic_id, partition, entries in _grouped(plan.entries):
        prefix = sub.key(keys.CHUNK, topic_id, partition)
        expected = {
            prefix + keys.pack_tail(e.entry.last_offset): e.value or entry_value(e.entry)
            for e in entries
        }
        begin = prefix + keys.pack_tail(entries[0].entry.last_offset)
        end = prefix + keys.pack_tail(entries[-1].entry.last_offset) + b"\x00"
        checks.append(
            _PartitionCheck(topic_id, partition, begin, end, expected, [e.entry for e in entries])
        )
    rows = tuple(row for e in outputs for row in entry_rows(sub, e.topic_id, e.partition, e.entry))
    unreferenced = tuple(Counter(e.entry.object_key for e in plan.entries).items())
    if plan.level == L1:  # it takes every entry of its inputs: their reverse index goes whole
        reverse_keys: tuple[bytes, ...] = ()
        reverse_ranges = tuple(reverse_index_range(sub, key) for key, _count in unreferenced)
    else:
        reverse_keys = tuple(
            entry_keys(sub, e.topic_id, e.partition, e.entry)[1] for e in plan.entries
        )
        reverse_ranges = ()
    return PreparedCommit(
        plan,
        object_key,
        object_size,
        tuple(outputs),
        tuple(checks),
        rows,
        unreferenced,
        reverse_keys,
        reverse_ranges,
    )


def _changed(
    tr: ReadTransaction, sub: keys.Subspace, prepared: PreparedCommit
) -> tuple[str | None, set[tuple[bytes, int]]]:
    """Why the plan no longer holds (None: every input entry is as it read it), and the
    partitions whose input entries are all the entries between their first and last."""
    topics: dict[bytes, bool] = {}
    alone: set[tuple[bytes, int]] = set()
    # Every partition's range in one read (a job holds at most max_entries entries).
    stored = tr.get_ranges([(check.begin, check.end) for check in prepared.checks])
    for check, pairs in zip(prepared.checks, stored, strict=True):
        if not _topic_exists(tr, sub, topics, check.topic_id):
            return f"topic {check.topic_id.hex()} was deleted", alone
        # Compared as stored, without decoding (thousands of entries, a commit's time).
        found = dict(pairs)
        if found == check.expected:  # these entries, and none between them
            alone.add((check.topic_id, check.partition))
            continue
        for (key, value), entry in zip(check.expected.items(), check.entries, strict=True):
            if found.get(key) != value:
                reason = (
                    f"the entry of offsets {entry.base_offset}-{entry.last_offset} of "
                    f"partition {check.partition} changed"
                )
                return reason, alone
    return None, alone


def release(tr: Transaction, sub: keys.Subspace, plan: Plan, node_id: int) -> None:
    """Give up the plan's claims (a job that failed or was dropped): its inputs may be
    planned again at once."""
    l0_keys = [sub.key(keys.L0_OBJECT, created, key) for created, key in plan.queued]
    l1_keys = [sub.key(keys.L1_PARTITION, t, p) for t, p, _arrived_ms in plan.level_one_rows]
    found = tr.get_many(l0_keys + l1_keys)
    writes = []
    for row_key, raw in zip(l0_keys, found[: len(l0_keys)], strict=True):
        if raw is not None and keys.unpack_value(raw)[:1] == (node_id,):
            writes.append((row_key, keys.pack_value(())))
    for row_key, raw in zip(l1_keys, found[len(l0_keys) :], strict=True):
        if raw is not None:
            row = _L1Row.unpack(raw)
            if row.node_id == node_id:
                writes.append((row_key, row.unclaimed().pack()))
    tr.set_many(writes)


def discard_output(
    tr: Transaction, sub: keys.Subspace, object_key: str, size: int, level: int, now_ms: int
) -> None:
    """An uploaded output that will never be committed: record it dead and due for
    deletion now (nothing ever named it), rather than leave it to the orphan sweep."""
    put_object(tr, sub, object_key, ObjectRecord(size, 0, now_ms, now_ms, level))
    tr.set(sub.key(keys.DEAD_OBJECT, now_ms, object_key), keys.pack_value((size,)))
    tally(tr, sub, "objects", 1)
    tally(tr, sub, "object_bytes", size)


def commit_job(
    tr: Transaction,
    sub: keys.Subspace,
    plan: Plan,
    node_id: int,
    object_key: str,
    object_size: int,
    outputs: Sequence[JobEntry],
    now_ms: int,
    delete_delay_ms: int,
) -> JobResult:
    """Re-point the plan's entries to the uploaded output, if none of them changed
    (`prepare_commit` then `commit_prepared`, in the transaction)."""
    prepared = prepare_commit(sub, plan, object_key, object_size, outputs)
    return commit_prepared(tr, sub, prepared, node_id, now_ms, delete_delay_ms)


def commit_prepared(
    tr: Transaction,
    sub: keys.Subspace,
    prepared: PreparedCommit,
    node_id: int,
    now_ms: int,
    delete_delay_ms: int,
) -> JobResult:
    """Re-point the prepared commit's entries to its output, if none of them changed."""
    plan, object_key, object_size = prepared.plan, prepared.object_key, prepared.object_size
    reason, alone = _changed(tr, sub, prepared)
    if reason is not None:
        discard_output(tr, sub, object_key, object_size, plan.level, now_ms)
        release(tr, sub, plan, node_id)
        return JobResult(False, reason)
    if plan.level != L2:
        # Level-0 inputs leave the queue with their last entry (unreference_many below);
        # the claims are given up first, so that every read of the commit comes before
        # its writes to the same keys (what a commit worked out on a snapshot needs).
        release(tr, sub, plan, node_id)
    _clear_inputs(tr, prepared, alone)
    tr.set_many(prepared.rows)
    unreference_many(tr, sub, prepared.unreferenced, now_ms, delete_delay_ms)
    put_object(
        tr,
        sub,
        object_key,
        ObjectRecord(object_size, len(prepared.outputs), now_ms, None, plan.level),
    )
    tally(tr, sub, "objects", 1)
    tally(tr, sub, "object_bytes", object_size)
    tally(tr, sub, "chunk_entries", len(prepared.outputs) - len(plan.entries))
    if plan.level == L1:
        grown = {
            (c.topic_id, c.partition): (
                sum(e.length for e in c.entries),
                1,
                c.entries[0].base_offset,
            )
            for c in prepared.checks
        }
        _add_level_one(tr, sub, grown, now_ms)
    if plan.level == L2:
        _took_level_one(tr, sub, prepared, node_id)
    return JobResult(True)


def _clear_inputs(tr: Transaction, prepared: PreparedCommit, alone: set[tuple[bytes, int]]) -> None:
    """Clear the input entries and their copies in the reverse index, with one range
    where that is exact (the entries of a partition with none between them, the reverse
    index of objects taken whole); single keys otherwise."""
    ranges = list(prepared.reverse_ranges)
    single = list(prepared.reverse_keys)
    for check in prepared.checks:
        if (check.topic_id, check.partition) in alone:
            ranges.append((check.begin, check.end))
        else:
            single += check.expected
    tr.clear_ranges(ranges)
    tr.clear_many(single)


def _add_level_one(
    tr: Transaction,
    sub: keys.Subspace,
    grown: Mapping[tuple[bytes, int], tuple[int, int, int]],
    now_ms: int,
) -> None:
    """Level-1 objects written (or promoted) at now_ms hold entries of these partitions:
    per (topic id, partition), their bytes, how many objects and the first offset."""
    items = list(grown.items())
    row_keys = [sub.key(keys.L1_PARTITION, t, p) for (t, p), _grown in items]
    writes = []
    for ((_t, _p), (added, objects, first)), row_key, raw in zip(
        items, row_keys, tr.get_many(row_keys), strict=True
    ):
        if raw is None:
            row = _L1Row(added, objects, first, oldest_ms=now_ms)
        else:
            old = _L1Row.unpack(raw)  # its claim and its oldest data stay
            row = replace(
                old,
                size=old.size + added,
                objects=old.objects + objects,
                first_offset=min(old.first_offset, first),
            )
        writes.append((row_key, row.pack()))
    tr.set_many(writes)


def _took_level_one(
    tr: Transaction, sub: keys.Subspace, prepared: PreparedCommit, node_id: int
) -> None:
    """A level-2 job committed: each of its partitions' rows loses the run it took, and
    the rows it claimed are unclaimed (what `release` does for a plan, in the same read
    and write)."""
    runs = {(c.topic_id, c.partition): c.entries for c in prepared.checks}
    claimed = prepared.plan.level_one_rows
    row_keys = [sub.key(keys.L1_PARTITION, t, p) for t, p, _arrived_ms in claimed]
    writes, clears = [], []
    for (topic_id, partition, arrived_ms), row_key, raw in zip(
        claimed, row_keys, tr.get_many(row_keys), strict=True
    ):
        if raw is None:
            continue
        old = _L1Row.unpack(raw)
        entries = runs.get((topic_id, partition))
        if not entries:
            if old.node_id == node_id:
                writes.append((row_key, old.unclaimed().pack()))
            continue
        first, oldest = old.first_offset, old.oldest_ms
        if first >= entries[0].base_offset:  # no level-1 entries before the run came
            first = entries[-1].last_offset + 1
            # What is left came to level 1 at arrived_ms or after (Plan.level_one_rows).
            oldest = max(oldest, arrived_ms)
        row = _L1Row(  # unclaimed
            old.size - sum(e.length for e in entries),
            old.objects - len({e.object_key for e in entries}),
            first,
            oldest_ms=oldest,
        )
        if row.size <= 0 or row.objects <= 0:
            # The counts are a guide (a job that takes part of an object's entries of the
            # partition counts the object as gone, and the next job again): the entry
            # after the run says whether level 1 still holds any of the partition.
            found = read_chunks(tr, sub, topic_id, partition, entries[-1].last_offset + 1, 1)
            after = found[0] if found else None
            if after is None or not _in_level_one(tr, sub, after, prepared.plan):
                clears.append(row_key)
                continue
            row = replace(row, size=max(row.size, after.length), objects=max(row.objects, 1))
        writes.append((row_key, row.pack()))
    tr.set_many(writes)
    tr.clear_many(clears)


def _in_level_one(tr: ReadTransaction, sub: keys.Subspace, entry: ChunkEntry, plan: Plan) -> bool:
    """Whether the entry is in a level-1 object: one of the plan's inputs (each of level
    1, and written by the commit, so not read again), or one whose record says so."""
    if any(e.entry.object_key == entry.object_key for e in plan.entries):
        return True
    record = get_objects(tr, sub, [entry.object_key])[0]
    return record is not None and record.level == L1 and record.dead_since_ms is None
