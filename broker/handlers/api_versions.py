"""ApiVersions: the versions of every API in the registry, and the cluster's features."""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from broker.context import HandlerContext
from broker.entities import build
from broker.handlers import REGISTRY, api, response_class

API_KEY = 18


def _api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": a.key, "min_version": a.advertised_min, "max_version": a.max_version}
        for a in sorted(REGISTRY.values(), key=lambda a: a.key)
    ]


def unsupported_version_answer() -> Any:
    """Kafka answers an ApiVersions it cannot parse with v0 carrying UNSUPPORTED_VERSION."""
    return build(
        load_response_schema(API_KEY, 0),
        {"error_code": ErrorCode.unsupported_version, "api_keys": _api_keys()},
    )


@api(API_KEY, 0, 4)
async def handle(request: Any, ctx: HandlerContext) -> Any:
    return build(
        response_class(request),
        {
            "error_code": ErrorCode.none,
            "api_keys": _api_keys(),
            "throttle_time": 0,
            "supported_features": [],
            "finalized_features_epoch": -1,
            "finalized_features": [],
            "zk_migration_ready": False,
        },
    )
