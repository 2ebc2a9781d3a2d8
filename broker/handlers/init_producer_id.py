"""InitProducerId: a fresh producer id (epoch 0) for each idempotent producer session; for
a transactional id, the id's producer with its epoch bumped (fencing the previous one)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.context import HandlerContext
from broker.entities import build, ms
from broker.handlers import api, response_class
from broker.transactions import init_transactional_producer
from metadata import cluster, producers
from metadata.errors import MetadataError

API_KEY = 22


def _answer(request: Any, code: ErrorCode, producer_id: int = -1, epoch: int = -1) -> Any:
    return build(
        response_class(request),
        {
            "throttle_time": 0,
            "error_code": code,
            "producer_id": producer_id,
            "producer_epoch": epoch,
        },
    )


@api(API_KEY, 0, 5)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    tid = request.transactional_id
    if tid is not None:
        if not access.authorize(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return _answer(request, ErrorCode.transactional_id_authorization_failed)
        try:
            producer_id, epoch = await init_transactional_producer(
                agent,
                request.transactional_id,
                ms(request.transaction_timeout),
                int(getattr(request, "producer_id", -1)),
                int(getattr(request, "producer_epoch", -1)),
            )
        except MetadataError as exc:
            code = exc.error_code
            if code == ErrorCode.producer_fenced and ctx.api_version < 4:
                code = ErrorCode.invalid_producer_epoch
            return _answer(request, code)
        return _answer(request, ErrorCode.none, producer_id, epoch)
    # Kafka 3.x+: an idempotent producer needs IDEMPOTENT_WRITE on the cluster, or WRITE
    # on some topic.
    if access.enabled(ctx) and not (
        access.authorize_cluster(ctx, Operation.IDEMPOTENT_WRITE, log=False)
        or access.authorize_any(ctx, Operation.WRITE, ResourceType.TOPIC)
    ):
        access.authorize_cluster(ctx, Operation.IDEMPOTENT_WRITE)  # counted and logged
        return _answer(request, ErrorCode.cluster_authorization_failed)

    def txn(tr: Any) -> int:
        producer_id = cluster.allocate_producer_id(tr, agent.sub)
        producers.put_producer(tr, agent.sub, producers.ProducerIdentity(producer_id, 0, None))
        return producer_id

    return _answer(request, ErrorCode.none, await agent.kv.transact(txn), 0)
