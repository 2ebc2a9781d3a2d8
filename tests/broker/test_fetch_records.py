"""How a Fetch answer takes its records from the chunks it read."""

from __future__ import annotations

from broker.handlers.fetch import _select
from metadata.log import ChunkEntry
from protocol.codec import Gathered
from protocol.records import build_batch, iter_batches

RECORD = (None, b"v" * 1000, [], 1_700_000_000_000)


def _chunk(key: str, base_offset: int, batches: list[bytes]) -> tuple[ChunkEntry, memoryview]:
    """A chunk entry and its bytes as a cache holds them: a view into a larger object."""
    data = b"".join(batches)
    obj = b"x" * 100 + data + b"y" * 100
    last = base_offset + sum(next(iter_batches(b)).last_offset_delta + 1 for b in batches) - 1
    entry = ChunkEntry(key, 100, len(data), base_offset, last, len(batches), 0)
    return entry, memoryview(obj)[100 : 100 + len(data)]


def test_records_are_numbered_views_of_the_cached_chunks() -> None:
    ten = build_batch([RECORD] * 10)
    first = _chunk("a", 0, [ten, ten])  # offsets 0-19
    second = _chunk("b", 20, [ten])  # offsets 20-29
    records, used = _select([first, second], 5, 30, 1 << 20, must_take_one=True)
    assert isinstance(records, Gathered)
    assert used == len(records) == 3 * len(ten)
    # Batch bodies are the cached objects' bytes, not copies of them.
    bodies = [p for p in records.pieces if len(p) > 16]
    assert [p.obj for p in bodies] == [first[1].obj, first[1].obj, second[1].obj]
    views = list(iter_batches(b"".join(records.pieces)))
    assert [v.base_offset for v in views] == [0, 10, 20]
    assert all(v.crc_valid and v.partition_leader_epoch == 0 for v in views)


def test_records_stop_at_the_budget_and_the_end_offset() -> None:
    ten = build_batch([RECORD] * 10)
    chunk = _chunk("a", 0, [ten, ten, ten])
    records, used = _select([chunk], 0, 30, 2 * len(ten), must_take_one=True)
    assert used == 2 * len(ten)
    assert [v.base_offset for v in iter_batches(b"".join(records.pieces))] == [0, 10]
    # read_committed: nothing at or past the last stable offset.
    records, used = _select([chunk], 0, 10, 1 << 20, must_take_one=True)
    assert [v.base_offset for v in iter_batches(b"".join(records.pieces))] == [0]
    # The first batch goes out even over the budget, so a consumer always progresses.
    records, used = _select([chunk], 12, 30, 10, must_take_one=True)
    assert used == len(ten) and len(records) == len(ten)
    records, used = _select([chunk], 12, 30, 10, must_take_one=False)
    assert used == 0 and records.pieces == []
