"""Produce: validate each partition's batch, queue it for the next flush, answer after commit.

Checks before queueing, each answered on its partition as Apache Kafka does: unknown
topic or partition, exactly one magic-2 batch (INVALID_RECORD), CRC (CORRUPT_MESSAGE),
size against max.message.bytes (MESSAGE_TOO_LARGE), no control batches from clients.
Records are never decoded here.

A topic whose message.timestamp.type is LogAppendTime gets each batch stamped with the
broker's clock as it is queued, as Kafka's LogValidator stamps it: a copy of the batch
with the LOG_APPEND_TIME bit, that time as maxTimestamp and a new CRC. The answer's
log_append_time is that time (-1 on CreateTime topics, whose batches stay views of the
request). A producer's own LOG_APPEND_TIME batch is refused there with INVALID_TIMESTAMP.
The config is read per request, so a change applies to the batches produced after it.

A compacted topic (cleanup.policy holds "compact") keeps the latest record per key, so a
record without a key has no place in it: such a batch is refused with INVALID_RECORD,
every keyless record listed, in Kafka's words (LogValidator.validateKey). Only for those
topics are the records decoded here.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.metrics import Meter
from broker.sync import Promise
from broker.topic_configs import LIGHTNING, TOPIC_TYPE, cleanup_policies
from metadata.log import AppendResult
from protocol.records import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    RecordBatchError,
    RecordBatchView,
    iter_records,
    validate_produce_records,
    with_log_append_time,
)

# One partition's batch that passed the checks: key, topic id, partition, records, their
# view, and whether the topic's message.timestamp.type is LogAppendTime.
# (topic, partition), topic id, partition, batch, its view, LogAppendTime?, lightning?
_Queued = tuple[tuple[str, int], bytes, int, bytes | memoryview, RecordBatchView, bool, bool]

API_KEY = 0
VALID_ACKS = (-1, 0, 1)
# How long before an acks=all request's timeout its batches stop being committed (a tenth
# of the timeout when that is less): the answer must reach the producer before it gives up.
COMMIT_MARGIN_S = 1.0
NO_TIMESTAMP = -1


def _partition_answer(
    index: int,
    result: AppendResult,
    message: str | None = None,
    log_append_time: int = NO_TIMESTAMP,
) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": result.error,
        "base_offset": result.base_offset,
        "log_append_time": log_append_time,
        "log_start_offset": result.log_start_offset,
        "record_errors": [],
        "error_message": message,
    }


def _record_errors(index: int, errors: list[tuple[int, str]]) -> dict[str, Any]:
    """Kafka's INVALID_RECORD answer for records refused one by one (LogValidator's
    processRecordErrors): each (index in the batch, why) listed, the first three in the
    message."""
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{why}')" for i, why in errors[:3])
    answer = _partition_answer(
        index,
        AppendResult(ErrorCode.invalid_record),
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]",
    )
    answer["record_errors"] = [
        {"batch_index": i, "batch_index_error_message": why} for i, why in errors
    ]
    return answer


def _keyless_records(view: RecordBatchView, topic: str, partition: int) -> list[tuple[int, str]]:
    """The records a compacted topic refuses: those without a key."""
    why = (
        f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}"
    )
    return [(i, why) for i, record in enumerate(iter_records(view)) if record.key is None]


def _invalid_timestamp(index: int, record_count: int) -> dict[str, Any]:
    """Kafka's answer to a producer's LOG_APPEND_TIME batch for a LogAppendTime topic
    (LogValidator.validateTimestamp): every record is in error."""
    answer = _partition_answer(
        index,
        AppendResult(ErrorCode.invalid_timestamp),
        "One or more records have been rejected due to invalid timestamp",
    )
    reason = "Producer should not set timestamp type to LogAppendTime."
    answer["record_errors"] = [
        {"batch_index": i, "batch_index_error_message": reason} for i in range(record_count)
    ]
    return answer


def _looks_transactional(records: bytes | memoryview | None) -> bool:
    """Whether a partition's (unvalidated) records start with a transactional v2 batch:
    Kafka checks the transactional id of such a request before its topics."""
    return (
        records is not None
        and len(records) >= HEADER_SIZE
        and records[16] == 2
        and RecordBatchView(records).is_transactional
    )


def commit_deadline(acks: int, timeout_ms: int, now: float) -> float | None:
    """When an acks=all request's batches must have been committed (time.monotonic()):
    Kafka answers REQUEST_TIMED_OUT once its timeout passes without them replicated, and
    the producer's own timer runs out about then. Here such a batch is then never
    committed (IngestPipeline.enqueue), so that a producer that gave up on it and sent it
    again, under a new epoch perhaps, does not find the first try written after all. The
    deadline comes a little before the timeout, so the answer reaches the producer while
    it still waits."""
    if acks != -1 or timeout_ms <= 0:
        return None
    timeout_s = timeout_ms / 1000
    return now + timeout_s - min(COMMIT_MARGIN_S, timeout_s / 10)


@api(API_KEY, 3, 11, advertised_min=0)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    deadline = commit_deadline(request.acks, timeout_ms, time.monotonic())
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    queued: list[_Queued] = []
    sizes: dict[tuple[str, int], tuple[int, int]] = {}  # records, bytes of valid batches
    known: set[str] = set()  # the topics named that are there

    # This request holds its connection's turn until its batches are queued: a producer's
    # pipelined requests reach the log in the order it sent them.
    promises: list[tuple[tuple[str, int], Promise[AppendResult], float | None]] = []
    authorizing = agent.authorizer is not None  # with authorization off, nothing more is paid
    refused_transactional = False  # a transactional batch for a topic refused above
    for topic_data in request.topic_data:
        name = topic_data.name
        if authorizing and not access.authorize(ctx, Operation.WRITE, ResourceType.TOPIC, name):
            # Before existence, as Kafka: a topic one may not write to is not revealed.
            for pdata in topic_data.partition_data:
                refused_transactional |= _looks_transactional(pdata.records)
                order.append((name, pdata.index))
                answers[(name, pdata.index)] = _partition_answer(
                    pdata.index, AppendResult(ErrorCode.topic_authorization_failed)
                )
            continue
        topic = await agent.topic(name)
        max_bytes, log_append_time, compacted, lightning = 0, False, False, False
        if topic is not None:
            max_bytes = int(agent.topic_config(topic, "max.message.bytes"))
            log_append_time = agent.topic_config(topic, "message.timestamp.type") == "LogAppendTime"
            compacted = "compact" in cleanup_policies(agent.topic_config(topic, "cleanup.policy"))
            lightning = agent.topic_config(topic, TOPIC_TYPE) == LIGHTNING
            known.add(name)
        for pdata in topic_data.partition_data:
            key = (name, pdata.index)
            order.append(key)
            if topic is None or not 0 <= pdata.index < topic.partitions:
                answers[key] = _partition_answer(
                    pdata.index, AppendResult(ErrorCode.unknown_topic_or_partition)
                )
                continue
            records = pdata.records or b""
            try:
                view = validate_produce_records(records, ctx.api_version, max_bytes)
                if view.is_transactional and view.producer_id < 0:
                    raise RecordBatchError(
                        ErrorCode.invalid_record, "A transactional batch needs a producer id"
                    )
                keyless = _keyless_records(view, name, pdata.index) if compacted else []
            except RecordBatchError as exc:
                answers[key] = _partition_answer(
                    pdata.index, AppendResult(exc.error_code), str(exc) or None
                )
                continue
            if keyless:
                answers[key] = _record_errors(pdata.index, keyless)
                continue
            sizes[key] = (view.record_count, len(records))
            # A view of the request frame (see protocol.produce): copied once, into
            # the flush's object. A batch to be stamped is copied before that, below.
            queued.append(
                (key, topic.topic_id, pdata.index, records, view, log_append_time, lightning)
            )

    # Kafka answers bad partitions first, and then judges what is left as a whole.
    transactional = any(view.is_transactional for *_rest, view, _stamp, _kind in queued)
    if (transactional or refused_transactional) and (
        request.transactional_id is None
        or (
            authorizing
            and not access.authorize(
                ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
            )
        )
    ):
        code = ErrorCode.transactional_id_authorization_failed
        for key in order:
            answers[key] = _partition_answer(key[1], AppendResult(code))
        queued = []
    elif request.acks not in VALID_ACKS:
        for key, *_rest in queued:
            answers[key] = _partition_answer(key[1], AppendResult(ErrorCode.invalid_required_acks))
        queued = []
    # What is left is appended, and stamped first where the topic says so (Kafka's
    # LogValidator takes the time for each partition it validates).
    stamped: dict[tuple[str, int], int] = {}
    for key, topic_id, partition, data, view, log_append_time, lightning in queued:
        if log_append_time:
            if view.timestamp_type == LOG_APPEND_TIME:
                answers[key] = _invalid_timestamp(partition, view.record_count)
                continue
            stamped[key] = now_ms = int(time.time() * 1000)
            view = with_log_append_time(view, now_ms)
            data = view.data
        if not lightning and agent.in_outage() and not view.is_transactional:
            lightning = True  # Ripcord: the metadata store is unreachable (broker.ripcord)
        if not lightning:
            # A topic turned classic: its batches come after those still to be sequenced.
            await agent.journal.wait_sequenced(topic_id, partition)
            promises.append(
                (key, agent.pipeline.enqueue(topic_id, partition, data, view, deadline), deadline)
            )
            continue
        if agent.leader_for(
            topic_id, partition
        ) != agent.node_id or not await agent.producer_sequences.may_accept(view.producer_id >= 0):
            # A lightning partition is answered by its leader alone, and by a new leader
            # only once what the others answered is sequenced: its batches come after.
            answers[key] = _partition_answer(
                partition, AppendResult(ErrorCode.not_leader_or_follower)
            )
            continue
        if view.is_transactional:
            answers[key] = _partition_answer(
                partition,
                AppendResult(ErrorCode.invalid_txn_state),
                f"Transactions are not supported on the lightning topic {key[0]}",
            )
            continue
        if view.producer_id >= 0:
            checked = await agent.producer_sequences.check(topic_id, partition, view)
            if checked.error != ErrorCode.none or checked.duplicate:
                answers[key] = _partition_answer(partition, checked)
                continue
        # Answered once durable, with offset -1 (broker.journal).
        promises.append((key, agent.journal.enqueue(topic_id, partition, data, view), None))
    ctx.end_turn()

    for key, promise, wait_until in promises:
        if wait_until is None:
            result = await promise.wait()
        else:
            # Not committed by the deadline: it never will be.
            result = (
                await promise.wait()
                if await promise.wait_until(wait_until)
                else AppendResult(ErrorCode.request_timed_out)
            )
        stamp = NO_TIMESTAMP
        # A retry was stamped when it was first appended, not now: Kafka answers that time
        # from its producer state, which here keeps no timestamps.
        if key in stamped and result.error == ErrorCode.none and not result.duplicate:
            stamp = stamped[key]
        answers[key] = _partition_answer(key[1], result, None, stamp)

    _meter(agent.meter, order, answers, sizes, known)
    if request.acks == 0:
        return None
    topics: dict[str, list[dict[str, Any]]] = {}
    for key in order:
        topics.setdefault(key[0], []).append(answers[key])
    return build(
        response_class(request),
        {
            "responses": [
                {"name": name, "partition_responses": parts} for name, parts in topics.items()
            ],
            "throttle_time": 0,
        },
    )


def _meter(
    meter: Meter,
    order: list[tuple[str, int]],
    answers: dict[tuple[str, int], dict[str, Any]],
    sizes: dict[tuple[str, int], tuple[int, int]],
    known: set[str],
) -> None:
    """Count what the Produce wrote, and its errors, per topic (broker.metrics). A
    duplicate's retry counts again: its bytes came in again."""
    named = set()
    for key in order:
        name = key[0]
        code = answers[key]["error_code"]
        if code != ErrorCode.none:
            if name in known:  # a topic that is there: its name is no client's invention
                meter.error(name, "Produce", code.name)
            continue
        named.add(name)
        records, size = sizes[key]
        meter.produced(name, records, size)
    for name in named:
        meter.request(name, "Produce")
