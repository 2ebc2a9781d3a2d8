"""InitProducerId: a fresh producer id (epoch 0) for each idempotent producer session."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from broker.entities import build
from broker.handlers import api, response_class
from metadata import cluster, producers

API_KEY = 22
log = logging.getLogger(__name__)


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: Any) -> Any:
    agent = ctx.agent
    if request.transactional_id is not None:
        log.warning(
            "transactional producer %r refused: transactions are not enabled",
            request.transactional_id,
        )
        return build(
            response_class(request),
            {
                "throttle_time": 0,
                "error_code": ErrorCode.unsupported_version,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )

    def txn(tr: Any) -> int:
        producer_id = cluster.allocate_producer_id(tr, agent.sub)
        producers.put_producer(tr, agent.sub, producers.ProducerIdentity(producer_id, 0, None))
        return producer_id

    producer_id = await agent.kv.transact(txn)
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "producer_id": producer_id,
            "producer_epoch": 0,
        },
    )
