"""The transactions checker (integration/chaos/txn_checker.py) on hand-made runs: a clean
one passes, and each kind of anomaly is found, named and counted, with nothing else
reported."""

from __future__ import annotations

import pytest

from integration.chaos.txn_checker import (
    Incomplete,
    Misplaced,
    OpenAtEnd,
    Outcome,
    OutOfOrder,
    Read,
    Tag,
    Transaction,
    check_processing,
    check_topic,
    decode_value,
    encode_value,
)

COMMITTED, ABORTED, UNKNOWN = Outcome.COMMITTED, Outcome.ABORTED, Outcome.UNKNOWN


def clean_run() -> tuple[list[Transaction], list[Read], list[Read], dict[int, tuple[int, int]]]:
    """Two producers over two partitions. p's transaction 0 commits two records (one per
    partition), 1 aborts, 2 commits; q's 0 commits, 1 has an unknown outcome and did not
    commit. Offsets as the log would have them, markers included (each ends a transaction
    on a partition it wrote to)."""
    txns = [
        Transaction("p", 0, COMMITTED, ((0, 0), (1, 1))),
        Transaction("p", 1, ABORTED, ((0, 0),)),
        Transaction("p", 2, COMMITTED, ((0, 1), (1, 0))),
        Transaction("q", 0, COMMITTED, ((0, 0),)),
        Transaction("q", 1, UNKNOWN, ((0, 1),)),
    ]
    # partition 0: p0.0, q0.0, [marker p], [marker q], p1.0, [abort p], p2.1, [marker p]
    # partition 1: p0.1, q1.0, [marker p], p2.0, [marker p], [abort q]
    uncommitted = [
        Read(0, 0, Tag("p", 0, 0)),
        Read(0, 1, Tag("q", 0, 0)),
        Read(0, 4, Tag("p", 1, 0)),
        Read(0, 6, Tag("p", 2, 1)),
        Read(1, 0, Tag("p", 0, 1)),
        Read(1, 1, Tag("q", 1, 0)),
        Read(1, 3, Tag("p", 2, 0)),
    ]
    committed = [r for r in uncommitted if (r.tag.producer, r.tag.txn) not in {("p", 1), ("q", 1)}]
    return txns, committed, uncommitted, {0: (8, 8), 1: (6, 6)}


def only(result, kind: str) -> None:
    """`kind` is the one anomaly the result counts."""
    anomalies = result.anomalies()
    assert anomalies[kind] > 0, anomalies
    assert {k: v for k, v in anomalies.items() if v} == {kind: anomalies[kind]}
    assert not result.ok


def test_a_clean_run_passes() -> None:
    result = check_topic(*clean_run())
    assert result.ok, result.anomalies()
    assert set(result.anomalies().values()) == {0}
    summary = result.summary()
    assert summary["transactions"] == {"committed": 3, "aborted": 1, "unknown": 1}
    assert summary["unknown_resolved"] == {"aborted": 1}
    assert (summary["read_committed"], summary["read_uncommitted"]) == (5, 7)


def test_values_carry_their_tag() -> None:
    tag = Tag("p3", 12, 4)
    value = encode_value(tag, size=64)
    assert len(value) == 64 and decode_value(value) == tag
    made = Tag("t0", 2, 0, (5, 1234))
    assert decode_value(encode_value(made)) == made
    for foreign in (None, b"", b"hello", b"p:x:1:-:", b"p:1:2:3:", b":1:2:-:", b"p:1:2:4/x:"):
        assert decode_value(foreign) is None
    assert Read.from_value(1, 2, b"junk") == Read(1, 2, None)


def test_a_committed_transaction_missing_a_record_is_incomplete() -> None:
    txns, committed, uncommitted, ends = clean_run()
    committed = [r for r in committed if r.tag != Tag("p", 2, 1)]  # lost in partition 0
    result = check_topic(txns, committed, uncommitted, ends)
    only(result, "incomplete_commit")
    assert result.incomplete_commit == [Incomplete("p", 2, COMMITTED, 1, ((1, 0),))]


def test_a_transaction_of_unknown_outcome_half_visible_is_partial() -> None:
    txns, committed, uncommitted, ends = clean_run()
    txns.append(Transaction("q", 2, UNKNOWN, ((0, 0), (1, 1))))
    uncommitted += [Read(0, 8, Tag("q", 2, 0)), Read(1, 6, Tag("q", 2, 1))]
    committed.append(Read(0, 8, Tag("q", 2, 0)))  # partition 1's half never shows
    result = check_topic(txns, committed, uncommitted, {0: (10, 10), 1: (8, 8)})
    only(result, "partial")
    assert result.partial == [Incomplete("q", 2, UNKNOWN, 1, ((1, 1),))]


def test_whole_transactions_of_unknown_outcome_are_resolved_by_what_is_read() -> None:
    txns, committed, uncommitted, ends = clean_run()
    committed.append(Read(1, 1, Tag("q", 1, 0)))  # q's unknown transaction did commit
    committed.sort(key=lambda r: (r.partition, r.offset))
    result = check_topic(txns, committed, uncommitted, ends)
    assert result.ok, result.anomalies()
    assert result.unknown_resolved == {"committed": 1}


def test_a_record_of_an_aborted_transaction_read_committed_is_reported() -> None:
    txns, committed, uncommitted, ends = clean_run()
    committed.append(Read(0, 4, Tag("p", 1, 0)))
    committed.sort(key=lambda r: (r.partition, r.offset))
    result = check_topic(txns, committed, uncommitted, ends)
    only(result, "aborted_visible")
    assert result.aborted_visible == [Read(0, 4, Tag("p", 1, 0))]


def test_a_record_read_committed_twice_is_a_duplicate() -> None:
    txns, committed, uncommitted, ends = clean_run()
    uncommitted.append(Read(0, 8, Tag("q", 0, 0)))
    committed.append(Read(0, 8, Tag("q", 0, 0)))
    result = check_topic(txns, committed, uncommitted, {0: (9, 9), 1: (6, 6)})
    only(result, "duplicates")
    assert result.duplicates[0].at == ((0, 1), (0, 8))


def test_a_producers_records_out_of_their_order_are_reported() -> None:
    """p's transaction 2 before its transaction 0 in partition 0: broken order."""
    txns, committed, uncommitted, ends = clean_run()
    swapped = {(0, 0): Tag("p", 2, 1), (0, 6): Tag("p", 0, 0)}

    def swap(reads: list[Read]) -> list[Read]:
        return [
            Read(r.partition, r.offset, swapped.get((r.partition, r.offset), r.tag)) for r in reads
        ]

    result = check_topic(txns, swap(committed), swap(uncommitted), ends)
    only(result, "out_of_order")
    assert result.out_of_order == [OutOfOrder("p", 0, 6, (0, 0), (2, 1), 0)]


def test_a_record_in_another_partition_than_it_was_produced_to_is_misplaced() -> None:
    txns, committed, uncommitted, ends = clean_run()
    txns[0] = Transaction("p", 0, COMMITTED, ((0, 0), (1, 0)))  # seq 1 went to partition 0
    result = check_topic(txns, committed, uncommitted, ends)
    only(result, "misplaced")
    assert result.misplaced == [Misplaced("p", 0, 1, 0, (1, 0))]


@pytest.mark.parametrize(
    "tag", [None, Tag("nobody", 0, 0), Tag("p", 7, 0), Tag("p", 0, 9)], ids=str
)
def test_a_record_no_producer_wrote_is_unexpected(tag) -> None:
    txns, committed, uncommitted, ends = clean_run()
    uncommitted.append(Read(1, 6, tag))
    committed.append(Read(1, 6, tag))
    result = check_topic(txns, committed, uncommitted, {0: (8, 8), 1: (7, 7)})
    only(result, "unexpected")


def test_a_committed_record_read_uncommitted_lacks_is_reported() -> None:
    txns, committed, uncommitted, ends = clean_run()
    uncommitted = [r for r in uncommitted if r.tag != Tag("q", 0, 0)]
    result = check_topic(txns, committed, uncommitted, ends)
    assert result.committed_not_in_uncommitted == [Tag("q", 0, 0)]
    # ... and read_committed has a record where read_uncommitted had none.
    assert result.isolation_mismatch == [(0, 1)]
    assert {k for k, v in result.anomalies().items() if v} == {
        "committed_not_in_uncommitted",
        "isolation_mismatch",
    }


def test_isolation_levels_disagreeing_on_an_offset_are_reported() -> None:
    txns, committed, uncommitted, ends = clean_run()
    uncommitted = [
        Read(r.partition, r.offset + 1, r.tag) if r.tag == Tag("p", 2, 1) else r
        for r in uncommitted
    ]
    result = check_topic(txns, committed, uncommitted, ends)
    only(result, "isolation_mismatch")
    assert result.isolation_mismatch == [(0, 6)]


def test_a_transaction_left_open_at_the_end_is_reported() -> None:
    txns, committed, uncommitted, ends = clean_run()
    result = check_topic(txns, committed, uncommitted, {0: (4, 8), 1: (6, 6)})
    only(result, "open_at_end")
    assert result.open_at_end == [OpenAtEnd(0, 4, 8)]


# -- consume-transform-produce ----------------------------------------------------------


def processing_run() -> tuple[list[Read], list[Read], dict[int, int]]:
    """Input: four committed records in two partitions; the stage transformed three and
    committed offsets past them (partition 1's last record not yet processed)."""
    inputs = [
        Read(0, 0, Tag("p", 0, 0)),
        Read(0, 2, Tag("p", 1, 0)),
        Read(1, 0, Tag("p", 0, 1)),
        Read(1, 3, Tag("p", 2, 0)),
    ]
    outputs = [
        Read(0, 0, Tag("t", 0, 0, (0, 0))),
        Read(0, 1, Tag("t", 0, 1, (0, 2))),
        Read(1, 0, Tag("t", 0, 2, (1, 0))),
    ]
    return inputs, outputs, {0: 3, 1: 1}


def test_exactly_once_processing_passes() -> None:
    result = check_processing(*processing_run())
    assert result.ok, result.anomalies()
    assert (result.inputs_below_committed, result.outputs) == (3, 3)


def test_an_input_below_the_committed_offset_without_output_is_lost() -> None:
    inputs, outputs, offsets = processing_run()
    result = check_processing(inputs, outputs[1:], offsets)
    only(result, "lost")
    assert result.lost == [(0, 0)]


def test_an_input_transformed_twice_is_duplicated() -> None:
    inputs, outputs, offsets = processing_run()
    outputs.append(Read(0, 3, Tag("t", 1, 0, (0, 2))))
    result = check_processing(inputs, outputs, offsets)
    only(result, "duplicated")
    assert result.duplicated == [((0, 2), ((0, 1), (0, 3)))]


def test_an_output_past_the_committed_offsets_is_ahead() -> None:
    """The output of partition 1's offset 3 committed, its consumed offset not."""
    inputs, outputs, offsets = processing_run()
    outputs.append(Read(1, 1, Tag("t", 1, 0, (1, 3))))
    result = check_processing(inputs, outputs, offsets)
    only(result, "ahead")
    assert result.ahead == [(1, 3)]


def test_an_output_of_an_input_read_committed_never_had_is_foreign() -> None:
    """Made from an aborted record (at input offset (0, 1)), or not made from any."""
    inputs, outputs, offsets = processing_run()
    outputs += [Read(0, 2, Tag("t", 1, 0, (0, 1))), Read(0, 3, Tag("t", 1, 1)), Read(0, 4, None)]
    result = check_processing(inputs, outputs, offsets)
    only(result, "foreign")
    assert len(result.foreign) == 3


def test_a_refused_abort_of_a_transaction_absent_from_the_log_or_committed_is_explained() -> None:
    """Kafka refuses an abort when nothing of the transaction was registered (its
    AddPartitionsToTxn lost with its coordinator), or when it had committed."""
    txns, committed, uncommitted, ends = clean_run()
    txns.append(Transaction("q", 2, ABORTED, ((0, 0), (1, 1))))  # never reached the log
    result = check_topic(txns, committed, uncommitted, ends, [("q", 2), ("q", 0)])
    assert result.ok, result.anomalies()
    assert result.refused_aborts_explained == 2


def test_a_refused_abort_of_a_transaction_that_was_open_is_reported() -> None:
    """p's transaction 1 reached the log and did not commit: it was open when its abort
    was refused."""
    txns, committed, uncommitted, ends = clean_run()
    result = check_topic(txns, committed, uncommitted, ends, [("p", 1)])
    only(result, "refused_abort")
    assert result.refused_abort == [Incomplete("p", 1, ABORTED, 0, ((0, 0),))]
