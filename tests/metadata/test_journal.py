"""Journal sequences: each journal object is given offsets at most once, in n order."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from metadata import journal, keys, log, topics
from metadata.sqlite_kv import SQLiteKV

SUB = keys.cluster_subspace("test")


@pytest.fixture
def kv(tmp_path):
    return SQLiteKV(str(tmp_path / "meta.db"))


@pytest.fixture
def topic(kv) -> topics.Topic:
    return kv.transact_sync(
        lambda tr: topics.create_topic(tr, SUB, "lt", uuid.uuid4().bytes, 1, {}, 0)
    )


def batches(topic, count: int) -> list[log.PendingBatch]:
    return [
        log.PendingBatch(
            topic_id=topic.topic_id,
            partition=0,
            start=8 + 100 * i,
            length=100,
            last_offset_delta=0,
            max_timestamp=1000,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
        )
        for i in range(count)
    ]


def sequence(kv, topic, n: int, count: int = 2, name: str = "S1"):
    return kv.transact_sync(
        lambda tr: journal.sequence_object(tr, SUB, name, n, 1, 10_000, 5, batches(topic, count))
    )


def high_watermark(kv, topic) -> int:
    return kv.transact_sync(lambda tr: log.get_partition(tr, SUB, topic.topic_id, 0)).high_watermark


def test_an_object_is_sequenced_once_and_holes_are_skipped(kv, topic):
    first = sequence(kv, topic, 0)
    assert [(r.error, r.base_offset) for r in first] == [(ErrorCode.none, 0), (ErrorCode.none, 1)]
    assert sequence(kv, topic, 0) is None  # a second commit changes nothing
    assert high_watermark(kv, topic) == 2
    # Object 1 never came (its upload failed): object 2 skips it, and it is done after.
    assert [r.base_offset for r in sequence(kv, topic, 2)] == [2, 3]
    assert sequence(kv, topic, 1) is None
    assert high_watermark(kv, topic) == 4
    assert kv.transact_sync(lambda tr: journal.next_of_each(tr, SUB, ["S1", "S2"])) == {
        "S1": 3,
        "S2": 0,
    }
    # Another sequence keeps its own count.
    assert [r.base_offset for r in sequence(kv, topic, 0, name="S2")] == [4, 5]


def test_journal_keys_parse_back():
    key = journal.object_key("01JD3V6Q0Z8WJ5H7X2M4N6P8RA", 42)
    assert key == "journal/01JD3V6Q0Z8WJ5H7X2M4N6P8RA/0000000042"
    assert journal.parse_key(key) == ("01JD3V6Q0Z8WJ5H7X2M4N6P8RA", 42)
    for other in ("ingest/01JD3V6Q0Z8WJ5H7X2M4N6P8RA", "journal/x/42", "journal//0000000001"):
        assert journal.parse_key(other) is None
