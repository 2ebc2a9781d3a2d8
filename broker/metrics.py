"""Prometheus metrics and health endpoints of an agent.

`--metrics-port PORT` (with `--agents N`, agent i uses PORT + i) serves, over HTTP on the
agent's host, from the agent's own event loop:

* `/metrics`: the Prometheus text format, made by prometheus_client from a collector:
  every counter of the agent's stats (broker.stats.snapshot) as
  `bucketlog_<group>_<name>_total` (or a gauge, for the few that go down), the per-topic
  counters kept by `Meter`, and its latency histograms;
* `/healthz`: 200 while the agent serves;
* `/readyz`: 200 when a metadata read and an object-store listing both answer within
  READY_TIMEOUT_S, else 503 with the reason (checked at most once a second).

The hot path pays a dict update per topic and a bisect per histogram observation; the
families are built only when scraped.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from broker.costs import AccountingStore, Ledger

if TYPE_CHECKING:
    from broker.agent import Agent

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0
READY_CACHE_S = 1.0
HTTP_READ_LIMIT = 16 * 1024
HTTP_TIMEOUT_S = 10.0

# Seconds: 0.5 ms to 30 s, about three buckets per factor of ten.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

# Distinct client zones counted apart in bucketlog_requests_by_zone_total; the zones
# clients name past these are counted together as OTHER_ZONE (clients choose them).
CLIENT_ZONE_LABELS = 32
OTHER_ZONE = "(other)"

# Flushes committed together (a group commit), by upper bound.
COMMIT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# The stats that go down as well as up: gauges; every other number is a counter.
GAUGES = frozenset(
    {
        ("journal", "backlog_objects"),
        ("journal", "backlog_bytes"),
        ("cache", "bytes"),
        ("request_memory", "in_use"),
        ("request_memory", "in_use_peak"),
        ("lifecycle", "cluster_objects"),
        ("lifecycle", "cluster_object_bytes"),
        ("lifecycle", "cluster_chunk_entries"),
        ("compaction_process", "running"),
        ("ripcord", "enabled"),
        ("ripcord", "metadata_reachable"),
        ("put_hedge", "threshold_seconds"),
        ("gc", "frozen_objects"),
        ("gc", "longest_full_collection_seconds"),
    }
)


class Histogram:
    """Counts of observations by upper bound, and their sum (seconds)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, +Inf last, as Prometheus has them."""
        out, seen = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            seen += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), seen))
        return out


class Meter:
    """The per-topic counters and the latency histograms of an agent."""

    def __init__(self, zone: str | None = None) -> None:
        self.zone = zone or ""  # the agent's, a label
        # Requests by (client zone, API): "" for a client that names no zone.
        self.zone_requests: dict[tuple[str, str], int] = {}
        self._client_zones: set[str] = set()
        self.records_in: defaultdict[str, int] = defaultdict(int)
        self.bytes_in: defaultdict[str, int] = defaultdict(int)
        self.records_out: defaultdict[str, int] = defaultdict(int)
        self.bytes_out: defaultdict[str, int] = defaultdict(int)
        self.requests: defaultdict[tuple[str, str], int] = defaultdict(int)  # (topic, api)
        self.errors: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # +code
        self.request_seconds: defaultdict[str, Histogram] = defaultdict(Histogram)  # by API
        self.connections_open: defaultdict[str, int] = defaultdict(int)  # by listener
        self.connections_accepted: defaultdict[str, int] = defaultdict(int)
        self.flush_upload = Histogram()
        self.metadata_commit = Histogram()
        self.flush_end_to_end = Histogram()
        self.commit_batch = Histogram(COMMIT_BATCH_BUCKETS)  # flushes per commit

    def produced(self, topic: str, records: int, size: int) -> None:
        self.records_in[topic] += records
        self.bytes_in[topic] += size

    def fetched(self, topic: str, records: int, size: int) -> None:
        self.records_out[topic] += records
        self.bytes_out[topic] += size

    def connected(self, listener: str) -> None:
        self.connections_open[listener] += 1
        self.connections_accepted[listener] += 1

    def disconnected(self, listener: str) -> None:
        self.connections_open[listener] -= 1

    def zone_request(self, client_zone: str | None, api: str) -> None:
        key = (client_zone or "", api)
        try:
            self.zone_requests[key] += 1
        except KeyError:
            self._first_zone_request(*key)

    def _first_zone_request(self, zone: str, api: str) -> None:
        if zone not in self._client_zones:
            if len(self._client_zones) >= CLIENT_ZONE_LABELS:
                zone = OTHER_ZONE
            else:
                self._client_zones.add(zone)
        key = (zone, api)
        self.zone_requests[key] = self.zone_requests.get(key, 0) + 1

    def request(self, topic: str, api: str) -> None:
        self.requests[topic, api] += 1

    def error(self, topic: str, api: str, code: str) -> None:
        self.errors[topic, api, code] += 1


class AgentCollector:
    """prometheus_client's view of an agent: called on the agent's event loop."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        meter: Meter,
        ledger: Ledger | None = None,
        prices: dict[str, float] | None = None,
        groups: Callable[[], Iterable[tuple[str, Any]]] | None = None,
        buffered: Callable[[], int] | None = None,
    ) -> None:
        self._groups = groups
        self._buffered = buffered
        self._snapshot = snapshot
        self._meter = meter
        self._ledger = ledger
        self._prices = prices or {}

    def collect(self) -> Iterator[Metric]:
        yield from _from_stats(self._snapshot())
        yield from _from_meter(self._meter)
        if self._buffered is not None:
            yield GaugeMetricFamily(
                "bucketlog_pipeline_buffer_bytes",
                "batches accepted and not yet in a flush",
                value=self._buffered(),
            )
        if self._groups is not None:
            slots = [slot for _name, slot in self._groups()]
            loaded = [s.loaded for s in slots if s.loaded is not None]
            consumers = [s.consumer for s in slots if s.consumer is not None]
            yield GaugeMetricFamily(
                "bucketlog_groups_coordinated",
                "consumer groups this agent coordinates (loaded; both protocols)",
                value=len(loaded) + len(consumers),
            )
            yield GaugeMetricFamily(
                "bucketlog_group_members",
                "members of the groups this agent coordinates",
                value=sum(len(g.group.members) for g in loaded)
                + sum(len(c.group.members) for c in consumers),
            )
        if self._ledger is not None:
            yield from _from_ledger(self._ledger, self._prices)


def _from_ledger(ledger: Ledger, prices: dict[str, float]) -> Iterator[Metric]:
    requests, moved = ledger.copy()
    family = CounterMetricFamily(
        "bucketlog_topic_object_store_requests",
        "object-store requests charged to the topic (shared ones in part), by request",
        labels=["topic", "request"],
    )
    cost: defaultdict[str, float] = defaultdict(float)
    for (topic, kind), value in requests.items():
        family.add_metric([topic, kind], value)
        cost[topic] += value * prices.get(kind, 0.0) / 1000
    yield family
    family = CounterMetricFamily(
        "bucketlog_topic_object_store_bytes",
        "object-store bytes charged to the topic: in (written), out (read)",
        labels=["topic", "direction"],
    )
    for (topic, direction), value in moved.items():
        family.add_metric([topic, direction], value)
    yield family
    family = CounterMetricFamily(
        "bucketlog_topic_object_store_cost_dollars",
        "the topic's object-store requests at the configured prices",
        labels=["topic"],
    )
    for topic, value in cost.items():
        family.add_metric([topic], value)
    yield family


def _from_stats(stats: dict[str, Any]) -> Iterator[Metric]:
    for group, values in stats.items():
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, int | float):
                continue  # a nested table (histograms of the stats file): not here
            if name.endswith("_us"):  # microseconds: Prometheus wants seconds
                name, value = name[: -len("_us")] + "_seconds", value / 1_000_000
            metric = f"bucketlog_{group}_{name}"
            what = f"{group}.{name} of the agent's stats"
            if (group, name) in GAUGES:
                yield GaugeMetricFamily(metric, what, value=value)
            else:
                yield CounterMetricFamily(metric, what, value=value)


def _from_meter(meter: Meter) -> Iterator[Metric]:
    for name, table, what in (
        ("bucketlog_topic_records_in", meter.records_in, "records produced to the topic"),
        ("bucketlog_topic_bytes_in", meter.bytes_in, "record batch bytes produced to the topic"),
        ("bucketlog_topic_records_out", meter.records_out, "records fetched from the topic"),
        ("bucketlog_topic_bytes_out", meter.bytes_out, "record batch bytes fetched"),
    ):
        family = CounterMetricFamily(name, what, labels=["topic"])
        for topic, value in list(table.items()):
            family.add_metric([topic], value)
        yield family
    family = CounterMetricFamily(
        "bucketlog_topic_requests", "requests naming the topic, by API", labels=["topic", "api"]
    )
    for (topic, api), value in list(meter.requests.items()):
        family.add_metric([topic, api], value)
    yield family
    family = CounterMetricFamily(
        "bucketlog_topic_errors",
        "partitions answered with an error, by API and error",
        labels=["topic", "api", "error"],
    )
    for (topic, api, code), value in list(meter.errors.items()):
        family.add_metric([topic, api, code], value)
    yield family
    by_zone = CounterMetricFamily(
        "bucketlog_requests_by_zone",
        "requests by the agent's zone and the zone the client names in its client.id"
        ' ("" for none), and API',
        labels=["agent_zone", "client_zone", "api"],
    )
    for (client_zone, api), value in list(meter.zone_requests.items()):
        by_zone.add_metric([meter.zone, client_zone, api], value)
    yield by_zone
    opened = GaugeMetricFamily(
        "bucketlog_connections", "client connections open, by listener", labels=["listener"]
    )
    for listener, value in list(meter.connections_open.items()):
        opened.add_metric([listener], value)
    yield opened
    accepted = CounterMetricFamily(
        "bucketlog_connections_accepted",
        "client connections accepted, by listener",
        labels=["listener"],
    )
    for listener, value in list(meter.connections_accepted.items()):
        accepted.add_metric([listener], value)
    yield accepted
    requests = HistogramMetricFamily(
        "bucketlog_request_seconds", "from a request's arrival to its answer", labels=["api"]
    )
    for api, histogram in list(meter.request_seconds.items()):
        requests.add_metric([api], histogram.buckets(), histogram.total)
    yield requests
    batches = HistogramMetricFamily(
        "bucketlog_commit_batch_flushes", "flushes committed in one metadata transaction"
    )
    batches.add_metric([], meter.commit_batch.buckets(), meter.commit_batch.total)
    yield batches
    for name, histogram, what in (
        ("bucketlog_flush_upload_seconds", meter.flush_upload, "a flush's object upload"),
        ("bucketlog_metadata_commit_seconds", meter.metadata_commit, "a flush group's commit"),
        (
            "bucketlog_flush_end_to_end_seconds",
            meter.flush_end_to_end,
            "from a flush's start to its batches' answers",
        ),
    ):
        latencies = HistogramMetricFamily(name, what)
        latencies.add_metric([], histogram.buckets(), histogram.total)
        yield latencies


# -- the HTTP side ------------------------------------------------------------------------


class Readiness:
    """Whether the agent can reach its stores, checked at most once per READY_CACHE_S."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._checked_at = -READY_CACHE_S
        self._reason: str | None = "not checked yet"

    async def reason(self) -> str | None:
        """None when ready, else why not."""
        now = time.monotonic()
        if now - self._checked_at >= READY_CACHE_S:
            self._checked_at = now
            self._reason = await self._check()
        return self._reason

    async def _check(self) -> str | None:
        agent = self._agent
        try:
            with anyio.fail_after(READY_TIMEOUT_S):
                await agent.kv.read(lambda tr: None)
        except TimeoutError:
            return f"metadata store: no answer within {READY_TIMEOUT_S:g} s"
        except Exception as exc:  # any failure is the answer
            return f"metadata store: {exc}"
        try:
            with anyio.fail_after(READY_TIMEOUT_S):
                await agent.store.list("ready/")
        except TimeoutError:
            return f"object store: no answer within {READY_TIMEOUT_S:g} s"
        except Exception as exc:
            return f"object store: {exc}"
        return None


async def serve_http(agent: Agent, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
    """Serve /metrics, /healthz and /readyz on `listener` until cancelled."""
    registry = CollectorRegistry(auto_describe=False)
    from broker import stats

    cfg = agent.config
    prices = {
        "PUT": cfg.price_put_per_1000,
        "GET": cfg.price_get_per_1000,
        "LIST": cfg.price_list_per_1000,
        "DELETE": cfg.price_delete_per_1000,
    }
    ledger = agent.store.ledger if isinstance(agent.store, AccountingStore) else None
    registry.register(
        AgentCollector(
            lambda: stats.snapshot(agent),
            agent.meter,
            ledger,
            prices,
            agent.groups.slots,
            lambda: agent.pipeline.buffered_bytes + agent.journal.buffered_bytes,
        )
    )
    readiness = Readiness(agent)
    address = listener.extra(anyio.abc.SocketAttribute.local_address)
    assert isinstance(address, tuple)  # a TCP listener's (host, port, ...)
    logger.info(
        "metrics and health on http://%s:%d/metrics, /healthz, /readyz", address[0], address[1]
    )

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(HTTP_TIMEOUT_S):
                    path = await _read_request_path(stream)
                    if path is None:
                        await _respond(stream, 400, b"bad request\n")
                    elif path == "/metrics":
                        await _respond(stream, 200, generate_latest(registry), _PROMETHEUS_TYPE)
                    elif path == "/healthz":
                        await _respond(stream, 200, b"ok\n")
                    elif path == "/readyz":
                        reason = await readiness.reason()
                        if reason is None:
                            await _respond(stream, 200, b"ready\n")
                        else:
                            await _respond(stream, 503, f"not ready: {reason}\n".encode())
                    else:
                        await _respond(stream, 404, b"not found\n")
            except (TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                return  # a scraper that went away or stalled: nothing to say

    await listener.serve(answer)


_PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


async def _read_request_path(stream: anyio.abc.SocketStream) -> str | None:
    """The path of a GET request, once its header is in; None if malformed."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HTTP_READ_LIMIT:
            return None
        data += await stream.receive()
    parts = data.split(b"\r\n", 1)[0].split()
    if len(parts) != 3 or parts[0] != b"GET":
        return None
    return parts[1].split(b"?", 1)[0].decode("ascii", "replace")


async def _respond(
    stream: anyio.abc.SocketStream, status: int, body: bytes, content_type: str = "text/plain"
) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    await stream.send(head.encode() + body)
