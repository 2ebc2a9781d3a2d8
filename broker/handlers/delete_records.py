"""DeleteRecords (v0-v2): move partitions' log start offsets forward, as Kafka's
kafka-delete-records and AdminClient.deleteRecords do (Kafka Streams trims its
repartition topics with it).

Per partition, as Apache Kafka answers (`ReplicaManager.deleteRecords`,
`Partition.deleteRecordsOnLeader`): the new low watermark (the log start offset, which
never moves back); OFFSET_OUT_OF_RANGE for an offset past the high watermark or negative
but -1 (which means the high watermark); UNKNOWN_TOPIC_OR_PARTITION for a partition that
does not exist; POLICY_VIOLATION for a topic whose cleanup.policy does not hold "delete".
The entries wholly below the new start are dropped, in this request's transaction up to
one step's worth and the rest by the retention job; their objects are deleted after the
delete delay (`metadata.lifecycle`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.agent import now_ms
from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.topic_configs import cleanup_policies
from metadata import lifecycle
from metadata.errors import MetadataError

API_KEY = 21


@api(API_KEY, 0, 2)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    answers = []
    for wanted in request.topics:
        if not access.authorize(ctx, Operation.DELETE, ResourceType.TOPIC, wanted.name):
            code = ErrorCode.topic_authorization_failed
            partitions = [
                {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
                for p in wanted.partitions
            ]
            answers.append({"name": wanted.name, "partitions": partitions})
            continue
        topic = await agent.topic(wanted.name)
        deletable = topic is not None and "delete" in cleanup_policies(
            agent.topic_config(topic, "cleanup.policy")
        )
        partitions = []
        for p in wanted.partitions:
            index, low_watermark, code = p.partition_index, -1, ErrorCode.none
            if topic is None or not 0 <= index < topic.partitions:
                code = ErrorCode.unknown_topic_or_partition
            elif not deletable:
                code = ErrorCode.policy_violation
            else:
                try:
                    step = await agent.kv.transact(
                        partial(
                            lifecycle.advance_log_start,
                            sub=agent.sub,
                            topic_id=topic.topic_id,
                            partition=index,
                            offset=p.offset,
                            now_ms=now_ms(),
                            delete_delay_ms=agent.config.object_delete_delay_ms,
                        )
                    )
                    low_watermark = step.log_start_offset
                except MetadataError as exc:
                    code = exc.error_code
            partitions.append(
                {"partition_index": index, "low_watermark": low_watermark, "error_code": code}
            )
        answers.append({"name": wanted.name, "partitions": partitions})
    return build(response_class(request), {"throttle_time": 0, "topics": answers})
