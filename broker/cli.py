"""`bucketlog serve`: run one agent, or N agent processes sharing the same stores.

Every option can also be set with a BUCKETLOG_* environment variable (the option's name
in upper case, dashes as underscores: --flush-interval-ms -> BUCKETLOG_FLUSH_INTERVAL_MS).
The command line wins over the environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

import anyio

from broker.authentication import Authentication
from broker.config import SSL_CLIENT_AUTH, BrokerConfig
from broker.listeners import format_listeners, parse_listeners
from broker.registry import AgentRegistry
from broker.supervisor import DEFAULT_STOP_GRACE_S, OnAgentExit, supervise

ENV_PREFIX = "BUCKETLOG_"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def _on_agent_exit(value: str) -> OnAgentExit:
    try:
        return OnAgentExit(value.lower())
    except ValueError:
        choices = " or ".join(OnAgentExit)
        raise argparse.ArgumentTypeError(f"expected {choices}, got {value!r}") from None


def _listeners(value: str) -> tuple[object, ...]:
    try:
        return parse_listeners(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip().upper() for name in value.split(",") if name.strip())


def _latency_ms(value: str) -> tuple[float, float]:
    """MEDIAN,P99 in milliseconds, checked as the lognormal model takes them."""
    from metadata.injected_kv import Lognormal

    try:
        model = Lognormal.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return model.median_ms, model.p99_ms


# (option, type, default, help): the single list the parser and the environment share.
SERVE_OPTIONS: list[tuple[str, type | object, object, str]] = [
    ("host", str, "127.0.0.1", "address to listen on"),
    ("port", int, 9092, "port of the first agent"),
    ("advertised-host", str, None, "host name given to clients (default: --host)"),
    (
        "listeners",
        _listeners,
        None,
        "listeners in Kafka's form, NAME://HOST:PORT,... where NAME is PLAINTEXT, SSL,"
        " SASL_PLAINTEXT or SASL_SSL (default: PLAINTEXT://HOST:PORT); the first one is the"
        " agent's primary address, and with --agents N agent i serves each port + i",
    ),
    (
        "advertised-listeners",
        _listeners,
        None,
        "the address given to clients of each listener, in the same form (default: each"
        " listener's, with --advertised-host if given)",
    ),
    (
        "ssl-certfile",
        str,
        None,
        "PEM file of the agents' TLS certificate chain, and its key unless --ssl-keyfile"
        " (ssl.keystore.*)",
    ),
    ("ssl-keyfile", str, None, "PEM file of the TLS certificate's private key"),
    ("ssl-key-password", str, None, "password of the private key (ssl.key.password)"),
    (
        "ssl-cafile",
        str,
        None,
        "PEM file of the CAs client certificates are checked against (ssl.truststore.*)",
    ),
    (
        "ssl-client-auth",
        str,
        "none",
        f"whether TLS clients must present a certificate: {', '.join(SSL_CLIENT_AUTH)}"
        " (ssl.client.auth)",
    ),
    (
        "sasl-enabled-mechanisms",
        _names,
        None,
        "SASL mechanisms of the SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
        " (default: both SCRAM ones, and PLAIN with --sasl-plain-users)",
    ),
    (
        "sasl-plain-users",
        str,
        None,
        "file of the PLAIN mechanism's users, one name:password a line (# comments)",
    ),
    ("data-dir", str, "./bucketlog-data", "folder for the embedded default stores"),
    ("agents", int, 1, "number of agent processes (ports PORT..PORT+N-1)"),
    (
        "on-agent-exit",
        _on_agent_exit,
        OnAgentExit.RESTART,
        "with --agents N > 1, when an agent exits: restart it on its port (with back-off), "
        "or stop every agent and exit",
    ),
    (
        "agent-stop-grace-ms",
        int,
        int(DEFAULT_STOP_GRACE_S * 1000),
        "with --agents N > 1, on SIGTERM: how long the agents get to stop before SIGKILL",
    ),
    ("metadata", str, None, "metadata store URL (default sqlite:///<data-dir>/metadata.db)"),
    (
        "storage",
        str,
        None,
        "object store URL (default file://<data-dir>/objects; or s3://bucket/prefix)",
    ),
    ("s3-endpoint-url", str, None, "S3 endpoint, for S3-compatible stores"),
    ("s3-region", str, None, "S3 region (default: the AWS chain's, e.g. AWS_REGION)"),
    (
        "s3-addressing-style",
        str,
        None,
        "S3 addressing: path, virtual or auto (default: path with --s3-endpoint-url, else auto)",
    ),
    (
        "flush-interval-ms",
        int,
        None,
        "longest a produced batch waits for its flush (default: 2 local, 250 S3)",
    ),
    ("flush-bytes", int, None, "flush when this many bytes are buffered (default 4 MiB)"),
    (
        "inject-put-latency-ms",
        _latency_ms,
        None,
        "for benchmarks and tests only: every object-store PUT first waits a lognormal"
        " delay with this median and p99, MEDIAN,P99 in ms (e.g. 5,15)",
    ),
    (
        "inject-get-latency-ms",
        _latency_ms,
        None,
        "for benchmarks and tests only: the same for every object-store GET",
    ),
    ("cluster-name", str, "default", "name of the cluster inside the metadata store"),
    ("rack", str, None, "rack (zone) of this agent"),
    ("auto-create-topics", _bool, True, "create unknown topics on Metadata requests"),
    ("default-partitions", int, 1, "partitions of auto-created topics"),
    (
        "max-frame-bytes",
        int,
        100 * 1024 * 1024,
        "largest request accepted (socket.request.max.bytes)",
    ),
    (
        "queued-max-request-bytes",
        _positive,
        256 * 1024 * 1024,
        "memory for requests being received or handled, across all connections; past it"
        " agents stop reading until memory frees (queued.max.request.bytes)",
    ),
    ("cache-bytes", int, 256 * 1024 * 1024, "memory for recently written objects"),
    (
        "lease-ms",
        _positive,
        2_500,
        "agent lease: how soon the others see this agent gone if it dies unseen (its"
        " supervisor deregisters an agent it sees die at once)",
    ),
    (
        "lease-renew-ms",
        _positive,
        500,
        "how often an agent renews its lease; shorter than --lease-ms, which then outlasts"
        " several failed or slow renewals",
    ),
    (
        "log-retention-check-interval-ms",
        _positive,
        300_000,
        "how often retention.ms and retention.bytes are applied (log.retention.check.interval.ms)",
    ),
    (
        "object-delete-delay-ms",
        _positive,
        60_000,
        "how long an object nothing refers to any more is kept before it is deleted, for"
        " readers that looked it up just before (file.delete.delay.ms)",
    ),
    (
        "orphan-sweep-interval-ms",
        _positive,
        600_000,
        "how often the object store is listed for objects no metadata names",
    ),
    (
        "orphan-min-age-ms",
        _positive,
        3_600_000,
        "how old an object no metadata names must be before the sweep deletes it",
    ),
    (
        "journal-files-per-sequence",
        _positive,
        1000,
        "lightning topics: objects in one journal sequence before the agent starts another",
    ),
    (
        "journal-sequence-ms",
        _positive,
        600_000,
        "lightning topics: how long the agent writes one journal sequence at most",
    ),
    (
        "journal-sweep-interval-ms",
        _positive,
        10_000,
        "lightning topics: how often the journal is listed for objects answered and never"
        " sequenced (their agent died)",
    ),
    (
        "journal-idle-ms",
        _positive,
        10_000,
        "lightning topics: how long a journal sequence must have had no new object before"
        " the sweep sequences what its writer left",
    ),
    (
        "journal-upload-limit-ms",
        _positive,
        30_000,
        "lightning topics: a journal upload that takes longer is not answered with success"
        " (the sweep may skip its number)",
    ),
    ("compaction", _bool, True, "merge small objects into large ones (true or false)"),
    (
        "compaction-interval-ms",
        _positive,
        5_000,
        "how often an agent looks for compaction jobs (it runs them until none is left)",
    ),
    (
        "compaction-min-age-ms",
        _positive,
        30_000,
        "how old an ingest file must be before a job merges it (younger ones are read from"
        " the cache by consumers near the head)",
    ),
    (
        "compaction-max-inputs",
        _positive,
        32,
        "objects one job merges at most, at each level (WarpStream's 32)",
    ),
    (
        "compaction-max-job-bytes",
        _positive,
        64 * 1024 * 1024,
        "bytes of entries one job reads and holds at most (it holds its output too); also"
        " the size of a level-2 object, one partition's",
    ),
    (
        "compaction-max-entries",
        _positive,
        2_000,
        "chunk entries one job replaces at most: its commit (about 330 bytes an entry) stays"
        " far within FoundationDB's 10 MB and 5 s, and holds SQLite's write lock briefly",
    ),
    (
        "compaction-entry-bytes",
        _positive,
        256 * 1024,
        "largest chunk entry a job writes by merging consecutive ones: a Fetch reads whole"
        " entries, so this is about what it reads beyond its max.partition.fetch.bytes",
    ),
    ("compaction-max-jobs", _positive, 1, "compaction jobs one agent runs at once"),
    (
        "compaction-lease-ms",
        _positive,
        120_000,
        "how long a job's claim holds: a dead agent's job is planned again after it",
    ),
    (
        "compaction-retention-span-percent",
        _positive,
        10,
        "a level-2 object covers at most this share of its topic's retention.ms by record"
        " timestamps, so that time retention frees it at most that much late",
    ),
    (
        "log-cleaner-enable",
        _bool,
        True,
        "clean compacted topics: keep the latest record of each key (log.cleaner.enable)",
    ),
    (
        "log-cleaner-backoff-ms",
        _positive,
        15_000,
        "how often compacted partitions are looked at for cleaning (log.cleaner.backoff.ms)",
    ),
    (
        "log-cleaner-dedupe-buffer-size",
        _positive,
        128 * 1024 * 1024,
        "memory for the keys of one cleaning round; more distinct keys take more rounds"
        " (log.cleaner.dedupe.buffer.size)",
    ),
    (
        "group-min-session-timeout-ms",
        int,
        6_000,
        "shortest consumer session timeout accepted (group.min.session.timeout.ms)",
    ),
    (
        "group-max-session-timeout-ms",
        int,
        1_800_000,
        "longest consumer session timeout accepted (group.max.session.timeout.ms)",
    ),
    (
        "group-initial-rebalance-delay-ms",
        int,
        3_000,
        "wait for more members before a new group's first rebalance",
    ),
    (
        "offsets-retention-minutes",
        float,
        7 * 24 * 60,
        "keep an empty group's committed offsets this long (offsets.retention.minutes)",
    ),
    (
        "offsets-retention-check-interval-ms",
        int,
        600_000,
        "how often committed offsets are checked for expiry",
    ),
    ("log-level", str, "INFO", "logging level"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bucketlog", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a broker")
    for name, kind, default, text in SERVE_OPTIONS:
        env_value = _env(name)
        value: object = default
        if env_value is not None:
            value = kind(env_value) if callable(kind) else env_value
        env_name = ENV_PREFIX + name.upper().replace("-", "_")
        serve.add_argument(f"--{name}", type=kind, default=value, help=f"{text} [{env_name}]")  # type: ignore[arg-type]
    ripcord_env = _env("ripcord")
    serve.add_argument(
        "--ripcord",
        action="store_true",
        default=_bool(ripcord_env) if ripcord_env is not None else False,
        help="Ripcord mode: while the metadata store is unreachable, every topic's produces "
        "are answered as a lightning topic's, and an agent can start from the cluster's "
        f"snapshot in the object store [{ENV_PREFIX}RIPCORD]",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    host, port = args.host, args.port
    if args.listeners:
        host, port = args.listeners[0].host, args.listeners[0].port
    return BrokerConfig(
        host=host,
        port=port,
        listeners=args.listeners or (),
        advertised_listeners=args.advertised_listeners or (),
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ssl_key_password=args.ssl_key_password,
        ssl_cafile=args.ssl_cafile,
        ssl_client_auth=args.ssl_client_auth.lower(),
        sasl_enabled_mechanisms=args.sasl_enabled_mechanisms,
        sasl_plain_users=args.sasl_plain_users,
        advertised_host=args.advertised_host,
        data_dir=args.data_dir,
        metadata_url=args.metadata,
        storage_url=args.storage,
        s3_endpoint_url=args.s3_endpoint_url,
        s3_region=args.s3_region,
        s3_addressing_style=args.s3_addressing_style,
        flush_interval_ms=args.flush_interval_ms,
        flush_bytes=args.flush_bytes,
        inject_put_latency_ms=args.inject_put_latency_ms,
        inject_get_latency_ms=args.inject_get_latency_ms,
        cluster_name=args.cluster_name,
        rack=args.rack,
        auto_create_topics=args.auto_create_topics,
        default_partitions=args.default_partitions,
        max_frame_bytes=args.max_frame_bytes,
        queued_max_request_bytes=args.queued_max_request_bytes,
        cache_bytes=args.cache_bytes,
        lease_ms=args.lease_ms,
        lease_renew_ms=args.lease_renew_ms,
        log_retention_check_interval_ms=args.log_retention_check_interval_ms,
        object_delete_delay_ms=args.object_delete_delay_ms,
        orphan_sweep_interval_ms=args.orphan_sweep_interval_ms,
        orphan_min_age_ms=args.orphan_min_age_ms,
        journal_files_per_sequence=args.journal_files_per_sequence,
        journal_sequence_ms=args.journal_sequence_ms,
        journal_sweep_interval_ms=args.journal_sweep_interval_ms,
        journal_idle_ms=args.journal_idle_ms,
        journal_upload_limit_ms=args.journal_upload_limit_ms,
        ripcord=args.ripcord,
        compaction=args.compaction,
        compaction_interval_ms=args.compaction_interval_ms,
        compaction_min_age_ms=args.compaction_min_age_ms,
        compaction_max_inputs=args.compaction_max_inputs,
        compaction_max_job_bytes=args.compaction_max_job_bytes,
        compaction_max_entries=args.compaction_max_entries,
        compaction_entry_bytes=args.compaction_entry_bytes,
        compaction_max_jobs=args.compaction_max_jobs,
        compaction_lease_ms=args.compaction_lease_ms,
        compaction_retention_span_percent=args.compaction_retention_span_percent,
        log_cleaner_enable=args.log_cleaner_enable,
        log_cleaner_backoff_ms=args.log_cleaner_backoff_ms,
        log_cleaner_dedupe_buffer_size=args.log_cleaner_dedupe_buffer_size,
        group_min_session_timeout_ms=args.group_min_session_timeout_ms,
        group_max_session_timeout_ms=args.group_max_session_timeout_ms,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        offsets_retention_minutes=args.offsets_retention_minutes,
        offsets_retention_check_interval_ms=args.offsets_retention_check_interval_ms,
    )


def _run_many(args: argparse.Namespace, argv: Sequence[str], config: BrokerConfig) -> int:
    """One agent process per port PORT..PORT+N-1, each started as `bucketlog serve` with
    the same arguments and its own port (every listener's port + its index);
    broker.supervisor keeps them running, and broker.registry deregisters one that dies."""
    commands = {}
    addresses = {}
    for index in range(args.agents):
        agent = config.with_port(config.port + index)
        own = ["--agents", "1", "--port", str(agent.port)]
        if agent.listeners:
            own += ["--listeners", format_listeners(agent.listeners)]
        if agent.advertised_listeners:
            own += ["--advertised-listeners", format_listeners(agent.advertised_listeners)]
        commands[agent.port] = [sys.executable, "-m", "broker.cli", *argv, *own]
        addresses[agent.port] = (agent.advertised, agent.advertised_port)
    registry = AgentRegistry(config.resolved_metadata_url, config.cluster_name, addresses)
    try:
        return supervise(
            commands,
            on_exit=args.on_agent_exit,
            grace_s=args.agent_stop_grace_ms / 1000,
            on_death=registry.forget,
        )
    finally:
        registry.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
        # The TLS files and the PLAIN users are read now, so that a bad one stops here.
        Authentication.from_config(config)
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2, as for any bad option
    os.makedirs(config.data_dir, exist_ok=True)
    config = replace(config, data_dir=os.path.abspath(config.data_dir))
    if args.agents > 1:
        return _run_many(args, argv, config)
    from broker.memory import tune_allocator
    from broker.server import run_agent

    tune_allocator()
    try:
        anyio.run(run_agent, config)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
