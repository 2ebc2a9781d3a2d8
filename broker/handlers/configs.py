"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and brokers.

Topics: every config Apache Kafka knows for a topic can be described and set, as
`broker.topic_configs` checks and describes them.

Brokers: a small read-only set describes this agent. Nothing about a broker can be changed
at run time, so altering a broker config is INVALID_REQUEST, as Kafka answers for configs
that are not dynamic. The default-broker resource (empty name) holds Kafka's dynamic
cluster-wide defaults: there are none here, so it describes as empty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from broker import access
from broker.access import Operation, ResourceType
from broker.admin import topic_name_error
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.listeners import format_listeners
from broker.topic_configs import (
    CONFIG_TYPE_IDS,
    DEFAULT_CONFIG,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG_KEYS,
    topic_config_entries,
    topic_default,
    validate_topic_configs,
)
from metadata import topics as topics_layer
from metadata.errors import MetadataError

DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44

# ConfigResource.Type
TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8

# AlterConfigOp.OpType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}


def _refused(ctx: HandlerContext, operation: Operation, rtype: int, name: str) -> ErrorCode | None:
    """Kafka's check of DESCRIBE_CONFIGS or ALTER_CONFIGS: on the topic, or on the cluster
    for a broker's configs; the error to answer, or None."""
    if rtype == TOPIC:
        if not access.authorize(ctx, operation, ResourceType.TOPIC, name):
            return ErrorCode.topic_authorization_failed
    elif rtype in (BROKER, BROKER_LOGGER) and not access.authorize_cluster(ctx, operation):
        return ErrorCode.cluster_authorization_failed
    return None


def broker_config_entries(
    agent: AgentServices, *, include_synonyms: bool, include_documentation: bool
) -> list[dict[str, Any]]:
    """This agent's configs, all read-only: nothing about a broker changes at run time."""
    cfg = agent.config
    static: list[tuple[str, str | None, str, str]] = [
        ("node.id", str(agent.node_id), "INT", "This agent's node id."),
        ("broker.id", str(agent.node_id), "INT", "This agent's node id."),
        (
            "listeners",
            format_listeners(cfg.bound_listeners),
            "STRING",
            "Where this agent listens.",
        ),
        (
            "advertised.listeners",
            format_listeners(cfg.advertised_endpoints),
            "STRING",
            "The address given to clients.",
        ),
        ("broker.rack", cfg.zone, "STRING", "The rack (zone) of this agent."),
        (
            "num.partitions",
            str(cfg.default_partitions),
            "INT",
            "Partitions of new topics by default.",
        ),
        (
            "auto.create.topics.enable",
            "true" if cfg.auto_create_topics else "false",
            "BOOLEAN",
            "Whether a Metadata request creates unknown topics.",
        ),
        (
            "socket.request.max.bytes",
            str(cfg.max_frame_bytes),
            "INT",
            "Largest request accepted.",
        ),
    ]
    defaults: list[tuple[str, str | None, str, str]] = [
        ("default.replication.factor", "1", "INT", "Replicas of new topics by default."),
        ("delete.topic.enable", "true", "BOOLEAN", "Whether topics can be deleted."),
    ]
    entries = []
    for name, value, kind, doc in static:
        source = DEFAULT_CONFIG if value is None else STATIC_BROKER_CONFIG
        entries.append(
            _broker_entry(name, value, kind, doc, source, include_synonyms, include_documentation)
        )
    for name, value, kind, doc in defaults:
        entries.append(
            _broker_entry(
                name, value, kind, doc, DEFAULT_CONFIG, include_synonyms, include_documentation
            )
        )
    for key in TOPIC_CONFIG_KEYS.values():
        if key.broker_synonym is None:
            continue
        value, synonyms = topic_default(agent, key)
        source = synonyms[0]["source"] if synonyms else DEFAULT_CONFIG
        entries.append(
            _broker_entry(
                key.broker_synonym,
                value,
                key.type,
                key.doc,
                source,
                include_synonyms,
                include_documentation,
            )
        )
    return sorted(entries, key=lambda e: e["name"])


def _broker_entry(
    name: str,
    value: str | None,
    kind: str,
    doc: str,
    source: int,
    include_synonyms: bool,
    include_documentation: bool,
) -> dict[str, Any]:
    synonyms = [{"name": name, "value": value, "source": source}] if value is not None else []
    return {
        "name": name,
        "value": value,
        "read_only": True,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": synonyms if include_synonyms else [],
        "config_type": CONFIG_TYPE_IDS.get(kind, 0),
        "documentation": doc if include_documentation else None,
    }


def _broker_id_error(agent: AgentServices, name: str, *, describing: bool) -> str | None:
    try:
        node_id = int(name)
    except ValueError:
        return f"Node id must be an integer, but it is: {name}"
    if node_id != agent.node_id:
        expected = f"{agent.node_id} or empty string" if describing else str(agent.node_id)
        return f"Unexpected broker id, expected {expected}, but received {name}"
    return None


@api(DESCRIBE_CONFIGS, 1, 4)
async def describe_configs(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    include_synonyms = bool(getattr(request, "include_synonyms", False))
    include_documentation = bool(getattr(request, "include_documentation", False))
    results = []
    for resource in request.resources:
        rtype, name = resource.resource_type, resource.resource_name
        keys = resource.configuration_keys or None  # null or empty: every config
        result: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": rtype,
            "resource_name": name,
            "configs": [],
        }
        refused = _refused(ctx, Operation.DESCRIBE_CONFIGS, rtype, name)
        if refused is not None:
            result.update(error_code=refused)
        elif rtype == TOPIC:
            reason = topic_name_error(name)
            topic = None if reason else await agent.topic(name, fresh=True)
            if reason:
                result.update(error_code=ErrorCode.invalid_topic_exception, error_message=reason)
            elif topic is None:
                result.update(error_code=ErrorCode.unknown_topic_or_partition)
            else:
                result["configs"] = topic_config_entries(
                    agent,
                    topic.configs,
                    names=keys,
                    include_synonyms=include_synonyms,
                    include_documentation=include_documentation,
                )
        elif rtype == BROKER:
            reason = None if name == "" else _broker_id_error(agent, name, describing=True)
            if reason:
                result.update(error_code=ErrorCode.invalid_request, error_message=reason)
            elif name != "":
                entries = broker_config_entries(
                    agent,
                    include_synonyms=include_synonyms,
                    include_documentation=include_documentation,
                )
                result["configs"] = [e for e in entries if keys is None or e["name"] in keys]
            # name == "": no dynamic cluster-wide broker defaults exist, nothing to list
        else:
            result.update(
                error_code=ErrorCode.invalid_request,
                error_message=f"Unsupported resource type: {rtype}",
            )
        results.append(result)
    return build(response_class(request), {"throttle_time": 0, "results": results})


# -- altering configs ---------------------------------------------------------------------


def _resource_answer(
    resource: Any, code: ErrorCode = ErrorCode.none, message: str | None = None
) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
    }


def _non_topic_answer(
    agent: AgentServices, resource: Any, changed: list[str]
) -> dict[str, Any] | None:
    """The answer for a resource that is not a topic we can alter (a broker, an unknown
    type, an illegal topic name), or None for a topic to go on with."""
    if resource.resource_type == BROKER:
        problem = _broker_change_error(agent, resource, changed)
        code = ErrorCode.invalid_request if problem else ErrorCode.none
        return _resource_answer(resource, code, problem)
    if resource.resource_type != TOPIC:
        return _resource_answer(
            resource, ErrorCode.invalid_request, f"Unknown resource type {resource.resource_type}"
        )
    name_error = _topic_resource_error(resource.resource_name)
    if name_error:
        return _resource_answer(resource, *name_error)
    return None


def _duplicate_resources(resources: Iterable[Any]) -> set[tuple[int, str]]:
    seen: set[tuple[int, str]] = set()
    duplicates: set[tuple[int, str]] = set()
    for resource in resources:
        ident = (resource.resource_type, resource.resource_name)
        (duplicates if ident in seen else seen).add(ident)
    return duplicates


def _precheck(resource: Any, duplicates: set[tuple[int, str]], *, incremental: bool) -> str | None:
    """Kafka's ConfigAdminManager.preprocess checks that hold for every resource type."""
    if (resource.resource_type, resource.resource_name) in duplicates:
        return "Each resource must appear at most once."
    names = [c.name for c in resource.configs]
    if len(names) != len(set(names)):
        return "Error due to duplicate config keys"
    nulls = [
        c.name
        for c in resource.configs
        if c.value is None and not (incremental and c.config_operation == DELETE)
    ]
    if nulls:
        return "Null value not supported for : " + ", ".join(nulls)
    if incremental:
        for c in resource.configs:
            if c.config_operation not in _OP_NAMES:
                return f"Unknown operations type {c.config_operation}"
    return None


def _broker_change_error(agent: AgentServices, resource: Any, changed: list[str]) -> str | None:
    if resource.resource_name != "":
        reason = _broker_id_error(agent, resource.resource_name, describing=False)
        if reason:
            return reason
    if changed:
        return "Cannot update these configs dynamically: Set(" + ", ".join(changed) + ")"
    return None


def _topic_resource_error(name: str) -> tuple[ErrorCode, str] | None:
    if name == "":
        return ErrorCode.invalid_request, "Default topic resources are not allowed."
    reason = topic_name_error(name)
    if reason:
        return ErrorCode.invalid_topic_exception, reason
    return None


def _unknown_topic(name: str) -> MetadataError:
    return MetadataError(
        ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
    )


def _replacing(_current: dict[str, str], *, wanted: dict[str, str | None]) -> dict[str, str | None]:
    """AlterConfigs: the wanted configs replace the topic's explicit ones."""
    return dict(wanted)


def _incremental(
    current: dict[str, str], *, ops: list[Any], defaults: dict[str, str | None]
) -> dict[str, str | None]:
    """IncrementalAlterConfigs: the operations applied to the topic's explicit configs."""
    return apply_incremental(current, ops, defaults)


async def _alter_topic(
    agent: AgentServices,
    name: str,
    compute: Callable[[dict[str, str]], dict[str, str | None]],
    validate_only: bool,
) -> None:
    """Apply `compute(current explicit configs) -> new explicit configs` in one transaction."""

    def txn(tr: Any) -> None:
        # Kafka checks the new configs before it checks that the topic exists.
        topic = topics_layer.get_topic(tr, agent.sub, name)
        new_configs = validate_topic_configs(compute(dict(topic.configs) if topic else {}))
        if topic is None:
            raise _unknown_topic(name)
        if not validate_only:
            topics_layer.replace_configs(tr, agent.sub, topic.topic_id, new_configs)

    if validate_only:
        await agent.kv.read(txn)
    else:
        await agent.kv.transact(txn)
        agent.forget_topic(name)


@api(ALTER_CONFIGS, 0, 2)
async def alter_configs(request: Any, ctx: HandlerContext) -> Any:
    """Legacy AlterConfigs: the given set replaces every explicit config of the resource."""
    agent = ctx.agent
    duplicates = _duplicate_resources(request.resources)
    answers = []
    for resource in request.resources:
        problem = _precheck(resource, duplicates, incremental=False)
        if problem:
            answers.append(_resource_answer(resource, ErrorCode.invalid_request, problem))
            continue
        refused = _refused(
            ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
        )
        if refused is not None:
            answers.append(_resource_answer(resource, refused))
            continue
        early = _non_topic_answer(agent, resource, [c.name for c in resource.configs])
        if early is not None:
            answers.append(early)
            continue
        wanted: dict[str, str | None] = {c.name: c.value for c in resource.configs}
        try:
            await _alter_topic(
                agent,
                resource.resource_name,
                partial(_replacing, wanted=wanted),
                request.validate_only,
            )
        except MetadataError as exc:
            answers.append(_resource_answer(resource, exc.error_code, exc.message or None))
            continue
        answers.append(_resource_answer(resource))
    return build(response_class(request), {"throttle_time": 0, "responses": answers})


def apply_incremental(
    current: Mapping[str, str], ops: Iterable[Any], defaults: Mapping[str, str | None]
) -> dict[str, str | None]:
    """The explicit configs after SET/DELETE/APPEND/SUBTRACT (Kafka's
    incrementalAlterConfigResource); APPEND and SUBTRACT only apply to LIST configs."""
    result: dict[str, str | None] = dict(current)
    for op in ops:
        name, kind = op.name, op.config_operation
        if kind == SET:
            result[name] = op.value
        elif kind == DELETE:
            result.pop(name, None)
        else:
            key = TOPIC_CONFIG_KEYS.get(name)
            if key is None or not key.is_list:
                raise MetadataError(
                    ErrorCode.invalid_config,
                    f"Can't {_OP_NAMES[kind]} to key {name} because its type is not LIST.",
                )
            base = result[name] if name in result else defaults.get(name)
            items = [i for i in (base or "").split(",") if i]
            for item in (op.value or "").split(","):
                if kind == APPEND and item not in items:
                    items.append(item)
                elif kind == SUBTRACT and item in items:
                    items.remove(item)
            result[name] = ",".join(items)
    return result


@api(INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def incremental_alter_configs(request: Any, ctx: HandlerContext) -> Any:
    agent = ctx.agent
    duplicates = _duplicate_resources(request.resources)
    answers = []
    for resource in request.resources:
        problem = _precheck(resource, duplicates, incremental=True)
        if problem:
            answers.append(_resource_answer(resource, ErrorCode.invalid_request, problem))
            continue
        refused = _refused(
            ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
        )
        if refused is not None:
            answers.append(_resource_answer(resource, refused))
            continue
        changed = [c.name for c in resource.configs if c.config_operation != DELETE]
        early = _non_topic_answer(agent, resource, changed)
        if early is not None:
            answers.append(early)
            continue
        defaults = {key.name: topic_default(agent, key)[0] for key in TOPIC_CONFIG_KEYS.values()}
        ops = list(resource.configs)
        try:
            await _alter_topic(
                agent,
                resource.resource_name,
                partial(_incremental, ops=ops, defaults=defaults),
                request.validate_only,
            )
        except MetadataError as exc:
            answers.append(_resource_answer(resource, exc.error_code, exc.message or None))
            continue
        answers.append(_resource_answer(resource))
    return build(response_class(request), {"throttle_time": 0, "responses": answers})
