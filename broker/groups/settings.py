"""The group coordinator's settings (Apache Kafka's, with its defaults) and its clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class GroupConfig(Protocol):
    """The broker settings the group coordinator reads (`broker.config.BrokerConfig`)."""

    @property
    def group_min_session_timeout_ms(self) -> int: ...
    @property
    def group_max_session_timeout_ms(self) -> int: ...
    @property
    def group_initial_rebalance_delay_ms(self) -> int: ...
    @property
    def offsets_retention_minutes(self) -> float: ...
    @property
    def offsets_retention_check_interval_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Apache Kafka's group coordinator settings, with its defaults."""

    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    new_member_join_timeout_ms: int = 300_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes

    @classmethod
    def from_config(cls, config: GroupConfig) -> GroupSettings:
        return cls(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            offsets_retention_ms=int(config.offsets_retention_minutes * 60_000),
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
        )


@dataclass(frozen=True, slots=True)
class ConsumerGroupSettings:
    """Apache Kafka's settings of consumer-protocol groups (KIP-848), with its defaults."""

    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    max_size: int = 2**31 - 1  # group.consumer.max.size
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors; first: default

    def __post_init__(self) -> None:
        if not self.assignors:
            raise ValueError("group.consumer.assignors must name at least one assignor")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                "group.consumer.heartbeat.interval.ms must be below "
                "group.consumer.session.timeout.ms"
            )


class Clock:
    """Wall time for what is stored, monotonic time for deadlines."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)
