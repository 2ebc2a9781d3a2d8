"""The cleaner's pure core: key maps, cleaning passes and rounds, over built batches."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Mapping, Sequence

import pytest

from protocol.compression import Compression
from protocol.records import (
    HEADER_SIZE,
    RecordBatchView,
    build_batch,
    end_txn_marker,
    iter_batches,
    iter_records,
)
from storage.cleaner import (
    DEFAULT_DEDUPE_BUFFER_SIZE,
    ENTRY_BYTES,
    AbortedTxn,
    BatchRetention,
    CleanedBatch,
    CleanerStats,
    KeyMap,
    KeyMapRound,
    LastBatch,
    build_key_map,
    clean,
)

T0 = 1_700_000_000_000
DAY = 86_400_000
ABORT = end_txn_marker(commit=False, coordinator_epoch=0)
COMMIT = end_txn_marker(commit=True, coordinator_epoch=0)

Pair = tuple[bytes | None, bytes | None]
Row = tuple[int, bytes | None, bytes | None]


def batch(
    base: int,
    *records: Pair,
    codec: int = Compression.NONE,
    producer: int = -1,
    txn: bool = False,
) -> bytes:
    """A data batch at ``base`` of (key, value) records, a millisecond apart."""
    return build_batch(
        [(key, value, [], T0 + i) for i, (key, value) in enumerate(records)],
        base_offset=base,
        compression=codec,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=0 if producer >= 0 else -1,
        transactional=txn,
    )


def marker(base: int, producer: int, commit: bool) -> bytes:
    key, value = COMMIT if commit else ABORT
    return build_batch(
        [(key, value, [], T0)],
        base_offset=base,
        producer_id=producer,
        producer_epoch=0,
        transactional=True,
        control=True,
    )


def views(log: Sequence[bytes]) -> list[RecordBatchView]:
    return list(iter_batches(b"".join(log)))


def rows(log: Sequence[bytes]) -> list[Row]:
    """(offset, key, value) of every record of ``log``."""
    return [
        (view.base_offset + r.offset_delta, r.key, r.value)
        for view in views(log)
        for r in iter_records(view)
    ]


def spans(log: Sequence[bytes]) -> list[tuple[int, int, int]]:
    """(base offset, last offset, record count) of every batch of ``log``."""
    return [(v.base_offset, v.last_offset, v.record_count) for v in views(log)]


class Pass:
    """One cleaning pass: a key map built from ``start``, then the whole log cleaned."""

    def __init__(
        self,
        log: Sequence[bytes],
        *,
        start: int,
        end: int | None = None,
        now: int = T0,
        aborted: Sequence[tuple[int, int]] = (),
        producers: Mapping[int, LastBatch] | None = None,
        buffer_size: int = 1 << 20,
    ) -> None:
        batches = views(log)
        self.end = batches[-1].next_offset if end is None else end
        self.key_map = KeyMap(buffer_size)
        self.round: KeyMapRound = build_key_map(batches, start, self.end, self.key_map, aborted)
        self.stats = CleanerStats()
        self.cleaned: list[CleanedBatch] = list(
            clean(
                batches,
                self.key_map,
                now_ms=now,
                delete_retention_ms=DAY,
                upper_bound=self.end,
                aborted=aborted,
                last_batch_of_producers=producers,
                stats=self.stats,
            )
        )
        self.log = [bytes(c.data) for c in self.cleaned if c.data is not None]


# --- the key map ---------------------------------------------------------------------------


def test_key_map_puts_and_gets() -> None:
    key_map = KeyMap(ENTRY_BYTES * 4)
    assert key_map.capacity == 3  # 4 entries at load factor 0.9
    assert (len(key_map), key_map.get(b"a"), key_map.latest_offset) == (0, -1, -1)
    key_map.put(b"a", 10)
    key_map.put(b"b", 11)
    key_map.put(b"a", 12)
    assert (len(key_map), key_map.get(b"a"), key_map.get(b"b")) == (2, 12, 11)
    assert key_map.latest_offset == 12
    assert not key_map.full
    key_map.put(b"", 13)  # an empty key is a key
    assert key_map.full and key_map.get(b"") == 13
    key_map.put(b"b", 14)  # a key already there may move on when full
    assert key_map.get(b"b") == 14
    with pytest.raises(ValueError):
        key_map.put(b"c", 15)
    key_map.clear()
    assert (len(key_map), key_map.get(b"a"), key_map.latest_offset) == (0, -1, -1)
    assert not key_map.full


def test_key_map_size_from_its_byte_budget() -> None:
    assert KeyMap().capacity == int(DEFAULT_DEDUPE_BUFFER_SIZE // ENTRY_BYTES * 0.9)
    assert KeyMap(ENTRY_BYTES * 100, load_factor=0.5).capacity == 50
    with pytest.raises(ValueError):
        KeyMap(ENTRY_BYTES)  # 0.9 of one entry holds none


def _traced_peak(fill: int, buffer_size: int) -> int:
    """Peak bytes allocated while ``fill`` distinct keys with large offsets go into a map."""
    keys = [i.to_bytes(8, "big") for i in range(fill)]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        key_map = KeyMap(buffer_size)
        for i, key in enumerate(keys):
            key_map.put(key, 2**40 + i)  # offsets past the small-int cache
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(key_map) == fill
    return peak


# Sizes just past a dict resize, where an entry costs the most (old and new tables live).
@pytest.mark.parametrize("fill", [1366, 5462, 21846, 43691])
def test_entry_bytes_is_at_least_what_an_entry_costs(fill: int) -> None:
    peak = _traced_peak(fill, 1 << 30)
    assert peak / fill <= ENTRY_BYTES
    assert peak / fill > 100  # the measurement measures something


@pytest.mark.parametrize("buffer_size", [64 * 1024, 1 << 20, 3 << 20])
def test_a_full_map_stays_within_its_byte_budget(buffer_size: int) -> None:
    capacity = KeyMap(buffer_size).capacity
    assert _traced_peak(capacity, buffer_size) <= buffer_size


# --- building the map ----------------------------------------------------------------------

# (name, log, start, end, capacity, expected round, expected latest offset per key)
MAPS: list[tuple[str, list[bytes], int, int, int, KeyMapRound, dict[bytes, int]]] = [
    (
        "every key, latest offset",
        [batch(0, (b"a", b"1"), (b"b", b"1")), batch(2, (b"a", b"2"))],
        0,
        3,
        9,
        KeyMapRound(3, False),
        {b"a": 2, b"b": 1, b"c": -1},
    ),
    (
        "from the first dirty offset, to the gap before end",
        [batch(0, (b"a", b"1"), (b"b", b"1")), batch(5, (b"c", b"1"))],
        1,
        9,
        9,
        KeyMapRound(9, False),
        {b"a": -1, b"b": 1, b"c": 5},
    ),
    (
        "not past end",
        [batch(0, (b"a", b"1"), (b"b", b"1"), (b"c", b"1")), batch(3, (b"d", b"1"))],
        0,
        2,
        9,
        KeyMapRound(2, False),
        {b"a": 0, b"b": 1, b"c": -1, b"d": -1},
    ),
    (
        "keyless records and control batches are not keys",
        [batch(0, (None, b"1"), (b"a", b"1")), marker(2, 7, commit=True)],
        0,
        3,
        1,
        KeyMapRound(3, False),
        {b"a": 1},
    ),
    (
        "full within a batch: the round ends after the last key put",
        [batch(0, (b"a", b"1")), batch(1, (b"b", b"1"), (b"a", b"2"), (b"c", b"1"))],
        0,
        4,
        2,
        KeyMapRound(2, True),
        {b"a": 0, b"b": 1, b"c": -1},
    ),
    (
        "full at a batch's end",
        [batch(0, (b"a", b"1"), (b"b", b"1")), batch(2, (b"c", b"1"))],
        0,
        3,
        2,
        KeyMapRound(2, True),
        {b"a": 0, b"b": 1, b"c": -1},
    ),
    (
        "a map of one key still makes progress",
        [batch(10, (b"a", b"1"), (b"b", b"1"))],
        10,
        12,
        1,
        KeyMapRound(11, True),
        {b"a": 10, b"b": -1},
    ),
]


@pytest.mark.parametrize(
    ("name", "log", "start", "end", "capacity", "expected", "offsets"),
    MAPS,
    ids=[case[0] for case in MAPS],
)
def test_build_key_map(
    name: str,
    log: list[bytes],
    start: int,
    end: int,
    capacity: int,
    expected: KeyMapRound,
    offsets: dict[bytes, int],
) -> None:
    key_map = KeyMap(ENTRY_BYTES * capacity, load_factor=1.0)
    key_map.put(b"stale", 99)  # cleared first
    assert build_key_map(views(log), start, end, key_map) == expected
    assert key_map.latest_offset == expected.end_offset - 1
    assert {key: key_map.get(key) for key in offsets} == offsets
    assert key_map.get(b"stale") == -1


def test_build_key_map_leaves_out_aborted_data() -> None:
    log = [
        batch(0, (b"a", b"1")),
        batch(1, (b"a", b"aborted"), (b"b", b"aborted"), producer=7, txn=True),
        marker(3, 7, commit=False),
        batch(4, (b"c", b"committed"), producer=7, txn=True),
        marker(5, 7, commit=True),
    ]
    key_map = KeyMap()
    assert build_key_map(views(log), 0, 6, key_map, [(7, 1)]) == KeyMapRound(6, False)
    assert [key_map.get(k) for k in (b"a", b"b", b"c")] == [0, -1, 4]


# --- cleaning --------------------------------------------------------------------------------

# (name, log, first dirty offset, expected records, expected batches (base, last, count))
CLEANS: list[tuple[str, list[bytes], int, list[Row], list[tuple[int, int, int]]]] = [
    (
        "the latest value of each key wins; offsets stay",
        [
            batch(0, (b"a", b"a0"), (b"b", b"b0")),
            batch(2, (b"a", b"a1")),
            batch(3, (b"c", b"c0"), (b"b", b"b1")),
        ],
        0,
        [(2, b"a", b"a1"), (3, b"c", b"c0"), (4, b"b", b"b1")],
        [(2, 2, 1), (3, 4, 2)],
    ),
    (
        "within one batch",
        [batch(0, (b"a", b"a0"), (b"b", b"b0"), (b"a", b"a1"), (b"a", b"a2"))],
        0,
        [(1, b"b", b"b0"), (3, b"a", b"a2")],
        [(0, 3, 2)],
    ),
    (
        "the last record of a batch goes, its last offset stays",
        [batch(0, (b"a", b"a0"), (b"b", b"b0")), batch(2, (b"b", b"b1"))],
        0,
        [(0, b"a", b"a0"), (2, b"b", b"b1")],
        [(0, 1, 1), (2, 2, 1)],
    ),
    (
        "gaps between offsets",
        [
            batch(0, (b"a", b"a0")),
            batch(10, (b"b", b"b0"), (b"a", b"a1")),
            batch(25, (b"b", b"b1")),
        ],
        0,
        [(11, b"a", b"a1"), (25, b"b", b"b1")],
        [(10, 11, 1), (25, 25, 1)],
    ),
    (
        "records before the first dirty offset are cleaned too",
        [batch(0, (b"a", b"a0"), (b"b", b"b0")), batch(2, (b"a", b"a1"))],
        2,
        [(1, b"b", b"b0"), (2, b"a", b"a1")],
        [(0, 1, 1), (2, 2, 1)],
    ),
    (
        "keyless records go",
        [
            batch(0, (None, b"x"), (b"a", b"a0"), (None, b"y")),
            batch(3, (None, b"z")),
            batch(4, (b"b", b"b0")),
        ],
        0,
        [(1, b"a", b"a0"), (4, b"b", b"b0")],
        [(0, 2, 1), (4, 4, 1)],
    ),
    (
        "the round's last batch stays, empty",
        [batch(0, (b"a", b"a0")), batch(1, (None, b"x"), (None, b"y"))],
        0,
        [(0, b"a", b"a0")],
        [(0, 0, 1), (1, 2, 0)],
    ),
]


@pytest.mark.parametrize(
    ("name", "log", "start", "expected", "batches"), CLEANS, ids=[case[0] for case in CLEANS]
)
def test_clean(
    name: str,
    log: list[bytes],
    start: int,
    expected: list[Row],
    batches: list[tuple[int, int, int]],
) -> None:
    cleaned = Pass(log, start=start)
    assert rows(cleaned.log) == expected
    assert spans(cleaned.log) == batches
    assert all(v.crc_valid for v in views(cleaned.log))
    assert cleaned.stats.records_read == len(rows(log))
    assert cleaned.stats.records_kept == len(expected)
    assert cleaned.stats.keyless_records == sum(key is None for _, key, _ in rows(log))
    assert cleaned.stats.bytes_read == sum(map(len, log))
    assert cleaned.stats.bytes_kept == sum(map(len, cleaned.log))
    assert cleaned.stats.batches_kept == len(batches)


def test_an_unchanged_batch_is_passed_on_byte_for_byte_and_stats_add_up() -> None:
    log = [
        batch(0, (b"a", b"a0"), (b"b", b"b0")),
        batch(2, (b"a", b"a1")),
        batch(3, (b"c", b"c0")),
        batch(4, (b"c", b"c1"), (None, b"x")),
    ]
    cleaned = Pass(log, start=0)
    assert [c.unchanged for c in cleaned.cleaned] == [False, True, False, False]
    assert [c.retention for c in cleaned.cleaned] == [
        BatchRetention.DELETE_EMPTY,
        BatchRetention.DELETE_EMPTY,
        BatchRetention.DELETE_EMPTY,
        BatchRetention.RETAIN_EMPTY,  # ends the round
    ]
    unchanged = cleaned.cleaned[1]
    assert isinstance(unchanged.data, memoryview)  # a view, not a copy
    assert bytes(unchanged.data) == log[1]
    assert cleaned.cleaned[2].data is None  # c0 superseded: the batch goes
    assert cleaned.log[0] != log[0] and rows([cleaned.log[0]]) == [(1, b"b", b"b0")]
    assert cleaned.stats == CleanerStats(
        records_read=6,
        records_kept=3,
        keyless_records=1,
        bytes_read=sum(map(len, log)),
        bytes_kept=sum(map(len, cleaned.log)),
        batches_read=4,
        batches_kept=3,
        batches_unchanged=1,
        batches_emptied=0,
    )


def test_batches_past_the_map_are_kept_as_they_are() -> None:
    log = [
        batch(0, (b"a", b"a0"), (None, b"x")),
        batch(2, (b"a", b"a1"), (b"a", b"a2"), (None, b"y")),  # past the first uncleanable offset
    ]
    cleaned = Pass(log, start=0, end=2)
    assert cleaned.key_map.latest_offset == 1
    assert rows(cleaned.log) == [
        (0, b"a", b"a0"),
        (2, b"a", b"a1"),
        (3, b"a", b"a2"),
        (4, None, b"y"),
    ]
    assert cleaned.cleaned[0].retention is BatchRetention.RETAIN_EMPTY  # ends at 2
    assert cleaned.cleaned[1].unchanged


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: Compression(c).name.lower())
def test_every_codec_is_written_again_with_its_own(codec: int) -> None:
    values = [bytes([65 + i]) * 200 for i in range(6)]
    log = [
        batch(0, (b"a", values[0]), (b"b", values[1]), (b"c", values[2]), codec=codec),
        batch(3, (b"d", values[3]), (b"e", values[4]), codec=codec),
        batch(5, (b"a", values[5]), codec=codec),
    ]
    cleaned = Pass(log, start=0)
    assert rows(cleaned.log) == [
        (1, b"b", values[1]),
        (2, b"c", values[2]),
        (3, b"d", values[3]),
        (4, b"e", values[4]),
        (5, b"a", values[5]),
    ]
    assert [v.compression for v in views(cleaned.log)] == [codec, codec, codec]
    assert [c.unchanged for c in cleaned.cleaned] == [False, True, True]
    assert cleaned.log[1:] == log[1:]  # byte for byte
    assert spans(cleaned.log)[0] == (0, 2, 2)


def test_several_rounds_with_a_small_map_leave_one_record_per_key() -> None:
    rng = random.Random(7)
    keys = [f"key-{i}".encode() for i in range(40)]
    log: list[bytes] = []
    latest: dict[bytes, Row] = {}
    offset = 0
    for n in range(60):
        size = 20 if n == 30 else rng.randint(1, 6)  # one batch of more keys than the map
        pairs = [(rng.choice(keys), f"v{offset + i}".encode()) for i in range(size)]
        if n == 30:
            pairs = [(k, f"v{offset + i}".encode()) for i, k in enumerate(keys[:20])]
        log.append(batch(offset, *pairs))
        for i, (key, value) in enumerate(pairs):
            latest[key] = (offset + i, key, value)
        offset += size + rng.choice([0, 0, 3])  # some gaps
    end = views(log)[-1].next_offset

    dirty, rounds = 0, 0
    while dirty < end:
        cleaned = Pass(log, start=dirty, end=end, buffer_size=ENTRY_BYTES * 8)
        assert cleaned.key_map.capacity == 7
        assert cleaned.round.end_offset > dirty
        assert cleaned.round.full == (cleaned.round.end_offset < end)
        log, dirty, rounds = cleaned.log, cleaned.round.end_offset, rounds + 1

    assert rows(log) == sorted(latest.values())
    assert len(rows(log)) == len(keys)
    assert rounds > 10
    assert views(log)[-1].next_offset == end  # the last batch kept its offsets


def test_a_clean_log_cleaned_again_is_unchanged() -> None:
    log = [batch(0, (b"a", b"a0")), batch(1, (b"b", b"b0")), batch(2, (b"a", b"a1"))]
    once = Pass(log, start=0).log
    twice = Pass(once, start=3)
    assert twice.log == once
    assert all(c.unchanged for c in twice.cleaned)


# --- tombstones ------------------------------------------------------------------------------


def test_tombstones_get_a_delete_horizon_and_go_after_it() -> None:
    log = [
        batch(0, (b"a", b"a0"), (b"b", b"b0")),
        batch(2, (b"a", None), (b"c", b"c0")),
        batch(4, (b"d", b"d0")),
    ]
    first = Pass(log, start=0, now=T0)
    assert rows(first.log) == [
        (1, b"b", b"b0"),
        (2, b"a", None),
        (3, b"c", b"c0"),
        (4, b"d", b"d0"),
    ]
    tombstone = views(first.log)[1]
    assert tombstone.delete_horizon_ms == T0 + DAY
    assert first.cleaned[1].unchanged is False  # all kept, but the horizon was set
    assert [r.timestamp for r in iter_records(tombstone)] == [T0, T0 + 1]

    # A later pass before the horizon keeps it, byte for byte.
    log = [*first.log, batch(5, (b"e", b"e0"))]
    second = Pass(log, start=5, now=T0 + DAY - 1)
    assert rows(second.log) == rows(log)
    assert second.cleaned[1].unchanged

    # After the horizon it goes; the rest of its batch stays.
    third = Pass(second.log, start=6, now=T0 + DAY)
    assert rows(third.log) == [
        (1, b"b", b"b0"),
        (3, b"c", b"c0"),
        (4, b"d", b"d0"),
        (5, b"e", b"e0"),
    ]
    assert spans(third.log)[1] == (2, 3, 1)
    assert views(third.log)[1].delete_horizon_ms == T0 + DAY  # kept with the batch


def test_a_tombstone_superseded_goes_at_once() -> None:
    log = [batch(0, (b"a", None)), batch(1, (b"a", b"back")), batch(2, (b"z", b"z"))]
    assert rows(Pass(log, start=0).log) == [(1, b"a", b"back"), (2, b"z", b"z")]


def test_a_tombstone_in_the_round_s_last_batch_leaves_it_empty() -> None:
    log = [batch(0, (b"a", b"a0")), batch(1, (b"b", None))]
    first = Pass(log, start=0, now=T0)
    later = Pass(first.log, start=2, now=T0 + DAY)
    assert rows(later.log) == [(0, b"a", b"a0")]
    assert spans(later.log) == [(0, 0, 1), (1, 1, 0)]
    assert later.cleaned[1].emptied and later.stats.batches_emptied == 1


# --- transactions ----------------------------------------------------------------------------

P = 7


def test_aborted_data_goes_and_its_marker_after_a_later_horizon() -> None:
    log = [
        batch(0, (b"a", b"a0")),
        batch(1, (b"a", b"aborted"), (b"b", b"aborted"), producer=P, txn=True),
        marker(3, P, commit=False),
        batch(4, (b"c", b"c0")),
    ]
    first = Pass(log, start=0, now=T0, aborted=[(P, 1)])
    assert rows(first.log) == [(0, b"a", b"a0"), (3, *ABORT), (4, b"c", b"c0")]
    assert first.cleaned[1].retention is BatchRetention.DELETE
    assert first.cleaned[2].unchanged  # its data was here: no horizon yet
    assert first.stats.aborted_txns == [AbortedTxn(P, 1, 3)]

    # The next pass sees no data of it: the marker may go, after delete.retention.ms.
    log = [*first.log, batch(5, (b"d", b"d0"))]
    second = Pass(log, start=5, now=T0 + 10, aborted=[(P, 1)])
    assert rows(second.log) == rows(log)
    assert views(second.log)[1].delete_horizon_ms == T0 + 10 + DAY
    assert second.stats.aborted_txns == []

    before = Pass(second.log, start=6, now=T0 + 9 + DAY)
    assert rows(before.log) == rows(second.log)
    after = Pass(second.log, start=6, now=T0 + 10 + DAY)
    assert rows(after.log) == [(0, b"a", b"a0"), (4, b"c", b"c0"), (5, b"d", b"d0")]
    assert after.cleaned[1].retention is BatchRetention.DELETE

    # Unless it is its producer's last batch: then its header stays.
    kept = Pass(second.log, start=6, now=T0 + 10 + DAY, producers={P: (None, 0)})
    assert spans(kept.log)[1] == (3, 3, 0)
    emptied = views(kept.log)[1]
    assert emptied.is_control and emptied.is_transactional and emptied.producer_id == P

    # Once the producer is gone, so is the empty marker.
    gone = Pass(kept.log, start=6, now=T0 + 10 + DAY)
    assert spans(gone.log) == [(0, 0, 1), (4, 4, 1), (5, 5, 1)]


def test_an_open_aborted_transaction_spans_batches_of_other_producers() -> None:
    log = [
        batch(0, (b"x", b"aborted"), producer=P, txn=True),  # opens it: last offset == first
        batch(1, (b"a", b"other"), producer=8, txn=True),
        batch(2, (b"b", b"aborted"), producer=P, txn=True),
        marker(3, 8, commit=True),
        marker(4, P, commit=False),
        batch(5, (b"z", b"z")),
    ]
    cleaned = Pass(log, start=0, aborted=[(P, 0)])
    assert rows(cleaned.log) == [(1, b"a", b"other"), (3, *COMMIT), (4, *ABORT), (5, b"z", b"z")]
    assert [cleaned.key_map.get(k) for k in (b"x", b"a", b"b")] == [-1, 1, -1]
    assert cleaned.stats.aborted_txns == [AbortedTxn(P, 0, 4)]


def test_a_commit_marker_stays_while_data_of_its_transaction_does() -> None:
    log = [
        batch(0, (b"a", b"committed"), producer=P, txn=True),
        marker(1, P, commit=True),
        batch(2, (b"b", b"b0")),
    ]
    first = Pass(log, start=0)
    assert rows(first.log) == rows(log)
    assert all(c.unchanged for c in first.cleaned)  # no horizon on the marker
    second = Pass(first.log, start=3, now=T0 + 2 * DAY)
    assert second.log == first.log


def test_a_commit_marker_goes_a_horizon_after_its_data() -> None:
    log = [
        batch(0, (b"a", b"committed"), producer=P, txn=True),
        marker(1, P, commit=True),
        batch(2, (b"a", b"a1")),
    ]
    first = Pass(log, start=0, now=T0)
    assert rows(first.log) == [(1, *COMMIT), (2, b"a", b"a1")]
    assert views(first.log)[0].delete_horizon_ms is None  # its data was seen in this pass

    second = Pass([*first.log, batch(3, (b"z", b"z"))], start=3, now=T0)
    assert views(second.log)[0].delete_horizon_ms == T0 + DAY
    third = Pass(second.log, start=4, now=T0 + DAY)
    assert rows(third.log) == [(2, b"a", b"a1"), (3, b"z", b"z")]


# --- producers' last batches -------------------------------------------------------------------

# (name, last batch of each producer, expected batches (base, last, count))
PRODUCERS: list[tuple[str, dict[int, LastBatch], list[tuple[int, int, int]]]] = [
    ("no active producer: the batch goes", {}, [(2, 2, 1), (3, 3, 1)]),
    ("its last data batch stays, empty", {P: (1, 0)}, [(0, 1, 0), (2, 2, 1), (3, 3, 1)]),
    ("an earlier batch of the producer goes", {P: (9, 0)}, [(2, 2, 1), (3, 3, 1)]),
    ("a marker is its last batch, not this", {P: (None, 0)}, [(2, 2, 1), (3, 3, 1)]),
]


@pytest.mark.parametrize(
    ("name", "producers", "expected"), PRODUCERS, ids=[case[0] for case in PRODUCERS]
)
def test_a_producer_s_last_batch_stays_even_empty(
    name: str, producers: dict[int, LastBatch], expected: list[tuple[int, int, int]]
) -> None:
    log = [
        batch(0, (b"a", b"a0"), (b"b", b"b0"), producer=P),
        batch(2, (b"a", b"a1")),
        batch(3, (b"b", b"b1")),
    ]
    cleaned = Pass(log, start=0, producers=producers)
    assert spans(cleaned.log) == expected
    assert rows(cleaned.log) == [(2, b"a", b"a1"), (3, b"b", b"b1")]
    if expected[0][2] == 0:
        [emptied] = views(cleaned.log[:1])
        assert len(cleaned.log[0]) == HEADER_SIZE
        assert (emptied.producer_id, emptied.producer_epoch, emptied.base_sequence) == (P, 0, 0)
