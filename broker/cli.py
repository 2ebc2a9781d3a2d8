"""`bucketlog serve`: run one agent, or N agent processes sharing the same stores.

Every option can also be set with a BUCKETLOG_* environment variable (the option's name
in upper case, dashes as underscores: --flush-interval-ms -> BUCKETLOG_FLUSH_INTERVAL_MS),
and in a TOML file given with `--config FILE` (or BUCKETLOG_CONFIG): a table of option
names without their dashes in front (`flush-interval-ms = 250`; `flush_interval_ms`
too). The command line wins over the environment, the environment over the file, the
file over the defaults. A bad value names the option and where it came from.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio

from broker import logformat
from broker.authentication import Authentication
from broker.config import COMPACTION_UNPACED_AFTER_MS, SSL_CLIENT_AUTH, BrokerConfig
from broker.groups.assignors import ASSIGNORS
from broker.listeners import format_listeners, parse_listeners
from broker.registry import AgentRegistry
from broker.supervisor import DEFAULT_STOP_GRACE_S, OnAgentExit, supervise

ENV_PREFIX = "BUCKETLOG_"


def env_name(option: str) -> str:
    """The environment variable of command-line option `option` (without its dashes)."""
    return ENV_PREFIX + option.upper().replace("-", "_")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(env_name(name), default)


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _flag(value: str) -> bool:
    """A flag without a value on the command line (store_true); true or false in the
    environment and the config file."""
    return _bool(value)


_FLAG = _flag


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def _assignors(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in ASSIGNORS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown assignor(s) {', '.join(unknown) or '(none given)'}; known: "
            f"{', '.join(sorted(ASSIGNORS))}"
        )
    return names


def _on_agent_exit(value: str) -> OnAgentExit:
    try:
        return OnAgentExit(value.lower())
    except ValueError:
        choices = " or ".join(OnAgentExit)
        raise argparse.ArgumentTypeError(f"expected {choices}, got {value!r}") from None


def _log_format(value: str) -> str:
    if value.lower() not in logformat.FORMATS:
        raise argparse.ArgumentTypeError(f"expected {', '.join(logformat.FORMATS)}, got {value!r}")
    return value.lower()


COMPACTION_WORKERS = ("process", "thread")


def _compaction_workers(value: str) -> str:
    if value.lower() not in COMPACTION_WORKERS:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(COMPACTION_WORKERS)}, got {value!r}"
        )
    return value.lower()


def _niceness(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not 0 <= number <= 19:
        raise argparse.ArgumentTypeError(f"expected 0 to 19, got {number}")
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or a positive number, got {value!r}")
    return number


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def _event_loop(value: str) -> str:
    if value.lower() not in EVENT_LOOPS:
        raise argparse.ArgumentTypeError(f"expected {', '.join(EVENT_LOOPS)}, got {value!r}")
    return value.lower()


def _uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


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
        "put-hedge-percentile",
        float,
        None,
        "send a flush's PUT a second time once it takes longer than this percentile of"
        " the recent PUT times; 0: never (default: 95 on S3, 0 on the local store)",
    ),
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
    (
        "metrics-port",
        int,
        0,
        "serve /metrics (Prometheus), /healthz and /readyz over HTTP on this port of the"
        " agent's host (with --agents N, agent i on this port + i); 0: not served",
    ),
    ("price-put-per-1000", float, 0.005, "dollars per 1,000 PUTs, for each topic's cost"),
    ("price-get-per-1000", float, 0.0004, "dollars per 1,000 GETs, for each topic's cost"),
    ("price-list-per-1000", float, 0.005, "dollars per 1,000 LISTs, for each topic's cost"),
    ("price-delete-per-1000", float, 0.0, "dollars per 1,000 DELETEs, for each topic's cost"),
    ("cluster-name", str, "default", "name of the cluster inside the metadata store"),
    (
        "zone",
        str,
        None,
        "the agent's zone (availability zone), registered as its rack; clients naming it"
        " with bucketlog_az=ZONE in their client.id are served by the agents of their zone",
    ),
    ("rack", str, None, "the older name of --zone"),
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
        "disk-cache-bytes",
        _non_negative,
        None,
        "disk for objects of many partitions that a catch-up read reads whole once, for"
        " all of them, for the files the agent flushes, and for level-2 compaction's inputs;"
        " 0: none (default with S3: 4 GiB, or a quarter of its disk's free room if less; 0"
        " with the local store)",
    ),
    (
        "disk-cache-dir",
        str,
        None,
        "the disk cache's folder, in which each agent keeps its own, agent-<port>"
        " (default: <data-dir>/disk-cache)",
    ),
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
        None,
        "how old an ingest file must be before a job merges it (younger ones are read from"
        " the cache by consumers near the head; default 30000 with a file:// store, 10000"
        " with S3)",
    ),
    (
        "compaction-max-inputs",
        _positive,
        32,
        "ingest files one level-1 job merges at most (WarpStream's 32)",
    ),
    (
        "compaction-max-job-bytes",
        _positive,
        64 * 1024 * 1024,
        "bytes of entries one job reads and holds at most (it holds its output too); also"
        " the size of a level-2 object (the runs of one or a few partitions)",
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
    (
        "compaction-promote-entry-bytes",
        _non_negative,
        128 * 1024,
        "an ingest file whose every chunk entry holds at least this many bytes enters"
        " level 1 as it is, without a level-1 job's copy (a job would merge each entry with"
        " one smaller neighbour at most, when this is half of --compaction-entry-bytes);"
        " 0: never",
    ),
    ("compaction-max-jobs", _positive, 1, "compaction jobs one agent runs at once"),
    (
        "compaction-reads-at-once",
        _positive,
        1,
        "GETs of its inputs one compaction job has under way at once",
    ),
    (
        "compaction-workers",
        _compaction_workers,
        "process",
        "where a compaction job reads, builds and uploads: process (worker processes of the"
        " agent, one per job at once, at a lower priority) or thread (threads of the agent,"
        " which share its GIL with the requests)",
    ),
    (
        "compaction-worker-nice",
        _niceness,
        None,
        "how much lower the priority of compaction's worker processes is than the agent's"
        " (0-19, as nice(1); default 10; only with --compaction-workers process)",
    ),
    (
        "compaction-process",
        _bool,
        None,
        "run compaction (plans, claims, builds, commits) in a process of its own beside the"
        " agent, with its own connections to the stores, so that its metadata work shares"
        " neither the agent's GIL nor its event loop (true or false; default true with a"
        " file:// store: with S3 the agent's cache saves compaction GETs of recent files)",
    ),
    (
        "local-segments",
        _bool,
        None,
        "pack the agent's flushes into segment files of the local folder instead of a new"
        " file each (true or false; default true with a file:// store, which alone takes it)",
    ),
    (
        "compaction-write-bytes-per-s",
        _non_negative,
        None,
        "how fast a compaction worker process writes an output to the local store at most,"
        " in bytes per second, while compaction keeps up (see --compaction-unpaced-after-ms;"
        " default 0: as fast as the disk takes it, as Kafka's"
        " log.cleaner.io.max.bytes.per.second is unlimited by default); only with"
        " --compaction-workers process and a file:// store",
    ),
    (
        "compaction-unpaced-after-ms",
        _positive,
        None,
        "with --compaction-write-bytes-per-s: a level-1 job whose oldest input has waited"
        " longer than this is written unpaced, and so are the jobs after it until one's"
        " inputs are younger (compaction has fallen behind its pace; default 120000)",
    ),
    (
        "compaction-lease-ms",
        _positive,
        120_000,
        "how long a job's claim holds: a dead agent's job is planned again after it",
    ),
    (
        "compaction-retention-span-percent",
        _positive,
        5,
        "a level-2 object covers at most this share of its topic's retention.ms by record"
        " timestamps, so that time retention frees it at most that much late",
    ),
    (
        "compaction-l2-max-inputs",
        _positive,
        256,
        "level-1 objects one level-2 job merges at most; a partition's level-1 entries in"
        " that many objects start a level-2 job (--compaction-max-entries bounds it too)",
    ),
    (
        "compaction-l2-max-wait-ms",
        _positive,
        600_000,
        "how long a partition's oldest level-1 data waits at most before a level-2 job"
        " merges it (once it is in two objects); a topic with time retention waits at most"
        " its span too (--compaction-retention-span-percent of retention.ms)",
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
    (
        "group-consumer-session-timeout-ms",
        _positive,
        45_000,
        "session timeout of consumer-protocol (KIP-848) group members"
        " (group.consumer.session.timeout.ms)",
    ),
    (
        "group-consumer-heartbeat-interval-ms",
        _positive,
        5_000,
        "heartbeat interval given to consumer-protocol group members"
        " (group.consumer.heartbeat.interval.ms)",
    ),
    (
        "group-consumer-max-size",
        _positive,
        2**31 - 1,
        "most members of one consumer-protocol group (group.consumer.max.size)",
    ),
    (
        "group-consumer-assignors",
        _assignors,
        "uniform,range",
        "server-side assignors of consumer-protocol groups, comma-separated, the first the"
        " default (group.consumer.assignors: uniform, range)",
    ),
    (
        "super-users",
        str,
        "",
        "with --authorizer: principals allowed everything, separated by ';'"
        " (User:admin;User:ops; Kafka's super.users)",
    ),
    (
        "event-loop",
        _event_loop,
        "auto",
        "the agent's event loop: uvloop, asyncio (the standard library's), or auto: uvloop"
        " where it is installed, else asyncio",
    ),
    ("log-level", str, "INFO", "logging level"),
    ("log-format", _log_format, "text", "log lines as text, logfmt (key=value) or json"),
]


class ConfigError(ValueError):
    """A value of the environment or of the config file that cannot be taken."""


def _convert(name: str, kind: Any, value: object, source: str) -> object:
    """`value` of option `name` from `source` as the option takes it."""
    try:
        if isinstance(value, str):
            return kind(value)
        if kind in (_bool, _flag) and isinstance(value, bool):
            return value
        if kind in (int, _positive) and isinstance(value, int) and not isinstance(value, bool):
            return kind(str(value))
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{source}: {name}: invalid value {value!r}: {exc}") from None
    raise ConfigError(f"{source}: {name}: invalid value {value!r} (a {type(value).__name__})")


def load_config_file(path: str) -> dict[str, object]:
    """The options of a TOML config file, by option name (checked: known names only)."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    known = {name for name, *_ in SERVE_OPTIONS + SERVE_FLAGS}
    values = {}
    for key, value in table.items():
        name = key.replace("_", "-")
        if name not in known:
            raise ConfigError(f"{path}: {key}: not an option of bucketlog serve")
        values[name] = value
    return values


# Options without a value: (name, _FLAG, default, help).
SERVE_FLAGS: list[tuple[str, type | object, object, str]] = [
    (
        "ripcord",
        _FLAG,
        False,
        "Ripcord mode: while the metadata store is unreachable, every topic's produces are"
        " answered as a lightning topic's, and an agent can start from the cluster's"
        " snapshot in the object store",
    ),
    (
        "authorizer",
        _FLAG,
        False,
        "check Kafka ACLs on every request (Kafka's authorizer.class.name set to its"
        " StandardAuthorizer); ACLs are managed with CreateAcls, DescribeAcls and"
        " DeleteAcls (kafka-acls)",
    ),
    (
        "allow-everyone-if-no-acl-found",
        _FLAG,
        False,
        "with --authorizer: a resource no ACL applies to is open to everyone"
        " (allow.everyone.if.no.acl.found)",
    ),
]


def build_parser(
    file_values: dict[str, object] | None = None, file: str = ""
) -> argparse.ArgumentParser:
    """The command line, each option's default taken from the environment, else from
    the config file's values (`file_values`, read from `file`), else its own."""
    file_values = file_values or {}
    parser = argparse.ArgumentParser(prog="bucketlog", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a broker")
    serve.add_argument(
        "--config",
        default=_env("config"),
        metavar="FILE",
        help=f"a TOML file of options (the environment and the command line win over it) "
        f"[{env_name('config')}]",
    )
    for name, kind, default, text in SERVE_OPTIONS + SERVE_FLAGS:
        env_value = _env(name)
        value: object = default
        if env_value is not None:
            value = _convert(name, kind, env_value, f"environment {env_name(name)}")
        elif name in file_values:
            value = _convert(name, kind, file_values[name], file)
        if kind is _FLAG:
            serve.add_argument(
                f"--{name}", action="store_true", default=value, help=f"{text} [{env_name(name)}]"
            )
            continue
        serve.add_argument(
            f"--{name}",
            type=kind,  # type: ignore[arg-type]
            default=value,
            help=f"{text} [{env_name(name)}]",
        )
    return parser


def parse_serve_args(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the arguments of a command line, with the environment and the
    config file it names (--config, or BUCKETLOG_CONFIG) under it. A bad value exits with
    status 2 and a message naming the option and its source, as a bad flag does."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--config", default=_env("config"))
    known, _rest = first.parse_known_args(argv)
    try:
        file_values = load_config_file(known.config) if known.config else {}
        parser = build_parser(file_values, known.config or "")
    except ConfigError as exc:
        first.prog = "bucketlog serve"
        first.error(str(exc))  # exits with status 2, as for any bad option
    return parser, parser.parse_args(argv)


def _super_users(value: str) -> frozenset[str]:
    from broker.authorizer import parse_super_users

    return parse_super_users(value)


def _worker_nice(workers: str, nice: int | None) -> int:
    """The niceness of compaction's worker processes (none with worker threads)."""
    if nice is None:
        return 10 if workers == "process" else 0
    if workers == "thread" and nice:
        raise ValueError(
            "--compaction-worker-nice is for worker processes: with --compaction-workers"
            " thread the jobs run at the agent's own priority"
        )
    return nice


def _unpaced_after(pace: int | None, after_ms: int | None) -> int:
    """How long compaction's inputs wait before its jobs go unpaced (only with a pace)."""
    if after_ms is None:
        return COMPACTION_UNPACED_AFTER_MS
    if not pace:
        raise ValueError(
            "--compaction-unpaced-after-ms takes effect only with"
            " --compaction-write-bytes-per-s: without a pace every job is written unpaced"
        )
    return after_ms


def _zone(zone: str | None, rack: str | None) -> str | None:
    """The agent's zone from --zone and its older name --rack (empty: none)."""
    if zone is not None and rack is not None and zone != rack:
        raise ValueError(
            f"--zone {zone!r} and --rack {rack!r} differ: --rack is the older name of"
            " --zone, give one of them"
        )
    value = zone if zone is not None else rack
    return value or None


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
        put_hedge_percentile=args.put_hedge_percentile,
        metrics_port=args.metrics_port,
        price_put_per_1000=args.price_put_per_1000,
        price_get_per_1000=args.price_get_per_1000,
        price_list_per_1000=args.price_list_per_1000,
        price_delete_per_1000=args.price_delete_per_1000,
        flush_bytes=args.flush_bytes,
        inject_put_latency_ms=args.inject_put_latency_ms,
        inject_get_latency_ms=args.inject_get_latency_ms,
        cluster_name=args.cluster_name,
        zone=_zone(args.zone, args.rack),
        auto_create_topics=args.auto_create_topics,
        default_partitions=args.default_partitions,
        max_frame_bytes=args.max_frame_bytes,
        queued_max_request_bytes=args.queued_max_request_bytes,
        cache_bytes=args.cache_bytes,
        disk_cache_bytes=args.disk_cache_bytes,
        disk_cache_dir=args.disk_cache_dir,
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
        compaction_promote_entry_bytes=args.compaction_promote_entry_bytes,
        compaction_max_jobs=args.compaction_max_jobs,
        compaction_reads_at_once=args.compaction_reads_at_once,
        compaction_workers=args.compaction_workers,
        compaction_worker_nice=_worker_nice(args.compaction_workers, args.compaction_worker_nice),
        compaction_write_bytes_per_s=args.compaction_write_bytes_per_s or 0,
        compaction_unpaced_after_ms=_unpaced_after(
            args.compaction_write_bytes_per_s, args.compaction_unpaced_after_ms
        ),
        compaction_process=args.compaction_process,
        local_segments=args.local_segments,
        compaction_lease_ms=args.compaction_lease_ms,
        compaction_retention_span_percent=args.compaction_retention_span_percent,
        compaction_l2_max_inputs=args.compaction_l2_max_inputs,
        compaction_l2_max_wait_ms=args.compaction_l2_max_wait_ms,
        log_cleaner_enable=args.log_cleaner_enable,
        log_cleaner_backoff_ms=args.log_cleaner_backoff_ms,
        log_cleaner_dedupe_buffer_size=args.log_cleaner_dedupe_buffer_size,
        group_min_session_timeout_ms=args.group_min_session_timeout_ms,
        group_max_session_timeout_ms=args.group_max_session_timeout_ms,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        offsets_retention_minutes=args.offsets_retention_minutes,
        offsets_retention_check_interval_ms=args.offsets_retention_check_interval_ms,
        group_consumer_session_timeout_ms=args.group_consumer_session_timeout_ms,
        group_consumer_heartbeat_interval_ms=args.group_consumer_heartbeat_interval_ms,
        group_consumer_max_size=args.group_consumer_max_size,
        group_consumer_assignors=_assignors(args.group_consumer_assignors)
        if isinstance(args.group_consumer_assignors, str)
        else args.group_consumer_assignors,
        authorizer=args.authorizer,
        super_users=_super_users(args.super_users or ""),
        allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found,
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
        if args.metrics_port:
            own += ["--metrics-port", str(args.metrics_port + index)]
        commands[agent.port] = [sys.executable, "-m", "broker", *argv, *own]
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
    parser, args = parse_serve_args(argv)
    logformat.configure(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
        # The TLS files and the PLAIN users are read now, so that a bad one stops here.
        Authentication.from_config(config)
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2, as for any bad option
    os.makedirs(config.data_dir, exist_ok=True)
    config = replace(config, data_dir=os.path.abspath(config.data_dir))
    use_uvloop = args.event_loop != "asyncio" and _uvloop_installed()
    if args.event_loop == "uvloop" and not use_uvloop:
        parser.error("--event-loop uvloop: uvloop is not installed (pip install uvloop)")
    if args.agents > 1:
        return _run_many(args, argv, config)
    from broker.memory import COLLECTIONS, freeze_startup_heap, tune_allocator
    from broker.server import run_agent

    tune_allocator()
    COLLECTIONS.install()
    logging.getLogger(__name__).info("event loop: %s", "uvloop" if use_uvloop else "asyncio")
    serve = partial(run_agent, ready=freeze_startup_heap)
    try:
        anyio.run(serve, config, backend_options={"use_uvloop": use_uvloop})
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
