"""The chaos checker (integration/chaos/checker.py) on hand-made runs: a clean one passes,
and each kind of anomaly is found, named and counted, with nothing else reported."""

from __future__ import annotations

import pytest

from integration.chaos.checker import (
    Ack,
    BadOffset,
    Duplicate,
    Gap,
    Missing,
    OutOfOrder,
    Record,
    check,
    decode_value,
    encode_value,
)

IDEMPOTENT = {"idem": True, "plain": False}


def clean_run() -> tuple[list[Ack], list[Record], dict[int, tuple[int, int]]]:
    """Two producers, two partitions, every record acknowledged where it was read."""
    writes = [
        (0, 0, "idem", 0),
        (0, 1, "plain", 0),
        (0, 2, "idem", 2),
        (0, 3, "plain", 2),
        (1, 0, "idem", 1),
        (1, 1, "plain", 1),
        (1, 2, "idem", 3),
        (1, 3, "plain", 3),
    ]
    acks = [Ack(producer, seq, p, o) for p, o, producer, seq in writes]
    records = [Record(p, o, producer, seq) for p, o, producer, seq in writes]
    return acks, records, {0: (0, 4), 1: (0, 4)}


def only(result, kind: str) -> None:
    """`kind` is the one anomaly the result counts."""
    anomalies = result.anomalies()
    assert anomalies[kind] > 0, anomalies
    assert {k: v for k, v in anomalies.items() if v} == {kind: anomalies[kind]}
    assert not result.ok


def test_a_clean_run_passes() -> None:
    acks, records, ranges = clean_run()
    result = check(acks, records, ranges, IDEMPOTENT)
    assert result.ok
    assert set(result.anomalies().values()) == {0}
    summary = result.summary()
    assert summary["ok"] and summary["acknowledged"] == 8 and summary["read"] == 8
    assert summary["other_duplicates"] == 0 and summary["unacknowledged_read"] == 0


def test_values_name_their_producer_and_sequence() -> None:
    value = encode_value("plain3", 1234, size=100)
    assert len(value) == 100
    assert decode_value(value) == ("plain3", 1234)
    assert decode_value(encode_value("idem0", 7)) == ("idem0", 7)
    for foreign in (None, b"", b"hello", b"x:y:", b":1:"):
        assert decode_value(foreign) is None
    assert Record.from_value(2, 5, b"junk") == Record(2, 5, None, None)


def test_an_acknowledged_record_absent_from_the_log_is_missing() -> None:
    acks, records, ranges = clean_run()
    # The broker acknowledged idem:4 at (1, 4) and never wrote it.
    acks.append(Ack("idem", 4, 1, 4))
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "missing")
    assert result.missing == [Missing(Ack("idem", 4, 1, 4), ())]


def test_an_acknowledged_offset_taken_by_another_record_is_missing() -> None:
    """A lost batch whose offset the next record took: no gap, only the loss."""
    acks, records, ranges = clean_run()
    acks.append(Ack("plain", 4, 0, 4))
    acks.append(Ack("plain", 5, 0, 4))
    records.append(Record(0, 4, "plain", 5))
    ranges[0] = (0, 5)
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "missing")
    assert result.missing == [Missing(Ack("plain", 4, 0, 4), ())]


def test_a_record_elsewhere_than_its_acknowledgement_said_is_missing_and_found() -> None:
    acks, records, ranges = clean_run()
    acks[0] = Ack("idem", 0, 0, 3)  # said offset 3; it is at 0
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "missing")
    assert result.missing[0].found_at == ((0, 0),)
    assert result.summary()["missing_found_elsewhere"] == 1


def test_an_idempotent_producers_record_read_twice_is_a_duplicate() -> None:
    acks, records, ranges = clean_run()
    records.append(Record(1, 4, "idem", 3))
    ranges[1] = (0, 5)
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "idempotent_duplicates")
    assert result.idempotent_duplicates == [Duplicate("idem", 3, ((1, 2), (1, 4)))]


def test_duplicates_without_idempotence_are_counted_apart_and_allowed() -> None:
    acks, records, ranges = clean_run()
    # A retry of plain:3 whose first answer was lost, acknowledged at its second copy.
    acks[-1] = Ack("plain", 3, 1, 4)
    records.append(Record(1, 4, "plain", 3))
    ranges[1] = (0, 5)
    result = check(acks, records, ranges, IDEMPOTENT)
    assert result.ok, result.anomalies()
    assert result.other_duplicates == [Duplicate("plain", 3, ((1, 3), (1, 4)))]
    assert result.summary()["other_duplicates"] == 1


def test_a_producer_not_named_idempotent_counts_as_not() -> None:
    acks, records, ranges = clean_run()
    records.append(Record(1, 4, "idem", 3))
    ranges[1] = (0, 5)
    result = check(acks, records, ranges, {})
    assert result.ok and len(result.other_duplicates) == 1


@pytest.mark.parametrize(
    ("drop", "gap"),
    [(0, Gap(0, 0, 0)), (2, Gap(0, 2, 2)), (3, Gap(0, 3, 3))],
    ids=["first", "middle", "last"],
)
def test_an_offset_not_read_between_start_and_end_is_a_gap(drop: int, gap: Gap) -> None:
    _acks, records, ranges = clean_run()
    records = [r for r in records if (r.partition, r.offset) != (0, drop)]
    acks = [Ack(r.producer, r.seq, r.partition, r.offset) for r in records]
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "offsets_not_dense")
    assert result.gaps == [gap]
    assert result.summary()["offsets_not_read"] == 1


def test_offsets_read_twice_out_of_order_or_out_of_range_are_not_dense() -> None:
    acks, records, ranges = clean_run()
    twice = [*records[:2], records[1], *records[2:]]  # (0, 1) read again
    result = check(acks, twice, ranges, IDEMPOTENT)
    assert result.bad_offsets == [BadOffset(0, 1, "read twice")]
    assert not result.ok and result.anomalies()["offsets_not_dense"] == 1

    swapped = [records[0], records[2], records[1], *records[3:]]
    result = check(acks, swapped, ranges, IDEMPOTENT)
    assert result.bad_offsets == [BadOffset(0, 1, "out of order")]
    assert result.gaps == []

    result = check(acks, records, {0: (1, 4), 1: (0, 3)}, IDEMPOTENT)
    assert result.bad_offsets == [
        BadOffset(0, 0, "before the log start"),
        BadOffset(1, 3, "at or past the end"),
    ]


def test_a_partition_that_returned_nothing_of_its_range_is_one_gap() -> None:
    acks, records, ranges = clean_run()
    ranges[2] = (0, 10)
    result = check(acks, records, ranges, IDEMPOTENT)
    assert result.gaps == [Gap(2, 0, 9)]
    assert result.summary()["offsets_not_read"] == 10


def test_a_producers_sequence_going_back_within_a_partition_is_out_of_order() -> None:
    acks, records, ranges = clean_run()
    # idem:2 and idem:0 swapped places in partition 0; their acks say so too.
    swap = {(0, 0): ("idem", 2), (0, 2): ("idem", 0)}
    records = [
        Record(r.partition, r.offset, *swap.get((r.partition, r.offset), (r.producer, r.seq)))
        for r in records
    ]
    acks = [Ack(r.producer, r.seq, r.partition, r.offset) for r in records]
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "out_of_order")
    assert result.out_of_order == [OutOfOrder("idem", 0, 2, 0, 0, 2)]


def test_order_counts_each_records_first_copy() -> None:
    """plain:0 written again after plain:2 (a retry): its second copy is a duplicate,
    not a step back."""
    acks, records, ranges = clean_run()
    records.append(Record(0, 4, "plain", 0))
    ranges[0] = (0, 5)
    result = check(acks, records, ranges, IDEMPOTENT)
    assert result.ok, result.anomalies()
    assert len(result.other_duplicates) == 1


def test_order_is_per_partition() -> None:
    """A producer's sequence numbers interleave across partitions; only each partition's
    order counts."""
    acks = [Ack("idem", 1, 0, 0), Ack("idem", 0, 1, 0), Ack("idem", 2, 1, 1)]
    records = [Record(a.partition, a.offset, a.producer, a.seq) for a in acks]
    assert check(acks, records, {0: (0, 1), 1: (0, 2)}, IDEMPOTENT).ok


def test_a_record_no_producer_wrote_is_unrecognised() -> None:
    acks, records, ranges = clean_run()
    records.append(Record.from_value(1, 4, b"not ours"))
    ranges[1] = (0, 5)
    result = check(acks, records, ranges, IDEMPOTENT)
    only(result, "unrecognised")
    assert result.unrecognised == [Record(1, 4, None, None)]


def test_records_read_but_never_acknowledged_are_counted_not_anomalies() -> None:
    acks, records, ranges = clean_run()
    acks = acks[:-2]  # the last two delivery reports never came
    result = check(acks, records, ranges, IDEMPOTENT)
    assert result.ok
    assert result.unacknowledged_read == 2


def test_the_summary_lists_examples_of_each_kind() -> None:
    acks, records, ranges = clean_run()
    acks += [Ack("idem", 100 + i, 0, 10 + i) for i in range(15)]
    result = check(acks, records, ranges, IDEMPOTENT)
    summary = result.summary(examples=10)
    assert summary["anomalies"]["missing"] == 15
    assert len(summary["examples"]["missing"]) == 10
    assert summary["examples"]["missing"][0] == {
        "ack": {"producer": "idem", "seq": 100, "partition": 0, "offset": 10},
        "found_at": (),
    }


def test_without_plain_order_only_a_plain_producers_step_back_is_allowed() -> None:
    """plain_order=False (a lightning topic): a producer without idempotence's records out
    of order are counted apart and allowed; an idempotent producer's still fail."""
    acks, records, ranges = clean_run()
    swap = {(0, 1): ("plain", 2), (0, 3): ("plain", 0), (1, 0): ("idem", 3), (1, 2): ("idem", 1)}
    records = [
        Record(r.partition, r.offset, *swap.get((r.partition, r.offset), (r.producer, r.seq)))
        for r in records
    ]
    acks = [Ack(r.producer, r.seq, r.partition, r.offset) for r in records]
    strict = check(acks, records, ranges, IDEMPOTENT)
    assert len(strict.out_of_order) == 2 and strict.other_out_of_order == []
    relaxed = check(acks, records, ranges, IDEMPOTENT, plain_order=False)
    only(relaxed, "out_of_order")
    assert relaxed.out_of_order == [OutOfOrder("idem", 1, 2, 1, 0, 3)]
    assert relaxed.other_out_of_order == [OutOfOrder("plain", 0, 3, 0, 1, 2)]
    assert relaxed.summary()["other_out_of_order"] == 1
