"""ListOffsets: earliest, latest, max timestamp and exact lookups by timestamp."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.offsets import offset_for_timestamp, offset_of_max_timestamp
from metadata import log as log_layer
from metadata import txns
from protocol.errors import RecordBatchError

API_KEY = 2
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
LEADER_EPOCH = 0


# The first ListOffsets version that may ask for each special timestamp.
MIN_VERSION = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


async def _answer(
    agent: AgentServices,
    topic: Any,
    partition: int,
    timestamp: int,
    read_committed: bool,
    version: int,
) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "partition_index": partition,
        "error_code": ErrorCode.none,
        "timestamp": -1,
        "offset": -1,
        "leader_epoch": -1,
        "old_style_offsets": [],
    }
    if topic is None or not 0 <= partition < topic.partitions:
        answer["error_code"] = ErrorCode.unknown_topic_or_partition
        return answer
    if timestamp < 0 and version < MIN_VERSION.get(timestamp, 2**15):
        answer["error_code"] = ErrorCode.unsupported_version
        return answer

    def read(tr: Any) -> tuple[log_layer.PartitionState | None, int]:
        state = log_layer.get_partition(tr, agent.sub, topic.topic_id, partition)
        if state is None:
            return None, -1
        lso = txns.last_stable_offset(
            tr, agent.sub, topic.topic_id, partition, state.high_watermark
        )
        return state, lso

    state, lso = await agent.kv.read(read)
    if state is None:
        answer["error_code"] = ErrorCode.unknown_topic_or_partition
        return answer
    if timestamp == LATEST:
        offset, ts = (lso if read_committed else state.high_watermark), -1
    elif timestamp in (EARLIEST, EARLIEST_LOCAL):
        offset, ts = state.log_start_offset, -1
    elif timestamp == LATEST_TIERED:
        offset, ts = -1, -1  # nothing is tiered: Kafka answers -1 without remote storage
    else:
        try:
            if timestamp == MAX_TIMESTAMP:
                offset, ts = await offset_of_max_timestamp(
                    agent, topic.topic_id, partition, state.log_start_offset
                )
            else:
                offset, ts = await offset_for_timestamp(
                    agent, topic.topic_id, partition, timestamp, state.log_start_offset
                )
        except RecordBatchError as exc:
            # Batches are stored as produced, records unread: one whose records do not
            # decode fails its partition, as a CorruptRecordException does in Kafka.
            answer["error_code"] = exc.error_code
            return answer
    answer.update(offset=offset, timestamp=ts, leader_epoch=LEADER_EPOCH if offset >= 0 else -1)
    return answer


@api(API_KEY, 1, 8)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    read_committed = getattr(request, "isolation_level", 0) == 1
    topics_out = []
    for t in request.topics:
        if not access.authorize(ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.name):
            parts = [
                {
                    "partition_index": p.partition_index,
                    "error_code": ErrorCode.topic_authorization_failed,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                    "old_style_offsets": [],
                }
                for p in t.partitions
            ]
            topics_out.append({"name": t.name, "partitions": parts})
            continue
        topic = await agent.topic(t.name)
        parts = [
            await _answer(
                agent, topic, p.partition_index, p.timestamp, read_committed, ctx.api_version
            )
            for p in t.partitions
        ]
        topics_out.append({"name": t.name, "partitions": parts})
    return build(response_class(request), {"throttle_time": 0, "topics": topics_out})
