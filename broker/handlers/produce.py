"""Produce: validate each partition's batch, queue it for the next flush, answer after commit.

Checks before queueing, each answered on its partition as Apache Kafka does: unknown
topic or partition, exactly one magic-2 batch (INVALID_RECORD), CRC (CORRUPT_MESSAGE),
size against max.message.bytes (MESSAGE_TOO_LARGE), no control batches from clients.
Records are never decoded here.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.sync import Promise
from metadata.log import AppendResult
from protocol.records import RecordBatchError, validate_produce_records

API_KEY = 0
VALID_ACKS = (-1, 0, 1)


def _partition_answer(
    index: int, result: AppendResult, message: str | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": result.error,
        "base_offset": result.base_offset,
        "log_append_time": -1,
        "log_start_offset": result.log_start_offset,
        "record_errors": [],
        "error_message": message,
    }


@api(API_KEY, 3, 11, advertised_min=0)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    queued: list[tuple[tuple[str, int], bytes, int, bytes | memoryview, Any]] = []

    # This request holds its connection's turn until its batches are queued: a producer's
    # pipelined requests reach the log in the order it sent them.
    promises: list[tuple[tuple[str, int], Promise[AppendResult]]] = []
    for topic_data in request.topic_data:
        name = topic_data.name
        topic = await agent.topic(name)
        for pdata in topic_data.partition_data:
            key = (name, pdata.index)
            order.append(key)
            if topic is None or not 0 <= pdata.index < topic.partitions:
                answers[key] = _partition_answer(
                    pdata.index, AppendResult(ErrorCode.unknown_topic_or_partition)
                )
                continue
            records = pdata.records or b""
            max_bytes = int(agent.topic_config(topic, "max.message.bytes"))
            try:
                view = validate_produce_records(records, ctx.api_version, max_bytes)
                if view.is_transactional and view.producer_id < 0:
                    raise RecordBatchError(
                        ErrorCode.invalid_record, "A transactional batch needs a producer id"
                    )
            except RecordBatchError as exc:
                answers[key] = _partition_answer(
                    pdata.index, AppendResult(exc.error_code), str(exc) or None
                )
                continue
            # A view of the request frame (see protocol.produce): copied once, into
            # the flush's object.
            queued.append((key, topic.topic_id, pdata.index, records, view))

    # Kafka answers bad partitions first, and then judges what is left as a whole.
    transactional = any(view.is_transactional for *_rest, view in queued)
    if transactional and request.transactional_id is None:
        code = ErrorCode.transactional_id_authorization_failed
        for key in order:
            answers[key] = _partition_answer(key[1], AppendResult(code))
        queued = []
    elif request.acks not in VALID_ACKS:
        for key, *_rest in queued:
            answers[key] = _partition_answer(key[1], AppendResult(ErrorCode.invalid_required_acks))
        queued = []
    for key, topic_id, partition, data, view in queued:
        promises.append((key, agent.pipeline.enqueue(topic_id, partition, data, view)))
    ctx.end_turn()

    for key, promise in promises:
        answers[key] = _partition_answer(key[1], await promise.wait())

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
