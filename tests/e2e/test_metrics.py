"""/metrics, /healthz and /readyz of an agent (broker.metrics), scraped as Prometheus
does and read with prometheus_client's parser."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer
from prometheus_client.parser import text_string_to_metric_families

from protocol.records import build_batch
from tests.e2e.rawclient import ensure_topic, fetch_raw, produce_batch
from tests.support.brokerproc import free_ports, listening

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def produce(port: int, topic: str, partition: int, batch: bytes) -> int:
    return int(produce_batch(port, topic, partition, batch).error_code)


def test_per_topic_counters_add_up(start_broker) -> None:
    (metrics_port,) = free_ports(1)
    # No cache: each Fetch reads the store, so that GETs are charged to the topics.
    broker = start_broker(
        extra_args=[
            "--metrics-port", str(metrics_port), "--cache-bytes", "1",
            "--group-initial-rebalance-delay-ms", "0",
        ]
    )  # fmt: skip
    assert get(metrics_port, "/healthz") == (200, "ok\n")
    sizes: dict[str, list[tuple[int, int]]] = {"alpha": [], "beta": []}
    for topic, count in (("alpha", 3), ("beta", 2)):
        ensure_topic(broker.port, topic)
        for i in range(count):
            records = [(b"k", b"v" * (100 * (i + 1)), [], int(time.time() * 1000))] * (i + 1)
            batch = build_batch(records)
            assert produce(broker.port, topic, 0, batch) == 0
            sizes[topic].append((len(records), len(batch)))
    # A partition that is not there: an error of the topic's, nothing written.
    assert produce(broker.port, "alpha", 7, build_batch([(b"k", b"x", [], 0)])) == 3
    for topic in sizes:
        fetched = fetch_raw(broker.port, topic, 0, offset=0)
        assert len(fetched) == sum(n for n, _size in sizes[topic])

    # A group member, coordinated here, on an open connection.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "metered"})
    consumer.subscribe(["alpha"])
    deadline = time.monotonic() + 20
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment()
    got = samples(metrics_port)
    consumer.close()
    assert got["bucketlog_groups_coordinated", ()] == 1
    assert got["bucketlog_group_members", ()] == 1
    assert got["bucketlog_connections", (("listener", "PLAINTEXT"),)] >= 1
    # raw requests: a connection each (the consumer's come on top)
    assert got["bucketlog_connections_accepted_total", (("listener", "PLAINTEXT"),)] >= 10
    for topic, batches in sizes.items():
        label = (("topic", topic),)
        records = sum(n for n, _size in batches)
        size = sum(size for _n, size in batches)
        assert got["bucketlog_topic_records_in_total", label] == records
        assert got["bucketlog_topic_bytes_in_total", label] == size
        assert got["bucketlog_topic_records_out_total", label] == records
        assert got["bucketlog_topic_bytes_out_total", label] == size
        assert got["bucketlog_topic_requests_total", (("api", "Produce"), *label)] == len(batches)
    error = (("api", "Produce"), ("error", "unknown_topic_or_partition"), ("topic", "alpha"))
    assert got["bucketlog_topic_errors_total", error] == 1
    # The stats of the agent, and the histograms.
    assert got["bucketlog_pipeline_batches_total", ()] == 5
    assert got["bucketlog_request_seconds_count", (("api", "Produce"),)] == 6
    assert got["bucketlog_flush_upload_seconds_count", ()] >= 1
    assert got["bucketlog_metadata_commit_seconds_count", ()] >= 1
    assert got["bucketlog_commit_batch_flushes_count", ()] >= 5
    assert got["bucketlog_commit_batch_flushes_sum", ()] == 5  # one flush a produce here
    assert got["bucketlog_pipeline_buffer_bytes", ()] == 0  # all flushed
    assert get(metrics_port, "/nothing")[0] == 404

    # The object store's requests, charged to the topics: a flush's PUT to the topic of
    # its batches (one each here), a Fetch's GETs to the topic read (an object each).
    def charged(topic: str, request: str) -> float:
        return got.get(
            (
                "bucketlog_topic_object_store_requests_total",
                (("request", request), ("topic", topic)),
            ),
            0.0,
        )

    for topic, batches in sizes.items():
        assert charged(topic, "PUT") == len(batches)
        assert charged(topic, "GET") == len(batches)
        written = (
            "bucketlog_topic_object_store_bytes_total",
            (("direction", "in"), ("topic", topic)),
        )
        assert got[written] > sum(size for _n, size in batches)  # the batches and a footer
        cost = ("bucketlog_topic_object_store_cost_dollars_total", (("topic", topic),))
        assert got[cost] == pytest.approx(len(batches) * (0.005 + 0.0004) / 1000)
    # Every request of the store is someone's, or unattributed: they add up.
    for request, total in (("PUT", "puts"), ("GET", "gets"), ("LIST", "lists")):
        charged_all = sum(
            value
            for (name, labels), value in got.items()
            if name == "bucketlog_topic_object_store_requests_total"
            and dict(labels)["request"] == request
        )
        assert charged_all == pytest.approx(got[f"bucketlog_store_{total}_total", ()])
    moved_in = sum(
        value
        for (name, labels), value in got.items()
        if name == "bucketlog_topic_object_store_bytes_total" and dict(labels)["direction"] == "in"
    )
    assert moved_in == pytest.approx(got["bucketlog_store_bytes_put_total", ()])


def test_readiness_follows_the_metadata_store(start_broker, tmp_path) -> None:
    (metrics_port,) = free_ports(1)
    switch = tmp_path / "metadata-down"
    start_broker(
        extra_args=[
            "--metrics-port", str(metrics_port),
            "--metadata", f"faulty+sqlite://{tmp_path}/metadata.db?unavailable_when={switch}",
        ]
    )  # fmt: skip
    assert get(metrics_port, "/readyz") == (200, "ready\n")
    switch.touch()
    deadline = time.monotonic() + 10
    while (answer := get(metrics_port, "/readyz"))[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answer[0] == 503 and "metadata store" in answer[1], answer
    assert get(metrics_port, "/healthz")[0] == 200  # it still serves
    switch.unlink()
    deadline = time.monotonic() + 10
    while (answer := get(metrics_port, "/readyz"))[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answer == (200, "ready\n")


def test_a_metrics_port_in_use_stops_the_start(tmp_path) -> None:
    """The metrics port is bound before the Kafka listeners: a port in use is a failed
    start, not an agent without /healthz, and its Kafka port never answers meanwhile
    (a client, or a test, that sees the Kafka port would take the agent for started)."""
    kafka_port, metrics_port = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics_port))
        taken.listen()
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path),
             "--host", "127.0.0.1", "--port", str(kafka_port),
             "--metrics-port", str(metrics_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        kafka_port_answered = False
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            kafka_port_answered = kafka_port_answered or listening(kafka_port)
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()  # still running after a minute: the assertions below say so
        _out, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert not kafka_port_answered
    assert f"cannot listen on the metrics port: {os.strerror(errno.EADDRINUSE)}" in stderr
    assert "listening on" not in stderr, stderr
    assert "Traceback" not in stderr


def test_the_startup_heap_is_frozen_and_full_collections_are_reported(start_broker) -> None:
    # What the agent made at start is out of the collector's reach (broker.memory): a
    # full collection no longer visits it. Tens of thousands of objects: modules,
    # classes, functions, the protocol's schemas.
    (metrics_port,) = free_ports(1)
    broker = start_broker(extra_args=["--metrics-port", str(metrics_port)])
    ensure_topic(broker.port, "gc")
    scraped = samples(metrics_port)
    assert scraped[("bucketlog_gc_frozen_objects", ())] > 10_000
    full = scraped[("bucketlog_gc_full_collections_total", ())]
    assert full >= 0
    assert scraped[("bucketlog_gc_full_collection_seconds_total", ())] >= 0
    assert ("bucketlog_gc_longest_full_collection_seconds", ()) in scraped
