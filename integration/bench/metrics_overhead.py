"""What /metrics costs: produce throughput of one agent with metrics off and on.

`.venv/bin/python integration/bench/metrics_overhead.py [--pairs 6] [--records 300000]`
starts two `bucketlog serve --agents 1` (embedded default stores, fresh data dirs), one
without and one with `--metrics-port` (which also charges every object-store request to
its topics, broker.costs), both running for the whole benchmark, so that the machine's
drift over the minutes falls on both alike; a scraper asks the second for /metrics once
a second all along (a Prometheus at a 1 s interval: 15 times more often than its
default). After a warm-up of each, PAIRS pairs of runs, one on each agent, the order
switched every pair. A run: Apache Kafka's ProducerPerformance (one producer, one
partition, RECORDS 1 KiB records, acks=all, `batch.size=262144 linger.ms=5`, as `make
bench`'s produce-1p-1x-none) and the python-confluent-kafka workload of `make bench`
(RECORDS / 2). Writes results/<date>-metrics-overhead.md and .json: the medians, the
ratio on/off, every run. The target (issue: "metrics on vs off costs less than 3% of
produce throughput") is checked on the medians. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

TARGET = 0.97


class Scraper(threading.Thread):
    """GET /metrics every second until stopped; counts the scrapes and their bytes."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stopped = threading.Event()
        self.scrapes = 0
        self.bytes = 0
        self.seconds: list[float] = []

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            began = time.monotonic()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/metrics", timeout=5
                ) as answer:
                    self.bytes += len(answer.read())
            except OSError:
                continue
            self.seconds.append(time.monotonic() - began)
            self.scrapes += 1


def one_run(
    system: bench.Bucketlog, metrics: bool, records: int, run: int, scraper: Scraper | None
) -> dict[str, Any]:
    scrapes_before = scraper.scrapes if scraper is not None else 0
    mb = records * bench.RECORD_SIZE / 1e6
    bench.create_topic(system.bootstrap, f"p1-{run}", 1)
    java = bench.measure(
        system, mb, lambda: bench.producer_perf(system.bootstrap, f"p1-{run}", records, "none")
    )
    bench.create_topic(system.bootstrap, f"py-{run}", 1)
    python = bench.measure(
        system, mb / 2, lambda: bench.python_workload(system.bootstrap, f"py-{run}", records // 2)
    )
    out: dict[str, Any] = {
        "metrics": metrics,
        "java_produce_mb_s": round(java["mb_s"], 2),
        "java_broker_cpu_s_per_gb": java["broker_cpu_s_per_gb"],
        "python_produce_mb_s": round(python["produce_mb_s"], 2),
        "python_broker_cpu_s_per_gb": python["broker_cpu_s_per_gb"],
    }
    if scraper is not None:
        out["scrapes"] = scraper.scrapes - scrapes_before
        out["scrape_bytes_mean"] = round(scraper.bytes / max(1, scraper.scrapes))
        out["scrape_ms_median"] = (
            round(statistics.median(scraper.seconds) * 1000, 1) if scraper.seconds else None
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--note", default="", help="what else ran on the machine, if known")
    args = parser.parse_args()
    started = datetime.now(UTC)
    machine = bench.machine()
    runs: list[dict[str, Any]] = []
    metrics_port = bench.free_port()
    systems = {
        False: bench.Bucketlog(1, []),
        True: bench.Bucketlog(1, ["--metrics-port", str(metrics_port)]),
    }
    scraper = Scraper(metrics_port)
    try:
        for system in systems.values():
            system.start()
            bench.create_topic(system.bootstrap, "warm", 1)
            bench.producer_perf(system.bootstrap, "warm", 50_000, "none")
        scraper.start()
        for pair in range(args.pairs):
            for metrics in (False, True) if pair % 2 == 0 else (True, False):
                system = systems[metrics]
                result = one_run(system, metrics, args.records, pair, scraper if metrics else None)
                print(json.dumps(result), flush=True)
                runs.append(result)
    finally:
        scraper.stopped.set()
        scraper.join(5)
        for system in systems.values():
            system.stop()
    keys = ("java_produce_mb_s", "python_produce_mb_s")
    cpu_keys = ("java_broker_cpu_s_per_gb", "python_broker_cpu_s_per_gb")
    medians = {
        side: {
            k: round(statistics.median(r[k] for r in runs if r["metrics"] == (side == "on")), 2)
            for k in keys + cpu_keys
        }
        for side in ("off", "on")
    }
    ratios = {k: round(medians["on"][k] / medians["off"][k], 3) for k in keys}
    report = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine,
        "loadavg_at_end": list(bench.os.getloadavg()),
        "note": args.note,
        "pairs": args.pairs,
        "records": args.records,
        "medians": medians,
        "ratios_on_off": ratios,
        "target_ratio_at_least": TARGET,
        "met": all(v >= TARGET for v in ratios.values()),
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{started.date().isoformat()}-metrics-overhead"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {stem}.md and .json", flush=True)
    return 0


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Metrics on vs off: produce throughput ({report['date']})",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gb']} GB, Linux "
        f"{m['kernel']}, Python {m['python']}, {m['java']}. Load average at start "
        f"{' / '.join(f'{v:.2f}' for v in m['loadavg_at_start'])}, at end "
        f"{' / '.join(f'{v:.2f}' for v in report['loadavg_at_end'])}."
        + (f" {report['note']}" if report["note"] else ""),
        "",
        f"Made by `integration/bench/metrics_overhead.py --pairs {report['pairs']} --records "
        f"{report['records']}`: two agents (embedded default stores) running side by side "
        "for the whole benchmark, one without and one with `--metrics-port` (every "
        "object-store request then charged to its topics), the second scraped for /metrics "
        "every second all along; runs alternate between them, each pair's order switched "
        "every time. ProducerPerformance produces RECORDS records, the python workload "
        "half as many. Medians of the runs; MB/s of 1 KiB records.",
        "",
        "| workload | metrics off | metrics on | on / off | broker CPU s/GB off | on |",
        "|---|---|---|---|---|---|",
    ]
    for key, cpu, name in (
        ("java_produce_mb_s", "java_broker_cpu_s_per_gb", "ProducerPerformance, 1 partition"),
        ("python_produce_mb_s", "python_broker_cpu_s_per_gb", "python-confluent-kafka produce"),
    ):
        off, on = report["medians"]["off"], report["medians"]["on"]
        lines.append(
            f"| {name} | {off[key]} | {on[key]} | {report['ratios_on_off'][key]} | "
            f"{off[cpu]} | {on[cpu]} |"
        )
    lines += [
        "",
        f"Target: on / off >= {report['target_ratio_at_least']} for each: "
        f"**{'met' if report['met'] else 'not met'}**.",
        "",
        "## Every run",
        "",
        "| metrics | ProducerPerformance MB/s | python MB/s | scrapes | scrape bytes | scrape ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {'on' if r['metrics'] else 'off'} | {r['java_produce_mb_s']} | "
            f"{r['python_produce_mb_s']} | {r.get('scrapes', '-')} | "
            f"{r.get('scrape_bytes_mean', '-')} | {r.get('scrape_ms_median', '-')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
