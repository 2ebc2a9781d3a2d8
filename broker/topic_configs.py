"""The topic configs bucketlog knows: each one's type, default, check and documentation.

Rules:

- Every config Apache Kafka knows for a topic is here, checked the way Kafka's ConfigDef
  checks it (type, then range or allowed values) and stored in canonical form; anything
  wrong is INVALID_CONFIG with Kafka's message (`validate_topic_configs`).
- Only explicitly set configs are stored with a topic; the rest come from the broker's
  defaults (`agent.config.topic_defaults`, else Kafka's own default), and
  `topic_config_entries` describes both, with Kafka's synonym chain.
- Shared by the handlers that create topics and those that describe or alter configs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from broker.context import AgentServices
from metadata.errors import MetadataError

# DescribeConfigsResponse.ConfigSource
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5


# DescribeConfigsResponse.ConfigType
CONFIG_TYPE_IDS = {
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
        return CONFIG_TYPE_IDS.get(self.type, 0)

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
TOPIC_TYPE = "bucketlog.topic.type"
CLASSIC, LIGHTNING = "classic", "lightning"
_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

# One row per config, in name order: (name, type, Kafka's default, doc, validator, broker
# synonym, default synonym). Kept as a table, so the formatter leaves it alone.
# fmt: off
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey(
            TOPIC_TYPE, "STRING", CLASSIC,
            "classic: a produce is answered once its batches have offsets; lightning: once "
            "they are durable in the object store, with offset -1, and given offsets right "
            "after (bucketlog's own config).",
            one_of(CLASSIC, LIGHTNING), None,
        ),
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


def cleanup_policies(value: str) -> frozenset[str]:
    """What a cleanup.policy value holds: "delete", "compact", both or (empty) neither."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


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
