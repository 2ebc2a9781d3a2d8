"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and brokers.

Topics: every config Apache Kafka knows for a topic can be described and set. Values are
checked the way Kafka's ConfigDef checks them (type, then range or allowed values) and
stored in canonical form; anything wrong is INVALID_CONFIG with Kafka's message. Only
explicitly set configs are stored; the rest come from the broker's defaults
(`agent.config.topic_defaults`, else Kafka's own default).

Brokers: a small read-only set describes this agent. Nothing about a broker can be changed
at run time, so altering a broker config is INVALID_REQUEST, as Kafka answers for configs
that are not dynamic. The default-broker resource (empty name) holds Kafka's dynamic
cluster-wide defaults: there are none here, so it describes as empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from broker.admin import topic_name_error
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from metadata import topics as topics_layer
from metadata.errors import MetadataError

DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44

# ConfigResource.Type
TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8

# DescribeConfigsResponse.ConfigSource
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# AlterConfigOp.OpType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}

# DescribeConfigsResponse.ConfigType
_CONFIG_TYPE_IDS = {
    "BOOLEAN": 1,
    "STRING": 2,
    "INT": 3,
    "SHORT": 4,
    "LONG": 5,
    "DOUBLE": 6,
    "LIST": 7,
    "CLASS": 8,
    "PASSWORD": 9,
}

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_DOUBLE = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_LIST_SEPARATOR = re.compile(r"\s*,\s*")


class ConfigError(Exception):
    """A config value Kafka's ConfigDef would refuse (INVALID_CONFIG)."""


def _invalid(name: str, value: Any, reason: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {name}: {reason}")


# -- validators: each gets the config name and the parsed value ---------------------------

Validator = Callable[[str, Any], None]


def at_least(minimum: int | float) -> Validator:
    def check(name: str, value: Any) -> None:
        if value < minimum:
            raise _invalid(name, value, f"Value must be at least {minimum}")

    return check


def between(minimum: int | float, maximum: int | float) -> Validator:
    def check(name: str, value: Any) -> None:
        if value < minimum:
            raise _invalid(name, value, f"Value must be at least {minimum}")
        if value > maximum:
            raise _invalid(name, value, f"Value must be no more than {maximum}")

    return check


def one_of(*allowed: str) -> Validator:
    def check(name: str, value: Any) -> None:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if item not in allowed:
                raise _invalid(name, item, "String must be one of: " + ", ".join(allowed))

    return check


def _gzip_level(name: str, value: Any) -> None:
    if value != -1 and not 1 <= value <= 9:
        raise _invalid(name, value, "Value must be between 1 and 9, or -1 for the default")


_THROTTLED_REPLICA = re.compile(r"^[0-9]+:[0-9]+$")


def _throttled_replicas(name: str, value: Any) -> None:
    if value == ["*"]:
        return
    for item in value:
        if not _THROTTLED_REPLICA.match(item):
            raise _invalid(
                name,
                ",".join(value),
                "must be the literal '*' or a list of replicas in the following format: "
                "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
            )


_FORMAT_VERSION = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?(-IV[0-9]+)?$")


def _format_version(name: str, value: Any) -> None:
    if not _FORMAT_VERSION.match(value):
        raise _invalid(name, value, f"Version `{value}` is not a valid version")


# -- the topic config schema --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: str  # Kafka's ConfigDef.Type name
    default: str | None  # Kafka's default, as DescribeConfigs shows it
    doc: str
    validator: Validator | None = None
    broker_synonym: str | None = None  # the broker config that supplies the default
    # What Kafka reports as the default's synonym when the broker sets nothing (for
    # retention.ms it is log.retention.hours=168, not log.retention.ms).
    default_synonym: tuple[str, str] | None = None

    @property
    def type_id(self) -> int:
        return _CONFIG_TYPE_IDS.get(self.type, 0)

    @property
    def is_list(self) -> bool:
        return self.type == "LIST"

    def parse(self, value: str) -> Any:
        """Kafka's ConfigDef.parseType plus the validator; raises ConfigError."""
        trimmed = value.strip()
        parsed: Any
        if self.type in ("INT", "LONG", "SHORT"):
            low, high = {
                "INT": (INT_MIN, INT_MAX),
                "LONG": (LONG_MIN, LONG_MAX),
                "SHORT": (-(2**15), 2**15 - 1),
            }[self.type]
            if not _INTEGER.match(trimmed) or not low <= int(trimmed) <= high:
                raise _invalid(self.name, value, f"Not a number of type {self.type}")
            parsed = int(trimmed)
        elif self.type == "DOUBLE":
            if not _DOUBLE.match(trimmed):
                raise _invalid(self.name, value, "Not a number of type DOUBLE")
            parsed = float(trimmed)
        elif self.type == "BOOLEAN":
            if trimmed.lower() not in ("true", "false"):
                raise _invalid(self.name, value, "Expected value to be either true or false")
            parsed = trimmed.lower() == "true"
        elif self.type == "LIST":
            parsed = [] if not trimmed else _LIST_SEPARATOR.split(trimmed)
        else:
            parsed = trimmed
        if self.validator is not None:
            self.validator(self.name, parsed)
        return parsed

    def canonical(self, value: str) -> str:
        """The value as it is stored and described: parsed, checked and printed back."""
        parsed = self.parse(value)
        if isinstance(parsed, bool):
            return "true" if parsed else "false"
        if isinstance(parsed, list):
            return ",".join(parsed)
        if isinstance(parsed, int):
            return str(parsed)
        return value.strip()


_MAX_LONG = str(LONG_MAX)
_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

# One row per config, in name order: (name, type, Kafka's default, doc, validator, broker
# synonym, default synonym). Kept as a table, so the formatter leaves it alone.
# fmt: off
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey(
            "cleanup.policy", "LIST", "delete",
            "How old log segments are discarded: delete, compact, or both.",
            one_of("compact", "delete"), "log.cleanup.policy",
        ),
        ConfigKey(
            "compression.gzip.level", "INT", "-1",
            "Compression level used when compression.type is gzip.",
            _gzip_level, "compression.gzip.level",
        ),
        ConfigKey(
            "compression.lz4.level", "INT", "9",
            "Compression level used when compression.type is lz4.",
            between(1, 17), "compression.lz4.level",
        ),
        ConfigKey(
            "compression.type", "STRING", "producer",
            "Final compression of the topic's data; producer keeps what the producer sent.",
            one_of(*_COMPRESSION_TYPES), "compression.type",
        ),
        ConfigKey(
            "compression.zstd.level", "INT", "3",
            "Compression level used when compression.type is zstd.",
            between(-131072, 22), "compression.zstd.level",
        ),
        ConfigKey(
            "delete.retention.ms", "LONG", "86400000",
            "How long delete tombstones are kept on compacted topics.",
            at_least(0), "log.cleaner.delete.retention.ms",
        ),
        ConfigKey(
            "file.delete.delay.ms", "LONG", "60000",
            "How long to wait before deleting a file from the filesystem.",
            at_least(0), "log.segment.delete.delay.ms",
        ),
        ConfigKey(
            "flush.messages", "LONG", _MAX_LONG,
            "Messages written between forced flushes (data is always durable here).",
            at_least(1), "log.flush.interval.messages",
        ),
        ConfigKey(
            "flush.ms", "LONG", _MAX_LONG,
            "Time between forced flushes (data is always durable here).",
            at_least(0), "log.flush.interval.ms",
        ),
        ConfigKey(
            "follower.replication.throttled.replicas", "LIST", "",
            "Replicas whose follower replication is throttled.",
            _throttled_replicas,
        ),
        ConfigKey(
            "index.interval.bytes", "INT", "4096",
            "How often an entry is added to the offset index.",
            at_least(0), "log.index.interval.bytes",
        ),
        ConfigKey(
            "leader.replication.throttled.replicas", "LIST", "",
            "Replicas whose leader replication is throttled.",
            _throttled_replicas,
        ),
        ConfigKey(
            "local.retention.bytes", "LONG", "-2",
            "Bytes kept locally when tiered storage is on (-2: retention.bytes).",
            at_least(-2), "log.local.retention.bytes",
        ),
        ConfigKey(
            "local.retention.ms", "LONG", "-2",
            "Time data is kept locally when tiered storage is on (-2: retention.ms).",
            at_least(-2), "log.local.retention.ms",
        ),
        ConfigKey(
            "max.compaction.lag.ms", "LONG", _MAX_LONG,
            "Longest time a message stays uncompacted.",
            at_least(1), "log.cleaner.max.compaction.lag.ms",
        ),
        ConfigKey(
            "max.message.bytes", "INT", "1048588",
            "Largest record batch size allowed, after compression.",
            at_least(0), "message.max.bytes",
        ),
        ConfigKey(
            "message.downconversion.enable", "BOOLEAN", "true",
            "Whether old message formats are down-converted for old consumers.",
            None, "log.message.downconversion.enable",
        ),
        ConfigKey(
            "message.format.version", "STRING", "3.0-IV1",
            "Deprecated message format version.",
            _format_version, "log.message.format.version",
        ),
        ConfigKey(
            "message.timestamp.after.max.ms", "LONG", _MAX_LONG,
            "How far a record's timestamp may be ahead of the broker's clock.",
            at_least(0), "log.message.timestamp.after.max.ms",
        ),
        ConfigKey(
            "message.timestamp.before.max.ms", "LONG", _MAX_LONG,
            "How far a record's timestamp may be behind the broker's clock.",
            at_least(0), "log.message.timestamp.before.max.ms",
        ),
        ConfigKey(
            "message.timestamp.difference.max.ms", "LONG", _MAX_LONG,
            "Deprecated: largest difference between a record's timestamp and the broker's clock.",
            at_least(0), "log.message.timestamp.difference.max.ms",
        ),
        ConfigKey(
            "message.timestamp.type", "STRING", "CreateTime",
            "Whether record timestamps are the producer's (CreateTime) or the broker's.",
            one_of("CreateTime", "LogAppendTime"), "log.message.timestamp.type",
        ),
        ConfigKey(
            "min.cleanable.dirty.ratio", "DOUBLE", "0.5",
            "Share of the log that must be dirty before it is compacted.",
            between(0, 1), "log.cleaner.min.cleanable.ratio",
        ),
        ConfigKey(
            "min.compaction.lag.ms", "LONG", "0",
            "Shortest time a message stays uncompacted.",
            at_least(0), "log.cleaner.min.compaction.lag.ms",
        ),
        ConfigKey(
            "min.insync.replicas", "INT", "1",
            "Replicas that must acknowledge a write with acks=all.",
            at_least(1), "min.insync.replicas",
        ),
        ConfigKey(
            "preallocate", "BOOLEAN", "false",
            "Whether segment files are preallocated.",
            None, "log.preallocate",
        ),
        ConfigKey(
            "remote.log.copy.disable", "BOOLEAN", "false",
            "Stop copying to tiered storage while keeping what was copied.",
        ),
        ConfigKey(
            "remote.log.delete.on.disable", "BOOLEAN", "false",
            "Delete tiered data when tiered storage is turned off for the topic.",
        ),
        ConfigKey(
            "remote.storage.enable", "BOOLEAN", "false",
            "Whether the topic uses Kafka's tiered storage.",
        ),
        ConfigKey(
            "retention.bytes", "LONG", "-1",
            "Largest size a partition may grow to before old data is discarded (-1: no limit).",
            None, "log.retention.bytes",
        ),
        ConfigKey(
            "retention.ms", "LONG", "604800000",
            "How long data is kept before it is discarded (-1: forever).",
            at_least(-1), "log.retention.ms", ("log.retention.hours", "168"),
        ),
        ConfigKey(
            "segment.bytes", "INT", "1073741824",
            "Size of one log segment file.",
            at_least(14), "log.segment.bytes",
        ),
        ConfigKey(
            "segment.index.bytes", "INT", "10485760",
            "Size of the index mapping offsets to file positions.",
            at_least(4), "log.index.size.max.bytes",
        ),
        ConfigKey(
            "segment.jitter.ms", "LONG", "0",
            "Largest random jitter subtracted from segment.ms.",
            at_least(0), "log.roll.jitter.ms", ("log.roll.jitter.hours", "0"),
        ),
        ConfigKey(
            "segment.ms", "LONG", "604800000",
            "Time after which a segment is rolled even if it is not full.",
            at_least(1), "log.roll.ms", ("log.roll.hours", "168"),
        ),
        ConfigKey(
            "unclean.leader.election.enable", "BOOLEAN", "false",
            "Whether a replica outside the ISR may become leader.",
            None, "unclean.leader.election.enable",
        ),
    )
}
# fmt: on


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """A topic's complete explicit config set, checked and canonical; raises MetadataError.

    Like Kafka's LogConfig.validate: null values, unknown names, unparsable or out-of-range
    values and contradictory pairs are all INVALID_CONFIG.
    """
    nulls = [name for name, value in configs.items() if value is None]
    if nulls:
        raise MetadataError(
            ErrorCode.invalid_config,
            "Null value not supported for topic configs: " + ",".join(nulls),
        )
    for name in configs:
        if name not in TOPIC_CONFIG_KEYS:
            raise MetadataError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
    canonical: dict[str, str] = {}
    try:
        for name, value in configs.items():
            canonical[name] = TOPIC_CONFIG_KEYS[name].canonical(value or "")
    except ConfigError as exc:
        raise MetadataError(ErrorCode.invalid_config, str(exc)) from None
    min_lag = int(canonical.get("min.compaction.lag.ms", "0"))
    max_lag = int(canonical.get("max.compaction.lag.ms", str(LONG_MAX)))
    if min_lag > max_lag:
        raise MetadataError(
            ErrorCode.invalid_config,
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})",
        )
    if canonical.get("remote.storage.enable") == "true":
        raise MetadataError(
            ErrorCode.invalid_config,
            "Tiered Storage functionality is disabled in the broker. "
            "Topic cannot be configured with remote log storage.",
        )
    return canonical


# -- describing configs -------------------------------------------------------------------


def topic_default(agent: AgentServices, key: ConfigKey) -> tuple[str | None, list[dict[str, Any]]]:
    """The value a topic gets when it sets nothing, and its synonym chain (Kafka's order)."""
    broker_value = agent.config.topic_defaults.get(key.name)
    if broker_value is not None and broker_value != key.default and key.broker_synonym:
        synonym = {
            "name": key.broker_synonym,
            "value": broker_value,
            "source": STATIC_BROKER_CONFIG,
        }
        return broker_value, [synonym]
    value = broker_value if broker_value is not None else key.default
    if key.broker_synonym is None:
        return value, []
    name, shown = key.default_synonym or (key.broker_synonym, value)
    return value, [{"name": name, "value": shown, "source": DEFAULT_CONFIG}]


def topic_config_entries(
    agent: AgentServices,
    explicit: Mapping[str, str],
    *,
    names: Iterable[str] | None = None,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[dict[str, Any]]:
    """DescribeConfigs entries for a topic whose explicit configs are `explicit`."""
    wanted = (
        TOPIC_CONFIG_KEYS.keys() if names is None else [n for n in names if n in TOPIC_CONFIG_KEYS]
    )
    entries = []
    for name in sorted(set(wanted)):
        key = TOPIC_CONFIG_KEYS[name]
        value, synonyms = topic_default(agent, key)
        if name in explicit:
            value = explicit[name]
            synonyms = [{"name": name, "value": value, "source": TOPIC_CONFIG}, *synonyms]
        entries.append(
            {
                "name": name,
                "value": value,
                "read_only": False,
                "config_source": synonyms[0]["source"] if synonyms else DEFAULT_CONFIG,
                "is_sensitive": False,
                "synonyms": synonyms if include_synonyms else [],
                "config_type": key.type_id,
                "documentation": key.doc if include_documentation else None,
            }
        )
    return entries


def broker_config_entries(
    agent: AgentServices, *, include_synonyms: bool, include_documentation: bool
) -> list[dict[str, Any]]:
    """This agent's configs, all read-only: nothing about a broker changes at run time."""
    cfg = agent.config
    static: list[tuple[str, str | None, str, str]] = [
        ("node.id", str(agent.node_id), "INT", "This agent's node id."),
        ("broker.id", str(agent.node_id), "INT", "This agent's node id."),
        ("listeners", f"PLAINTEXT://{cfg.host}:{cfg.port}", "STRING", "Where this agent listens."),
        (
            "advertised.listeners",
            f"PLAINTEXT://{cfg.advertised}:{cfg.port}",
            "STRING",
            "The address given to clients.",
        ),
        ("broker.rack", cfg.rack, "STRING", "The rack (zone) of this agent."),
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
        "config_type": _CONFIG_TYPE_IDS.get(kind, 0),
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
        if rtype == TOPIC:
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


def _non_topic_answer(agent: AgentServices, resource: Any, changed: list[str]) -> dict[str, Any] | None:
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
