"""When the journal answers (broker/journal.py): each flush as soon as its own upload
returns, except that an idempotent producer's batch waits for the flushes holding its
earlier batches of the partition, and is answered with their failure. Real SQLite and a
real local store, with a delay or an error put in front of chosen writes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from broker.journal import JournalPipeline
from broker.sync import Notifier
from protocol.records import build_batch, iter_batches
from storage.objectstore import ObjectStoreError
from tests.broker.test_ingest_pipeline import SUB, Setup


def idempotent(producer_id: int, seq: int) -> tuple[bytes, Any]:
    data = build_batch(
        [(None, b"p%d-s%d" % (producer_id, seq), (), 1000)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=seq,
    )
    (view,) = iter_batches(data)
    return data, view


def journal(setup: Setup) -> JournalPipeline:
    return JournalPipeline(
        setup.kv, SUB, setup.store, setup.cache, Notifier(), lambda: 1,
        flush_interval_ms=1, flush_bytes=1,
    )  # fmt: skip


async def answers(setup: Setup, sends: list[tuple[int, int]]) -> list[tuple[ErrorCode, float]]:
    """Queue each (producer id, sequence) on partition 0 as its own flush, a moment apart;
    each one's answer and how long after the first was queued it came."""
    pipeline = journal(setup)
    began = time.monotonic()
    out: list[tuple[ErrorCode, float]] = [(ErrorCode.unknown_server_error, 0.0)] * len(sends)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)

        async def wait(i: int, promise: Any) -> None:
            result = await promise.wait()
            out[i] = (result.error, time.monotonic() - began)

        async with anyio.create_task_group() as waits:
            for i, (pid, seq) in enumerate(sends):
                waits.start_soon(
                    wait, i, pipeline.enqueue(setup.topic.topic_id, 0, *idempotent(pid, seq))
                )
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    return out


async def test_a_slow_upload_holds_back_only_its_producers_later_batches(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.store.before_put = lambda n: time.sleep(0.6) if n == 1 else None
    (first, _), (other, other_at), (later, later_at) = await answers(
        setup, [(7, 0), (8, 0), (7, 1)]
    )
    assert (first, other, later) == (ErrorCode.none,) * 3
    assert other_at < 0.4  # producer 8's batch did not wait for producer 7's upload
    assert later_at >= 0.6  # producer 7's next batch did
    await setup.kv.aclose()


async def test_a_failed_upload_fails_its_producers_later_batches_only(tmp_path: Path) -> None:
    setup = Setup(tmp_path)

    def fail_first(n: int) -> None:
        if n == 1:
            time.sleep(0.3)
            raise ObjectStoreError("disk full")

    setup.store.before_put = fail_first
    results = [error for error, _at in await answers(setup, [(7, 0), (8, 0), (7, 1)])]
    # Producer 7's second batch would follow a batch never written: answered with the
    # failure's retriable error, so that the producer sends both again in order.
    assert results == [ErrorCode.kafka_storage_error, ErrorCode.none, ErrorCode.kafka_storage_error]
    await setup.kv.aclose()
