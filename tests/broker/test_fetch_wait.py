"""A long-polling Fetch on one real agent (SQLite metadata, local object store).

The agent runs in this process with its produce pipeline; the Fetch handler is called
directly, so a test can act at an exact point of it: between its read of the metadata
store and its wait.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from broker.agent import Agent
from broker.config import BrokerConfig
from broker.connection import RequestContext
from broker.entities import build
from broker.handlers import fetch, load_all, response_class
from metadata import topics
from protocol.codec import request_schema
from protocol.records import build_batch, iter_batches, validate_produce_records

TOPIC = "waited"
MAX_WAIT_MS = 4000
RECORD = (None, b"value", [], 1_700_000_000_000)


@asynccontextmanager
async def running_agent(tmp_path: Path, **config: Any) -> AsyncIterator[Agent]:
    """An agent with a topic of one partition, its produce pipeline running."""
    load_all()
    agent = Agent.open(BrokerConfig(data_dir=str(tmp_path), flush_interval_ms=1, **config))
    await agent.register()
    topic_id = uuid.uuid4().bytes
    await agent.kv.transact(
        lambda tr: topics.create_topic(tr, agent.sub, TOPIC, topic_id, 1, {}, 0)
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.pipeline.run)
        try:
            yield agent
        finally:
            tg.cancel_scope.cancel()
    await agent.aclose()


async def _append(agent: Agent, value: bytes = b"value") -> None:
    topic = await agent.topic(TOPIC, fresh=True)
    assert topic is not None
    data = build_batch([(None, value, [], 1_700_000_000_000)])
    view = validate_produce_records(data, 9, 1 << 20)
    result = await agent.pipeline.append(topic.topic_id, 0, data, view)
    assert result.error == ErrorCode.none


async def _fetch_request(agent: Agent, version: int, offset: int, min_bytes: int) -> Any:
    schema = request_schema(fetch.API_KEY, version)
    assert schema is not None
    topic = await agent.topic(TOPIC, fresh=True)
    assert topic is not None
    return build(
        schema,
        {
            "cluster_id": None,
            "replica_id": -1,
            "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait": MAX_WAIT_MS,
            "min_bytes": min_bytes,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": TOPIC,
                    "topic_id": uuid.UUID(bytes=topic.topic_id),
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                            "replica_directory_id": uuid.UUID(int=0),
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )


def _context(agent: Agent, version: int) -> RequestContext:
    return RequestContext(agent, version, 1, "test", "127.0.0.1:1")


def _after_first_read(agent: Agent, action: Callable[[], Any]) -> None:
    """Run `action` once, right after the Fetch's first read of the metadata store returns."""
    read = agent.kv.read
    done = False

    async def read_then_act(fn: Any, **kwargs: Any) -> Any:
        nonlocal done
        result = await read(fn, **kwargs)
        if not done:
            done = True
            await action()
        return result

    agent.kv.read = read_then_act  # type: ignore[method-assign]


def _offsets(answer: Any) -> list[int]:
    records = answer.responses[0].partitions[0].records
    data = b"".join(records.pieces) if hasattr(records, "pieces") else bytes(records or b"")
    return [view.base_offset for view in iter_batches(data)]


async def test_an_append_between_the_read_and_the_wait_wakes_the_fetch(tmp_path: Path) -> None:
    """The append lands after the Fetch read the store and before it waits: the Fetch must
    still see it at once, not after max_wait."""
    async with running_agent(tmp_path) as agent:
        await _append_then_fetch(agent)


async def _append_then_fetch(agent: Agent) -> None:
    request = await _fetch_request(agent, 12, 0, 1)
    _after_first_read(agent, lambda: _append(agent))
    started = time.monotonic()
    answer = await fetch.handle(request, _context(agent, 12))
    elapsed = time.monotonic() - started
    assert _offsets(answer) == [0]
    assert elapsed < MAX_WAIT_MS / 1000 / 2, f"woke after {elapsed:.2f}s"


@pytest.mark.parametrize(
    ("version", "code"),
    [(12, ErrorCode.unknown_topic_or_partition), (13, ErrorCode.unknown_topic_id)],
)
async def test_a_topic_deleted_during_a_long_poll_is_an_error_on_its_partition(
    tmp_path: Path, version: int, code: ErrorCode
) -> None:
    """Data is there but less than min_bytes, so the Fetch waits; the topic is deleted
    meanwhile. The answer names the partition's error, not UNKNOWN_SERVER_ERROR."""
    async with running_agent(tmp_path) as agent:
        await _fetch_while_deleting(agent, version, code)


async def _fetch_while_deleting(agent: Agent, version: int, code: ErrorCode) -> None:
    await _append(agent)
    topic = await agent.topic(TOPIC, fresh=True)
    assert topic is not None

    async def delete() -> None:
        await agent.kv.transact(lambda tr: topics.delete_topic(tr, agent.sub, TOPIC))
        agent.forget_topic(TOPIC)
        agent.notifier.notify((topic.topic_id, 0))

    request = await _fetch_request(agent, version, 0, 1 << 20)
    _after_first_read(agent, delete)
    answer = await fetch.handle(request, _context(agent, version))
    assert isinstance(answer, response_class(request))
    assert answer.error_code == ErrorCode.none
    partition = answer.responses[0].partitions[0]
    assert partition.error_code == code
    assert (partition.high_watermark, partition.log_start_offset) == (-1, -1)
    assert _offsets(answer) == []


async def test_a_fetch_that_looked_the_index_up_before_retention_still_gets_its_bytes(
    tmp_path: Path,
) -> None:
    """Retention drops the entry and the object is queued for deletion between the Fetch's
    index lookup and its read of the bytes: the delete delay keeps the object, so the
    Fetch answers its records; the next Fetch from there is out of range."""
    # No object cache: the bytes come from the store.
    async with running_agent(tmp_path, cache_bytes=0) as agent:
        await _append(agent, b"one")
        topic = await agent.topic(TOPIC, fresh=True)
        assert topic is not None

        async def expire() -> None:
            dropped = await agent.lifecycle.retain(topic.topic_id, 0, 0, -1)
            assert dropped == 1
            assert await agent.lifecycle.gc_pass() == 0  # the object is not due yet

        request = await _fetch_request(agent, 12, 0, 1)
        _after_first_read(agent, expire)
        answer = await fetch.handle(request, _context(agent, 12))
        assert _offsets(answer) == [0]
        again = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        partition = again.responses[0].partitions[0]
        assert partition.error_code == ErrorCode.offset_out_of_range
        assert (partition.log_start_offset, partition.high_watermark) == (1, 1)


async def test_a_fetch_whose_cached_entries_name_a_deleted_object_reads_the_index_again(
    tmp_path: Path,
) -> None:
    """The agent's chunk cache still names ingest files that compaction replaced and that
    are already deleted (a read later than the delete delay): the Fetch reads the index
    again and answers the records from the compacted object."""
    async with running_agent(tmp_path, cache_bytes=0, compaction_min_age_ms=0) as agent:
        for value in (b"one", b"two", b"three"):
            await _append(agent, value)
        first = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        assert _offsets(first) == [0, 1, 2]
        topic = await agent.topic(TOPIC, fresh=True)
        assert topic is not None
        cached = agent.chunks.lookup(topic.topic_id, 0, 0, 16, 1 << 20, 3)
        assert cached is not None and {e.object_key.split("/")[0] for e in cached} == {"ingest"}

        assert await agent.compaction.run_pass() == 1
        for entry in cached:  # the delete delay has passed: the ingest files are gone
            await agent.store.delete(entry.object_key)

        again = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        assert again.responses[0].partitions[0].error_code == ErrorCode.none
        assert _offsets(again) == [0, 1, 2]
        entries = agent.chunks.lookup(topic.topic_id, 0, 0, 16, 1 << 20, 3)
        assert entries is not None and {e.object_key.split("/")[0] for e in entries} == {
            "compacted"
        }


def _count_reads(agent: Agent) -> list[int]:
    """A counter of the agent's metadata reads from now on (one list item)."""
    read = agent.kv.read
    count = [0]

    async def counted(fn: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return await read(fn, **kwargs)

    agent.kv.read = counted  # type: ignore[method-assign]
    return count


async def test_a_fetch_at_the_end_it_was_just_given_waits_before_it_reads(tmp_path: Path) -> None:
    """A tailing consumer asks at once for the end the last answer gave it: with nothing
    committed to the partition since, the Fetch reads the metadata store only once woken,
    and answers what the append brought."""
    async with running_agent(tmp_path) as agent:
        await _append(agent)
        first = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        assert _offsets(first) == [0]
        request = await _fetch_request(agent, 12, 1, 1)
        reads = _count_reads(agent)
        answers: list[Any] = []

        async def tail() -> None:
            answers.append(await fetch.handle(request, _context(agent, 12)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(tail)
            await anyio.sleep(0.2)
            assert reads[0] == 0  # waiting, not read
            started = time.monotonic()
            await _append(agent, b"next")
        assert time.monotonic() - started < MAX_WAIT_MS / 1000 / 2
        (answer,) = answers
        assert _offsets(answer) == [1]
        assert answer.responses[0].partitions[0].high_watermark == 2


async def test_a_fetch_at_an_end_that_moved_since_reads_at_once(tmp_path: Path) -> None:
    """The partition grew after the last read found its end: the Fetch at that old end
    answers the new record at once, not after max_wait."""
    async with running_agent(tmp_path) as agent:
        await _append(agent)
        first = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        assert _offsets(first) == [0]
        await _append(agent, b"next")
        started = time.monotonic()
        answer = await fetch.handle(await _fetch_request(agent, 12, 1, 1), _context(agent, 12))
        assert time.monotonic() - started < MAX_WAIT_MS / 1000 / 2
        assert _offsets(answer) == [1]


async def test_a_fetch_at_an_end_another_agent_moved_is_woken_by_the_watermark_poll(
    tmp_path: Path,
) -> None:
    """Another agent appends after this one's last read found the end: this agent was not
    told, so its Fetch at that end waits; the watermark poll finds the append and wakes
    it, well before max_wait."""
    async with running_agent(tmp_path) as agent:
        other = Agent.open(BrokerConfig(data_dir=str(tmp_path), flush_interval_ms=1))
        await other.register()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(other.pipeline.run)
                tg.start_soon(agent.watermark_loop)
                await _append(agent)
                first = await fetch.handle(
                    await _fetch_request(agent, 12, 0, 1), _context(agent, 12)
                )
                assert _offsets(first) == [0]
                await _append(other, b"elsewhere")
                started = time.monotonic()
                answer = await fetch.handle(
                    await _fetch_request(agent, 12, 1, 1), _context(agent, 12)
                )
                assert time.monotonic() - started < MAX_WAIT_MS / 1000 / 2
                assert _offsets(answer) == [1]
                tg.cancel_scope.cancel()
        finally:
            await other.aclose()


async def test_an_append_after_a_read_of_the_end_is_held_for_the_next_fetch(
    tmp_path: Path,
) -> None:
    """The entry a flush commits joins the chunk entries the last Fetch read: the Fetch
    it wakes finds it without reading the index."""
    async with running_agent(tmp_path) as agent:
        await _append(agent)
        first = await fetch.handle(await _fetch_request(agent, 12, 0, 1), _context(agent, 12))
        assert _offsets(first) == [0]
        topic = await agent.topic(TOPIC, fresh=True)
        assert topic is not None
        await _append(agent, b"next")
        held = agent.chunks.lookup(topic.topic_id, 0, 1, 16, 1 << 20, 2)
        assert held is not None and [(e.base_offset, e.last_offset) for e in held] == [(1, 1)]
        misses = agent.chunks.stats["misses"]
        answer = await fetch.handle(await _fetch_request(agent, 12, 1, 1), _context(agent, 12))
        assert _offsets(answer) == [1]
        assert agent.chunks.stats["misses"] == misses
