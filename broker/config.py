"""Broker settings: one frozen value built from the command line and BUCKETLOG_* variables."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from broker.groups.assignors import ASSIGNORS
from broker.groups.settings import ConsumerGroupSettings
from broker.listeners import Listener, SecurityProtocol, advertised_for

if TYPE_CHECKING:
    from metadata.topics import Topic

# SASL mechanisms this broker can serve (Kafka's sasl.enabled.mechanisms names).
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
# ssl.client.auth values
SSL_CLIENT_AUTH = ("none", "requested", "required")
# How long level-0 inputs may wait before a paced compaction writes unpaced (ms).
COMPACTION_UNPACED_AFTER_MS = 120_000
DISK_CACHE_DEFAULT = 4 * 1024**3  # with S3, where the disk has room for it

# Topic configs a topic reports when it sets none itself (Apache Kafka's defaults).
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "bucketlog.topic.type": "classic",
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": "1073741824",
    "min.insync.replicas": "1",
    "message.timestamp.difference.max.ms": "9223372036854775807",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "9223372036854775807",
    "unclean.leader.election.enable": "false",
    "delete.retention.ms": "86400000",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "9223372036854775807",
}


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    data_dir: str = "./bucketlog-data"
    metadata_url: str | None = None  # default: sqlite:///<data_dir>/metadata.db
    storage_url: str | None = None  # default: file://<data_dir>/objects
    s3_endpoint_url: str | None = None
    s3_region: str | None = None  # default: the AWS chain's
    s3_addressing_style: str | None = None  # path, virtual or auto; see storage/s3.py
    flush_interval_ms: int | None = None  # default depends on the store
    # Benchmarks and tests only (storage.injected): every PUT / GET of the object store
    # first waits a lognormal delay with this (median, p99) in milliseconds.
    inject_put_latency_ms: tuple[float, float] | None = None
    inject_get_latency_ms: tuple[float, float] | None = None
    flush_bytes: int | None = None
    # A PUT not answered after this percentile of the recent PUT times is sent a second
    # time (storage.hedge); 0: never. Default: 95 on S3, 0 on the local store.
    put_hedge_percentile: float | None = None
    # HTTP port of /metrics, /healthz and /readyz (broker.metrics); 0: none.
    metrics_port: int = 0
    # Dollars per 1,000 object-store requests, for the modeled cost of each topic
    # (broker.costs). Defaults: S3 Standard, us-east-1 (https://aws.amazon.com/s3/pricing/):
    # PUT, COPY, POST, LIST $0.005; GET, SELECT $0.0004; DELETE free.
    price_put_per_1000: float = 0.005
    price_get_per_1000: float = 0.0004
    price_list_per_1000: float = 0.005
    price_delete_per_1000: float = 0.0
    cluster_name: str = "default"
    # The agent's zone (availability zone), registered as its rack (broker.zones).
    zone: str | None = None
    auto_create_topics: bool = True
    default_partitions: int = 1
    max_frame_bytes: int = 100 * 1024 * 1024
    # Bytes of requests being received or handled, across all connections.
    queued_max_request_bytes: int = 256 * 1024 * 1024
    cache_bytes: int = 256 * 1024 * 1024
    # The disk cache (storage.disk_cache); None: resolved by the store.
    disk_cache_bytes: int | None = None
    disk_cache_dir: str | None = None  # default: <data_dir>/disk-cache (agent-<port> in it)
    # The agent lease. A killed agent is named leader until its lease runs out, unless its
    # supervisor saw it die and deregistered it at once (broker.registry). Renewed every
    # 0.5 s, a 2.5 s lease drops a live agent only after four renewals in a row fail, or
    # one is held 2 s by a busy store (the longest time between two renewals seen with
    # SQLite on 2 saturated cores: 1.6 s). The others stop naming a dead agent in 2.5 s;
    # clients add their own delay (librdkafka 1-2 s: it re-reads Metadata once a second
    # while a leader is down). Kafka's KRaft brokers: a 9 s session, heartbeats every 2 s
    # (broker.session.timeout.ms, broker.heartbeat.interval.ms).
    lease_ms: int = 2_500
    lease_renew_ms: int = 500
    # The object lifecycle (broker.lifecycle), with Kafka's names where Kafka has one.
    log_retention_check_interval_ms: int = 300_000
    object_delete_delay_ms: int = 60_000  # Kafka: file.delete.delay.ms
    orphan_sweep_interval_ms: int = 600_000
    orphan_min_age_ms: int = 3_600_000
    # Compaction of small objects into large ones (broker.compaction).
    compaction: bool = True
    compaction_interval_ms: int = 5_000
    compaction_min_age_ms: int | None = None  # None: resolved by the store
    compaction_max_inputs: int = 32
    compaction_max_job_bytes: int = 64 * 1024 * 1024
    compaction_max_entries: int = 2_000
    compaction_entry_bytes: int = 256 * 1024
    compaction_promote_entry_bytes: int = 128 * 1024  # 0: never
    compaction_max_jobs: int = 1
    compaction_reads_at_once: int = 1
    compaction_workers: str = "process"  # or "thread"
    compaction_worker_nice: int = 10
    # Compaction in a process of its own beside the agent (broker.compactor); None: with
    # a local folder only.
    compaction_process: bool | None = None
    # Bytes per second a worker process writes a large local object at most (0: unpaced),
    # and how long level-0 inputs may have waited before jobs are written unpaced all the
    # same (compaction is behind).
    compaction_write_bytes_per_s: int = 0
    compaction_unpaced_after_ms: int = COMPACTION_UNPACED_AFTER_MS
    # The flushes packed into segment files in a local folder (storage.segments); None:
    # on for a local folder, and no store but a local folder takes True.
    local_segments: bool | None = None
    compaction_lease_ms: int = 120_000
    compaction_retention_span_percent: int = 5
    compaction_l2_max_inputs: int = 256
    compaction_l2_max_wait_ms: int = 600_000
    # Lightning topics' journal (broker.journal).
    journal_files_per_sequence: int = 1000
    journal_sequence_ms: int = 600_000
    journal_sweep_interval_ms: int = 10_000
    journal_idle_ms: int = 10_000
    journal_upload_limit_ms: int = 30_000
    # Ripcord mode (broker.ripcord): produce on while the metadata store is unreachable.
    ripcord: bool = False
    # Cleaning of compacted topics (broker.cleaning).
    log_cleaner_enable: bool = True
    log_cleaner_backoff_ms: int = 15_000
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    # Consumer groups (Apache Kafka's group coordinator settings and defaults).
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3_000
    offsets_retention_minutes: float = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000
    # Consumer-protocol groups (KIP-848), Apache Kafka's group.consumer.* and defaults.
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_max_size: int = 2**31 - 1
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")
    # Authorization (broker.authorizer): off unless `authorizer`; then Kafka's super.users
    # and allow.everyone.if.no.acl.found.
    authorizer: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    topic_defaults: dict[str, str] = field(default_factory=lambda: dict(TOPIC_CONFIG_DEFAULTS))
    # Listeners (broker.listeners); none given: one PLAINTEXT listener on host:port. When
    # given, host and port are the first listener's.
    listeners: tuple[Listener, ...] = ()
    advertised_listeners: tuple[Listener, ...] = ()
    # TLS (broker.tls): Kafka's ssl.keystore.* as PEM files, ssl.truststore.* as a CA file.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: str | None = None
    ssl_cafile: str | None = None
    ssl_client_auth: str = "none"
    # SASL (broker.sasl): None = SCRAM, and PLAIN when a users file is given.
    sasl_enabled_mechanisms: tuple[str, ...] | None = None
    sasl_plain_users: str | None = None  # a file of name:password lines

    @property
    def consumer_group_settings(self) -> ConsumerGroupSettings:
        return ConsumerGroupSettings(
            session_timeout_ms=self.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
            max_size=self.group_consumer_max_size,
            assignors=self.group_consumer_assignors,
        )

    def __post_init__(self) -> None:
        settings = self.consumer_group_settings  # its own checks, at start
        unknown = [a for a in settings.assignors if a not in ASSIGNORS]
        if unknown:
            raise ValueError(
                f"--group-consumer-assignors: unknown assignor(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(ASSIGNORS))}"
            )
        if self.put_hedge_percentile is not None and not 0 <= self.put_hedge_percentile < 100:
            raise ValueError(
                f"--put-hedge-percentile must be at least 0 and below 100, not"
                f" {self.put_hedge_percentile}"
            )
        self._check_security()
        if self.lease_ms <= 0 or self.lease_renew_ms <= 0:
            raise ValueError("--lease-ms and --lease-renew-ms must be positive")
        if self.lease_renew_ms >= self.lease_ms:
            raise ValueError(
                f"--lease-renew-ms ({self.lease_renew_ms}) must be shorter than --lease-ms"
                f" ({self.lease_ms}): an agent would drop out between two renewals"
            )
        if self.compaction_write_bytes_per_s and self.compaction_workers == "thread":
            raise ValueError(
                "--compaction-write-bytes-per-s is for worker processes: with"
                " --compaction-workers thread the outputs are written unpaced"
            )
        if self.local_segments and not self.is_local_store:
            raise ValueError(
                "--local-segments packs flushes into files of a local folder (file://);"
                f" {self.resolved_storage_url} is written by requests"
            )
        if self.compaction_write_bytes_per_s and not self.is_local_store:
            raise ValueError(
                "--compaction-write-bytes-per-s paces writes to a local folder (file://);"
                f" {self.resolved_storage_url} is written by requests"
            )
        if not self.authorizer and (self.super_users or self.allow_everyone_if_no_acl_found):
            raise ValueError(
                "--super-users and --allow-everyone-if-no-acl-found take effect only with"
                " --authorizer"
            )

    def _check_security(self) -> None:
        listeners = self.bound_listeners
        self.advertised_endpoints  # noqa: B018 -- raises ValueError when they do not match
        if self.ssl_client_auth not in SSL_CLIENT_AUTH:
            raise ValueError(
                f"--ssl-client-auth must be one of {', '.join(SSL_CLIENT_AUTH)},"
                f" not {self.ssl_client_auth!r}"
            )
        if any(listener.protocol.tls for listener in listeners):
            if not self.ssl_certfile:
                raise ValueError("an SSL or SASL_SSL listener needs --ssl-certfile")
            if self.ssl_client_auth != "none" and not self.ssl_cafile:
                raise ValueError(
                    f"--ssl-client-auth {self.ssl_client_auth} needs --ssl-cafile (the CAs"
                    " client certificates are checked against)"
                )
        for name in self.sasl_enabled_mechanisms or ():
            if name not in SASL_MECHANISMS:
                raise ValueError(
                    f"SASL mechanism {name!r} is not supported (supported:"
                    f" {', '.join(SASL_MECHANISMS)})"
                )
        if "PLAIN" in self.enabled_mechanisms and not self.sasl_plain_users:
            raise ValueError("SASL mechanism PLAIN needs --sasl-plain-users FILE")

    @property
    def enabled_mechanisms(self) -> tuple[str, ...]:
        if self.sasl_enabled_mechanisms is not None:
            return self.sasl_enabled_mechanisms
        return (("PLAIN",) if self.sasl_plain_users else ()) + SCRAM_MECHANISMS

    @property
    def bound_listeners(self) -> tuple[Listener, ...]:
        """Where this agent listens, the first one being its primary address."""
        return self.listeners or (Listener(SecurityProtocol.PLAINTEXT, self.host, self.port),)

    @property
    def advertised_endpoints(self) -> tuple[Listener, ...]:
        """The address given to clients of each listener, in the listeners' order."""
        return advertised_for(self.bound_listeners, self.advertised_listeners, self.advertised_host)

    @property
    def resolved_metadata_url(self) -> str:
        if self.metadata_url:
            return self.metadata_url
        return "sqlite://" + os.path.join(os.path.abspath(self.data_dir), "metadata.db")

    @property
    def resolved_storage_url(self) -> str:
        if self.storage_url:
            return self.storage_url
        return "file://" + os.path.join(os.path.abspath(self.data_dir), "objects")

    @property
    def is_local_store(self) -> bool:
        return self.resolved_storage_url.startswith("file://")

    def topic_config(self, topic: Topic, name: str) -> str:
        """A topic's config: its own value, else this broker's default ("" if none)."""
        value = topic.configs.get(name)
        return value if value is not None else self.topic_defaults.get(name, "")

    @property
    def compacts_apart(self) -> bool:
        """Whether compaction runs in a process of its own (--compaction-process)."""
        if not self.compaction:
            return False
        return (
            self.compaction_process if self.compaction_process is not None else self.is_local_store
        )

    @property
    def packs_flushes(self) -> bool:
        """Whether the agent's flushes go into segment files (--local-segments)."""
        return self.is_local_store and self.local_segments is not False

    @property
    def resolved_flush_interval_ms(self) -> int:
        if self.flush_interval_ms is not None:
            return self.flush_interval_ms
        # A local folder costs nothing per write; every S3 PUT costs money.
        return 2 if self.is_local_store else 250

    @property
    def resolved_compaction_min_age_ms(self) -> int:
        if self.compaction_min_age_ms is not None:
            return self.compaction_min_age_ms
        # Every byte waits this long in level 0 before level 1 takes it: with S3 30 s of
        # ingest files were a tenth of a 5-minute retention's bytes in the store
        # (integration/bench/README.md, 52nd pass). A local folder keeps 30 s: consumers
        # near the head read younger files from the writer's cache.
        return 30_000 if self.is_local_store else 10_000

    @property
    def resolved_disk_cache_bytes(self) -> int:
        if self.disk_cache_bytes is not None:
            return self.disk_cache_bytes
        # The local store's objects are on this disk already: a copy would read nothing less.
        if self.is_local_store:
            return 0
        # A catch-up read of many partitions wants the objects between its slowest and
        # its fastest partitions kept (integration/bench/README.md, 51st pass); a disk
        # shared with the metadata store is never filled past a quarter of its room.
        return min(DISK_CACHE_DEFAULT, _free_bytes(self.resolved_disk_cache_dir) // 4)

    @property
    def resolved_disk_cache_dir(self) -> str:
        """A folder of this agent's own: the agents of `--agents N` share the data folder
        (and may share --disk-cache-dir), each empties its folder when it starts."""
        base = self.disk_cache_dir or os.path.join(os.path.abspath(self.data_dir), "disk-cache")
        return os.path.join(base, f"agent-{self.port}")

    @property
    def resolved_put_hedge_percentile(self) -> float | None:
        """The hedging percentile; None: no hedging."""
        if self.put_hedge_percentile is not None:
            return self.put_hedge_percentile or None
        # A local write's time is the disk's, not a request's luck: a second one only adds.
        return None if self.is_local_store else 95.0

    @property
    def resolved_flush_bytes(self) -> int:
        if self.flush_bytes is not None:
            return self.flush_bytes
        return 4 * 1024 * 1024

    @property
    def frame_limit(self) -> int:
        """The largest request read: a frame must also fit the request memory."""
        return min(self.max_frame_bytes, self.queued_max_request_bytes)

    @property
    def advertised(self) -> str:
        """The primary advertised host: with the advertised port, the agent's identity."""
        return self.advertised_endpoints[0].host

    @property
    def advertised_port(self) -> int:
        return self.advertised_endpoints[0].port

    def with_port(self, port: int) -> BrokerConfig:
        """This config for the agent whose first port is `port`: every listener's port and
        advertised port move by as much."""
        offset = port - self.port
        return replace(
            self,
            port=port,
            listeners=tuple(listener.shifted(offset) for listener in self.listeners),
            advertised_listeners=tuple(a.shifted(offset) for a in self.advertised_listeners),
        )


def _free_bytes(path: str) -> int:
    """The free bytes of the file system that holds `path` (its nearest folder that
    exists: the disk cache's is made when the agent starts)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free
