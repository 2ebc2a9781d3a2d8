"""A real Prometheus server scrapes an agent's /metrics, and the README's per-topic
cost query answers from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.brokerproc import free_ports

pytestmark = [
    pytest.mark.slow,
    pytest.mark.store_independent,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the prometheus server on PATH (Debian package prometheus; make test installs it)",
    ),
]

COST_BY_TOPIC = "sum by (topic) (bucketlog_topic_object_store_cost_dollars_total)"
PUTS_BY_TOPIC = 'sum by (topic) (bucketlog_topic_object_store_requests_total{request="PUT"})'


def query(port: int, promql: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return {r["metric"].get("topic", ""): float(r["value"][1]) for r in body["data"]["result"]}


def test_prometheus_scrapes_the_per_topic_cost(start_broker, tmp_path: Path) -> None:
    metrics_port, prometheus_port = free_ports(2)
    broker = start_broker(extra_args=["--metrics-port", str(metrics_port)])
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: bucketlog\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    server = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for topic, count in (("orders", 4), ("clicks", 2)):
            for _i in range(count):  # one at a time: a flush each
                producer.produce(topic, value=b"x" * 1000)
                assert producer.flush(10) == 0
        deadline = time.monotonic() + 30
        puts: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                puts = query(prometheus_port, PUTS_BY_TOPIC)
            except OSError:
                puts = {}  # not serving yet
            if puts.get("orders") == 4 and puts.get("clicks") == 2:
                break
            time.sleep(0.5)
        assert puts.get("orders") == 4 and puts.get("clicks") == 2, puts
        cost = query(prometheus_port, COST_BY_TOPIC)
        assert cost["orders"] == pytest.approx(2 * cost["clicks"])
        assert cost["orders"] == pytest.approx(4 * 0.005 / 1000)
    finally:
        server.terminate()
        server.wait(10)
