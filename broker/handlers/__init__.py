"""The API registry: which Kafka APIs this broker answers, at which versions, and how.

Each handler module registers itself with `@api(key, min_version, max_version)`. The
registry drives request dispatch and the ApiVersions answer, so the two cannot disagree.
A handler is `async def handle(request, ctx) -> response entity | None` (None: no answer,
as for a Produce with acks=0).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.index import load_response_schema

if TYPE_CHECKING:
    from broker.context import HandlerContext

# (kio request entity of a registered version, its context) -> kio response entity or None
Handler = Callable[[Any, "HandlerContext"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler
    advertised_min: int

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


REGISTRY: dict[int, Api] = {}

_MODULES = (
    "api_versions",
    "metadata",
    "produce",
    "fetch",
    "list_offsets",
    "init_producer_id",
    "topics_admin",
    "configs",
    "acls",
    "cluster",
    "txn",
    "find_coordinator",
    "join_group",
    "sync_group",
    "heartbeat",
    "leave_group",
    "offset_commit",
    "offset_fetch",
    "list_groups",
    "describe_groups",
    "delete_groups",
    "offset_delete",
    "consumer_group_heartbeat",
    "consumer_group_describe",
    "delete_records",
    "sasl",
    "scram_credentials",
    "client_quotas",
)


def api(
    key: int, min_version: int, max_version: int, *, advertised_min: int | None = None
) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        name = fn.__module__.rsplit(".", 1)[-1]
        REGISTRY[key] = Api(
            key,
            name,
            min_version,
            max_version,
            fn,
            min_version if advertised_min is None else advertised_min,
        )
        return fn

    return register


def response_class(request: Any) -> type:
    """kio's response class for the request's API version (looked up once per version:
    kio resolves it by name, which costs more than the rest of a small answer)."""
    return _response_class(request.__api_key__, request.__version__)


@functools.cache
def _response_class(api_key: int, api_version: int) -> type:
    # Only versions a handler serves get here: at most every (key, version) kio knows.
    return load_response_schema(api_key, api_version)


def load_all() -> dict[int, Api]:
    for module in _MODULES:
        importlib.import_module(f"broker.handlers.{module}")
    return REGISTRY
