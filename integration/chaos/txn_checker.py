"""What the transactional clients of a chaos run did against what read_committed and
read_uncommitted read-backs returned; in the spirit of Jepsen's Elle for Kafka.

Pure functions, no I/O. Every record a client writes names, in its value, its producer
(a transactional id's logical writer), the producer's transaction number and the
record's sequence number in that transaction, and, for the output of a
consume-transform-produce stage, the input record it was made from (`encode_value`).

The inputs, per topic:

- `Transaction`s: each transaction a producer began, with the records it handed to
  produce() (sequence number, partition) and its outcome as the client saw it:
  COMMITTED (commit_transaction returned), ABORTED (abort_transaction returned, or the
  transaction could not commit: its producer never asked to commit it, or was fenced
  first), or UNKNOWN (a commit was asked and the client never learnt its fate);
- the records of a read_committed and of a read_uncommitted read-back, each from the
  log start to the end offset of its isolation level (the last stable offset, the high
  watermark), in the order each partition returned them;
- per partition, (last stable offset, high watermark) once every client stopped.

What `check_topic` reports (anomalies; each count must be 0):

- incomplete_commit: a committed transaction some of whose records read_committed lacks;
- partial: a transaction of unknown outcome of which read_committed has some records
  but not all (a transaction is whole or absent);
- aborted_visible: read_committed has a record of an aborted transaction;
- duplicates: read_committed has one record (producer, transaction, sequence) twice;
- out_of_order: in a partition, a producer's records are not in the order it wrote them
  (transaction number, then sequence number);
- misplaced: a record read in another partition than the one it was produced to;
- unexpected: a record no client wrote (or in a transaction the clients never logged);
- committed_not_in_uncommitted: read_uncommitted lacks a record of a committed
  transaction;
- isolation_mismatch: read_committed and read_uncommitted disagree on the record at an
  offset;
- open_at_end: a partition whose last stable offset is below its high watermark after
  every producer stopped (a transaction left open: it hides everything after it);
- refused_abort: a transaction whose abort the coordinator refused with
  INVALID_TXN_STATE (fatal for the client) that is neither absent from the log nor
  committed whole. Kafka's transaction version 1 refuses an abort so when the
  transactional id has no transaction open: its AddPartitionsToTxn was lost with its
  coordinator after the previous transaction committed (nothing of it can be in the
  log), or it is the committed transaction's own (it is then whole). Anything else
  means the coordinator refused to abort a transaction that was open.

What `check_processing` reports of a consume-transform-produce stage that read the
input with read_committed and committed its consumed offsets in its transactions (each
output record names its input record): an input record below the group's committed
offset that has no output (lost) or more than one (duplicated); an output whose input
is at or past the committed offset (its offsets were not committed with it: ahead); an
output whose input read_committed does not have (foreign).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

SEPARATOR = b":"
NO_SOURCE = b"-"

Position = tuple[int, int]  # (partition, offset)


class Outcome(StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Tag:
    """Who wrote a record: producer, its transaction number, the record's sequence in it;
    `source`: the input record it was made from, for a transform's output."""

    producer: str
    txn: int
    seq: int
    source: Position | None = None


def encode_value(tag: Tag, size: int = 0) -> bytes:
    """A record value carrying `tag`, padded with dots to `size` bytes."""
    source = NO_SOURCE if tag.source is None else b"%d/%d" % tag.source
    value = SEPARATOR.join((tag.producer.encode(), b"%d" % tag.txn, b"%d" % tag.seq, source, b""))
    return value + b"." * max(0, size - len(value))


def decode_value(value: bytes | None) -> Tag | None:
    """The tag of a value made by `encode_value`, else None."""
    if not value:
        return None
    parts = value.split(SEPARATOR, 4)
    if len(parts) != 5 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    source: Position | None = None
    if parts[3] != NO_SOURCE:
        partition, _slash, offset = parts[3].partition(b"/")
        if not partition.isdigit() or not offset.isdigit():
            return None
        source = (int(partition), int(offset))
    try:
        return Tag(parts[0].decode(), int(parts[1]), int(parts[2]), source)
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class Transaction:
    producer: str
    txn: int
    outcome: Outcome
    records: tuple[tuple[int, int], ...]  # (sequence, partition) of each record produced


@dataclass(frozen=True, slots=True)
class Read:
    partition: int
    offset: int
    tag: Tag | None  # None: a value no client of the run wrote

    @classmethod
    def from_value(cls, partition: int, offset: int, value: bytes | None) -> Read:
        return cls(partition, offset, decode_value(value))


@dataclass(frozen=True, slots=True)
class Incomplete:
    producer: str
    txn: int
    outcome: Outcome
    visible: int  # records of it read_committed has
    missing: tuple[tuple[int, int], ...]  # (sequence, partition) it lacks


@dataclass(frozen=True, slots=True)
class Duplicate:
    producer: str
    txn: int
    seq: int
    at: tuple[Position, ...]


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    producer: str
    partition: int
    offset: int
    written: tuple[int, int]  # (transaction, sequence) of the record at `offset`
    after: tuple[int, int]  # what an earlier offset of the partition already had
    after_offset: int


@dataclass(frozen=True, slots=True)
class Misplaced:
    producer: str
    txn: int
    seq: int
    produced_to: int
    read_at: Position


@dataclass(frozen=True, slots=True)
class OpenAtEnd:
    partition: int
    last_stable_offset: int
    high_watermark: int


@dataclass
class TopicResult:
    transactions: dict[str, int] = field(default_factory=dict)  # outcome -> how many
    unknown_resolved: dict[str, int] = field(default_factory=dict)  # "committed"/"aborted"
    read_committed: int = 0
    read_uncommitted: int = 0
    incomplete_commit: list[Incomplete] = field(default_factory=list)
    partial: list[Incomplete] = field(default_factory=list)
    aborted_visible: list[Read] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    out_of_order: list[OutOfOrder] = field(default_factory=list)
    misplaced: list[Misplaced] = field(default_factory=list)
    unexpected: list[Read] = field(default_factory=list)
    committed_not_in_uncommitted: list[Tag] = field(default_factory=list)
    isolation_mismatch: list[Position] = field(default_factory=list)
    open_at_end: list[OpenAtEnd] = field(default_factory=list)
    refused_abort: list[Incomplete] = field(default_factory=list)
    refused_aborts_explained: int = 0  # absent from the log, or committed whole

    KINDS = (
        "incomplete_commit",
        "partial",
        "aborted_visible",
        "duplicates",
        "out_of_order",
        "misplaced",
        "unexpected",
        "committed_not_in_uncommitted",
        "isolation_mismatch",
        "open_at_end",
        "refused_abort",
    )

    def anomalies(self) -> dict[str, int]:
        """Anomaly kind -> how many; every count must be 0."""
        return {kind: len(getattr(self, kind)) for kind in self.KINDS}

    @property
    def ok(self) -> bool:
        return not any(self.anomalies().values())

    def summary(self, examples: int = 10) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "transactions": self.transactions,
            "unknown_resolved": self.unknown_resolved,
            "read_committed": self.read_committed,
            "read_uncommitted": self.read_uncommitted,
            "refused_aborts_explained": self.refused_aborts_explained,
            "anomalies": self.anomalies(),
            "examples": {
                kind: [_plain(item) for item in getattr(self, kind)[:examples]]
                for kind in self.KINDS
            },
        }


def _plain(item: Any) -> Any:
    if hasattr(item, "__slots__"):
        return {name: _plain(getattr(item, name)) for name in item.__slots__}
    if isinstance(item, tuple):
        return [_plain(x) for x in item]
    return item


def check_topic(
    transactions: Iterable[Transaction],
    committed: Iterable[Read],
    uncommitted: Iterable[Read],
    ends: Mapping[int, tuple[int, int]],
    refused_aborts: Iterable[tuple[str, int]] = (),
) -> TopicResult:
    """Check one topic's read-backs against its producers' transactions.

    `committed`, `uncommitted`: the read_committed and read_uncommitted read-backs, in
    the order each partition returned them; `ends`: partition -> (last stable offset,
    high watermark) once every producer stopped; `refused_aborts`: (producer,
    transaction) whose abort was refused with INVALID_TXN_STATE.
    """
    txns = {(t.producer, t.txn): t for t in transactions}
    committed = list(committed)
    uncommitted = list(uncommitted)
    result = TopicResult(read_committed=len(committed), read_uncommitted=len(uncommitted))
    outcomes: dict[str, int] = defaultdict(int)
    for t in txns.values():
        outcomes[t.outcome.value] += 1
    result.transactions = dict(outcomes)

    # Where each record of read_committed is; the unexpected and misplaced on the way.
    seen: dict[tuple[str, int, int], list[Position]] = defaultdict(list)
    known_reads: list[Read] = []  # the records some transaction of the run wrote
    for read in committed:
        tag = read.tag
        known = None if tag is None else txns.get((tag.producer, tag.txn))
        if tag is None or known is None:
            result.unexpected.append(read)
            continue
        produced_to = dict(known.records).get(tag.seq)
        if produced_to is None:
            result.unexpected.append(read)
            continue
        if produced_to != read.partition:
            result.misplaced.append(
                Misplaced(
                    tag.producer, tag.txn, tag.seq, produced_to, (read.partition, read.offset)
                )
            )
        seen[(tag.producer, tag.txn, tag.seq)].append((read.partition, read.offset))
        known_reads.append(read)
        if known.outcome == Outcome.ABORTED:
            result.aborted_visible.append(read)
    for (producer, txn, seq), positions in seen.items():
        if len(positions) > 1:
            result.duplicates.append(Duplicate(producer, txn, seq, tuple(positions)))

    # Each transaction whole or absent; committed ones whole.
    resolved: dict[str, int] = defaultdict(int)
    for t in txns.values():
        if t.outcome == Outcome.ABORTED or not t.records:
            continue
        missing = tuple(
            (seq, partition) for seq, partition in t.records if (t.producer, t.txn, seq) not in seen
        )
        visible = len(t.records) - len(missing)
        if t.outcome == Outcome.COMMITTED:
            if missing:
                result.incomplete_commit.append(
                    Incomplete(t.producer, t.txn, t.outcome, visible, missing)
                )
        elif missing and visible:
            result.partial.append(Incomplete(t.producer, t.txn, t.outcome, visible, missing))
        else:
            resolved["committed" if visible else "aborted"] += 1
    result.unknown_resolved = dict(resolved)

    _check_order(known_reads, result)

    # read_uncommitted: every committed record, and the same records where both read.
    by_position = {(r.partition, r.offset): r for r in uncommitted}
    in_uncommitted = {
        (r.tag.producer, r.tag.txn, r.tag.seq) for r in uncommitted if r.tag is not None
    }
    for t in txns.values():
        if t.outcome != Outcome.COMMITTED:
            continue
        for seq, _partition in t.records:
            if (t.producer, t.txn, seq) not in in_uncommitted:
                result.committed_not_in_uncommitted.append(Tag(t.producer, t.txn, seq))
    for read in committed:
        other = by_position.get((read.partition, read.offset))
        if other is None or other.tag != read.tag:
            result.isolation_mismatch.append((read.partition, read.offset))

    for partition, (stable, high) in sorted(ends.items()):
        if stable < high:
            result.open_at_end.append(OpenAtEnd(partition, stable, high))

    for producer, txn in refused_aborts:
        t = txns.get((producer, txn))
        records = () if t is None else t.records
        in_log = [seq for seq, _p in records if (producer, txn, seq) in in_uncommitted]
        missing = tuple((seq, p) for seq, p in records if (producer, txn, seq) not in seen)
        if not in_log or not missing:
            result.refused_aborts_explained += 1
        else:
            outcome = Outcome.UNKNOWN if t is None else t.outcome
            visible = len(records) - len(missing)
            result.refused_abort.append(Incomplete(producer, txn, outcome, visible, missing))
    return result


def _check_order(reads: list[Read], result: TopicResult) -> None:
    """In each partition, each producer's records in the order it wrote them."""
    by_partition: dict[int, list[Read]] = defaultdict(list)
    for read in reads:
        by_partition[read.partition].append(read)
    for partition, reads in by_partition.items():
        last: dict[str, tuple[tuple[int, int], int]] = {}  # producer -> (written, offset)
        for read in sorted(reads, key=lambda r: r.offset):
            if read.tag is None:
                continue
            written = (read.tag.txn, read.tag.seq)
            previous = last.get(read.tag.producer)
            if previous is not None and written <= previous[0]:
                if written != previous[0]:  # the same record twice is a duplicate, not this
                    result.out_of_order.append(
                        OutOfOrder(
                            read.tag.producer,
                            partition,
                            read.offset,
                            written,
                            previous[0],
                            previous[1],
                        )
                    )
                continue  # keep the highest seen: one record out of place, one anomaly
            last[read.tag.producer] = (written, read.offset)


# -- consume-transform-produce ----------------------------------------------------------


@dataclass
class ProcessingResult:
    inputs_below_committed: int = 0
    outputs: int = 0
    lost: list[Position] = field(default_factory=list)
    duplicated: list[tuple[Position, tuple[Position, ...]]] = field(default_factory=list)
    ahead: list[Position] = field(default_factory=list)  # outputs' inputs
    foreign: list[Read] = field(default_factory=list)

    KINDS = ("lost", "duplicated", "ahead", "foreign")

    def anomalies(self) -> dict[str, int]:
        return {kind: len(getattr(self, kind)) for kind in self.KINDS}

    @property
    def ok(self) -> bool:
        return not any(self.anomalies().values())

    def summary(self, examples: int = 10) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "inputs_below_committed": self.inputs_below_committed,
            "outputs": self.outputs,
            "anomalies": self.anomalies(),
            "examples": {
                kind: [_plain(item) for item in getattr(self, kind)[:examples]]
                for kind in self.KINDS
            },
        }


def check_processing(
    inputs: Iterable[Read],
    outputs: Iterable[Read],
    committed_offsets: Mapping[int, int],
) -> ProcessingResult:
    """Exactly-once processing: `inputs` the read_committed read-back of the input topic,
    `outputs` that of the output topic, `committed_offsets` partition -> the group's
    committed offset (the next input to process) once the stage stopped."""
    inputs = list(inputs)
    outputs = list(outputs)
    result = ProcessingResult(outputs=len(outputs))
    input_at = {(r.partition, r.offset) for r in inputs}
    made_from: dict[Position, list[Position]] = defaultdict(list)
    for out in outputs:
        source = None if out.tag is None else out.tag.source
        if source is None or source not in input_at:
            result.foreign.append(out)
            continue
        made_from[source].append((out.partition, out.offset))
        if source[1] >= committed_offsets.get(source[0], 0):
            result.ahead.append(source)
    for read in sorted(inputs, key=lambda r: (r.partition, r.offset)):
        position = (read.partition, read.offset)
        if read.offset >= committed_offsets.get(read.partition, 0):
            continue
        result.inputs_below_committed += 1
        made = made_from.get(position, [])
        if not made:
            result.lost.append(position)
        elif len(made) > 1:
            result.duplicated.append((position, tuple(made)))
    return result
