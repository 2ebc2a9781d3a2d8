"""The soak's produce workload, with a probe of the agent's event loop beside it: where a
produce p99 the agent does not see comes from.

`.venv/bin/python integration/bench/produce_probe.py [--minutes 7] [--retention-ms
300000] [--records-s 28153] [--out FILE] [-- SERVE_ARGS...]` starts one agent (the
bench's Bucketlog, local store, the soak's 15 s retention check and delete delay, its
/metrics on), creates a 64-partition topic with that retention, and produces at the
soak's rate in one-minute runs of ProducerPerformance (acks=all, 1 KiB records). Beside
it, a probe sends an ApiVersions v0 request every 10 ms on a connection of its own and
times each round trip: an answer that needs no metadata and no store, so a slow one is
the event loop (or the machine) being busy. Per minute it prints the tool's p99, the
p99 bucket of the agent's own Produce request time (from /metrics, as
backlog_latency.py reads it) and the probe's p50, p99, maximum and round trips over 20
ms. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import importlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import backlog_latency  # noqa: E402
import run as bench  # noqa: E402
import soak  # noqa: E402

from protocol.codec import encode_request  # noqa: E402

API_VERSIONS = importlib.import_module("kio.schema.api_versions.v0.request")
PROBE_EVERY_S = 0.01
SLOW_MS = 20.0


class Probe:
    """ApiVersions round trips on one connection, each (monotonic time, ms)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        host, port = self.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            correlation_id = 0
            while not self._stop.is_set():
                correlation_id += 1
                frame = encode_request(
                    API_VERSIONS.ApiVersionsRequest(),
                    correlation_id=correlation_id,
                    client_id="probe",
                )
                began = time.perf_counter()
                sock.sendall(frame)
                bench.receive_frame(sock)
                self.samples.append((time.monotonic(), (time.perf_counter() - began) * 1000))
                time.sleep(PROBE_EVERY_S)

    def since(self, start: float) -> dict[str, float]:
        window = sorted(ms for at, ms in self.samples if at >= start)
        if not window:
            return {}
        return {
            "probes": len(window),
            "p50_ms": round(window[len(window) // 2], 2),
            "p99_ms": round(window[int(len(window) * 0.99)], 2),
            "max_ms": round(window[-1], 2),
            "over_20_ms": sum(1 for ms in window if ms > SLOW_MS),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=7)
    parser.add_argument("--retention-ms", type=int, default=300_000)
    parser.add_argument("--records-s", type=int, default=28_153)
    parser.add_argument("--out", help="write the minutes as JSON here")
    args, serve_args = parser.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    metrics_port = bench.free_port()
    system = bench.Bucketlog(
        1,
        [
            "--log-retention-check-interval-ms",
            "15000",
            "--object-delete-delay-ms",
            "15000",
            *serve_args,
            "--metrics-port",
            str(metrics_port),
        ],
    )
    system.start()
    probe = Probe(system.bootstrap)
    minutes: list[dict[str, Any]] = []
    try:
        bench.create_topic(system.bootstrap, "soak", 64)
        soak.set_retention(system.bootstrap, "soak", args.retention_ms)
        probe.start()
        for minute in range(1, args.minutes + 1):
            start = time.monotonic()
            before = backlog_latency.buckets(metrics_port)
            tool = bench.producer_perf(
                system.bootstrap, "soak", args.records_s * 60, "none", args.records_s
            )
            agent = backlog_latency.quantiles(before, backlog_latency.buckets(metrics_port))
            row = {
                "minute": minute,
                "tool_p99_ms": tool["p99_ms"],
                "agent_produce_p99_le_ms": agent["bucketlog_request_seconds"]["p99_le_ms"],
                "agent_p99_le_ms": {
                    name.removeprefix("bucketlog_").removesuffix("_seconds"): value["p99_le_ms"]
                    for name, value in agent.items()
                },
                "probe": probe.since(start),
            }
            print(json.dumps(row), flush=True)
            minutes.append(row)
    finally:
        probe.stop()
        system.stop()
    if args.out:
        body = {"machine": bench.machine(), "args": vars(args), "serve_args": serve_args}
        Path(args.out).write_text(json.dumps({**body, "minutes": minutes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
