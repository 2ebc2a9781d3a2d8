"""What a chaos run's producers were told against what a full read-back returned.

Pure functions, no I/O. Every record a harness writes carries its producer's name and
that producer's sequence number in its value (`encode_value`), so a record read back
says who wrote it and which of its records it is. The inputs:

- `Ack`s: each delivery report a producer got with no error: (producer, sequence) is at
  (partition, offset);
- `Record`s: every record of the topic read back from each partition's log start offset
  to its end offset, in the order each partition returned them;
- the (log start offset, end offset) each partition reported for that read;
- which producers were idempotent.

What `check` reports (plain topics only: no transaction markers, no compaction, so the
offsets of data records are consecutive):

- missing: an acknowledged record that is not at the offset its acknowledgement gave
  (it may be elsewhere, or nowhere);
- duplicates of an idempotent producer: one (producer, sequence) read more than once;
- duplicates of a producer without idempotence: the same, allowed by Kafka's semantics
  (a retry of a batch whose answer was lost), counted apart and not an anomaly;
- offsets not dense: an offset of [start, end) that was not read (a gap), or one read
  twice, out of order or outside that range;
- order: within a partition, a producer's sequence numbers must increase with the
  offset (its first copy of each; idempotence, or one request in flight, keeps order);
- unrecognised: a record whose value no harness producer wrote.

Records read but never acknowledged (their delivery failed, or its report never came)
are counted, not anomalies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SEPARATOR = b":"


def encode_value(producer: str, seq: int, size: int = 0) -> bytes:
    """A record value naming its producer and sequence number, padded to `size` bytes."""
    value = producer.encode() + SEPARATOR + str(seq).encode() + SEPARATOR
    return value + b"." * max(0, size - len(value))


def decode_value(value: bytes | None) -> tuple[str, int] | None:
    """(producer, sequence) of a value made by `encode_value`, else None."""
    if not value:
        return None
    parts = value.split(SEPARATOR, 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
        return None
    try:
        return parts[0].decode(), int(parts[1])
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class Ack:
    producer: str
    seq: int
    partition: int
    offset: int | None  # None: the answer named no offset (a lightning topic)


@dataclass(frozen=True, slots=True)
class Record:
    partition: int
    offset: int
    producer: str | None  # None: a value no harness producer wrote
    seq: int | None

    @classmethod
    def from_value(cls, partition: int, offset: int, value: bytes | None) -> Record:
        decoded = decode_value(value)
        if decoded is None:
            return cls(partition, offset, None, None)
        return cls(partition, offset, *decoded)


Position = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True, slots=True)
class Missing:
    ack: Ack
    found_at: tuple[Position, ...]  # where the record is instead (empty: nowhere)


@dataclass(frozen=True, slots=True)
class Duplicate:
    producer: str
    seq: int
    at: tuple[Position, ...]


@dataclass(frozen=True, slots=True)
class Gap:
    partition: int
    first: int  # the first offset not read
    last: int  # the last offset not read


@dataclass(frozen=True, slots=True)
class BadOffset:
    partition: int
    offset: int
    why: str  # "read twice", "out of order", "before the log start", "at or past the end"


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    producer: str
    partition: int
    offset: int
    seq: int
    previous_offset: int
    previous_seq: int


@dataclass
class Result:
    acknowledged: int = 0
    read: int = 0
    missing: list[Missing] = field(default_factory=list)
    idempotent_duplicates: list[Duplicate] = field(default_factory=list)
    other_duplicates: list[Duplicate] = field(default_factory=list)  # allowed
    gaps: list[Gap] = field(default_factory=list)
    bad_offsets: list[BadOffset] = field(default_factory=list)
    out_of_order: list[OutOfOrder] = field(default_factory=list)
    # allowed where asked (check's plain_order=False): a producer without idempotence
    other_out_of_order: list[OutOfOrder] = field(default_factory=list)
    unrecognised: list[Record] = field(default_factory=list)
    unacknowledged_read: int = 0  # allowed: read, but no acknowledgement came

    def anomalies(self) -> dict[str, int]:
        """Anomaly kind -> how many; every count must be 0."""
        return {
            "missing": len(self.missing),
            "idempotent_duplicates": len(self.idempotent_duplicates),
            "offsets_not_dense": len(self.gaps) + len(self.bad_offsets),
            "out_of_order": len(self.out_of_order),
            "unrecognised": len(self.unrecognised),
        }

    @property
    def ok(self) -> bool:
        return not any(self.anomalies().values())

    def summary(self, examples: int = 10) -> dict[str, Any]:
        """Counts, and the first `examples` of each kind, for a JSON report."""

        def some(items: list[Any]) -> list[Any]:
            return [_plain(item) for item in items[:examples]]

        return {
            "ok": self.ok,
            "acknowledged": self.acknowledged,
            "read": self.read,
            "anomalies": self.anomalies(),
            "missing_found_elsewhere": sum(1 for m in self.missing if m.found_at),
            "offsets_not_read": sum(g.last - g.first + 1 for g in self.gaps),
            "other_duplicates": len(self.other_duplicates),
            "other_out_of_order": len(self.other_out_of_order),
            "unacknowledged_read": self.unacknowledged_read,
            "examples": {
                "missing": some(self.missing),
                "idempotent_duplicates": some(self.idempotent_duplicates),
                "other_duplicates": some(self.other_duplicates),
                "gaps": some(self.gaps),
                "bad_offsets": some(self.bad_offsets),
                "out_of_order": some(self.out_of_order),
                "other_out_of_order": some(self.other_out_of_order),
                "unrecognised": some(self.unrecognised),
            },
        }


def _plain(item: Any) -> dict[str, Any]:
    out = {}
    for name in item.__slots__:
        value = getattr(item, name)
        out[name] = _plain(value) if hasattr(value, "__slots__") else value
    return out


def check(
    acks: Iterable[Ack],
    records: Iterable[Record],
    ranges: Mapping[int, tuple[int, int]],
    idempotent: Mapping[str, bool],
    plain_order: bool = True,
) -> Result:
    """Check a read-back against the acknowledgements.

    `records` in the order each partition returned them; `ranges`: partition ->
    (log start offset, end offset) of the read; `idempotent`: producer -> whether it
    was idempotent (a producer not named there counts as not idempotent).
    `plain_order=False`: a producer without idempotence's records out of order are
    counted apart and allowed (its client may reorder them across retries).
    """
    acks = list(acks)
    records = list(records)
    result = Result(acknowledged=len(acks), read=len(records))

    at: dict[Position, Record] = {}
    where: dict[tuple[str, int], list[Position]] = defaultdict(list)
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record)
        at.setdefault((record.partition, record.offset), record)
        if record.producer is None or record.seq is None:
            result.unrecognised.append(record)
        else:
            where[(record.producer, record.seq)].append((record.partition, record.offset))

    for ack in acks:
        if ack.offset is None:  # an acknowledgement without offset: anywhere in its partition
            found = any(p == ack.partition for p, _o in where.get((ack.producer, ack.seq), ()))
        else:
            there = at.get((ack.partition, ack.offset))
            found = there is not None and (there.producer, there.seq) == (ack.producer, ack.seq)
        if not found:
            result.missing.append(Missing(ack, tuple(where.get((ack.producer, ack.seq), ()))))

    acked = {(ack.producer, ack.seq) for ack in acks}
    for (producer, seq), positions in where.items():
        if (producer, seq) not in acked:
            result.unacknowledged_read += 1
        if len(positions) > 1:
            duplicate = Duplicate(producer, seq, tuple(positions))
            if idempotent.get(producer, False):
                result.idempotent_duplicates.append(duplicate)
            else:
                result.other_duplicates.append(duplicate)

    for partition in sorted(set(ranges) | set(by_partition)):
        start, end = ranges.get(partition, (0, 0))
        read = by_partition.get(partition, [])
        _check_dense(partition, start, end, read, result)
        _check_order(partition, read, result)
    if not plain_order:
        plain = [o for o in result.out_of_order if not idempotent.get(o.producer, False)]
        result.other_out_of_order = plain
        result.out_of_order = [o for o in result.out_of_order if o not in plain]
    return result


def _check_dense(partition: int, start: int, end: int, read: list[Record], result: Result) -> None:
    seen: set[int] = set()
    highest = start - 1
    for record in read:
        offset = record.offset
        if offset < start:
            result.bad_offsets.append(BadOffset(partition, offset, "before the log start"))
        elif offset >= end:
            result.bad_offsets.append(BadOffset(partition, offset, "at or past the end"))
        elif offset in seen:
            result.bad_offsets.append(BadOffset(partition, offset, "read twice"))
        else:
            if offset < highest:
                result.bad_offsets.append(BadOffset(partition, offset, "out of order"))
            seen.add(offset)
            highest = max(highest, offset)
    expected = start  # the first offset not yet accounted for
    for offset in sorted(seen):
        if offset > expected:
            result.gaps.append(Gap(partition, expected, offset - 1))
        expected = offset + 1
    if expected < end:
        result.gaps.append(Gap(partition, expected, end - 1))


def _check_order(partition: int, read: list[Record], result: Result) -> None:
    last: dict[str, tuple[int, int]] = {}  # producer -> (offset, seq) of its last record
    seen: set[tuple[str, int]] = set()
    for record in sorted(read, key=lambda r: r.offset):
        if record.producer is None or record.seq is None:
            continue
        key = (record.producer, record.seq)
        if key in seen:
            continue  # a later copy of a duplicate: counted as one
        seen.add(key)
        previous = last.get(record.producer)
        if previous is not None and record.seq < previous[1]:
            result.out_of_order.append(
                OutOfOrder(record.producer, partition, record.offset, record.seq, *previous)
            )
        # Keep the highest sequence seen, so one record out of place is one violation.
        if previous is None or record.seq > previous[1]:
            last[record.producer] = (record.offset, record.seq)
