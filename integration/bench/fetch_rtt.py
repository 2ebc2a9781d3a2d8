"""One Fetch in flight: the broker's share of a single-partition catch-up read, apart from
the client's.

`.venv/bin/python integration/bench/fetch_rtt.py [--systems kafka,bucketlog] [--rounds 3]
[--records 300000] [--think-ms 0,2,5] [--out FILE.md]` starts each system in turn (as
run.py does: Kafka with its defaults, one bucketlog agent with the embedded stores),
warms it up, writes RECORDS 1 KiB records into one partition with Kafka's
ProducerPerformance, and then, ROUNDS times over the same topic:

- a raw loop: Fetch v12 requests sent one at a time over one connection, each asking for
  1 MiB of the partition (`partition_max_bytes`, the Java consumer's default) from where
  the answer before ended, as the Java consumer does when it keeps one Fetch in flight;
  each round trip is timed from the request's first byte sent to the answer's last byte
  received, and nothing else (the answer is parsed after the clock stops). It gives the
  round trips' p50, p90 and mean, the MB/s of the round trips alone, and the broker's
  CPU seconds per GB over the loop (every thread and child process of the broker, user
  and system apart). With --think-ms the loop is run once per value given, sleeping
  that long after each answer before it sends the next request, as a consumer does
  while its application handles the records: the broker then waits idle between
  requests, as it does for a real consumer;
- ConsumerPerformance (Kafka's tool, a fresh JVM and a fresh group each time) reading
  the same records: its fetch MB/s (the time of the group join taken out) and the
  broker's CPU seconds per GB over the whole run of the tool.

The first round reads records some of which are no longer in the agent's cache (the
topic is larger than it) and, on Kafka, in a JVM not warmed up to this path; the rounds
after it read what the first one brought in. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import run as bench  # noqa: E402

from protocol.codec import decode_response, encode_request  # noqa: E402
from protocol.records import HEADER_SIZE, RecordBatchView  # noqa: E402

TOPIC = "one-partition"
PARTITION_MAX_BYTES = 1 << 20
FETCH = importlib.import_module("kio.schema.fetch.v12.request")


def fetch_request(offset: int) -> Any:
    partition = FETCH.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=PARTITION_MAX_BYTES,
    )
    return FETCH.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(FETCH.FetchTopic(topic=TOPIC, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def next_offset(frame: bytearray, offset: int) -> tuple[int, int]:
    """The offset after the answer's last whole batch, and the bytes of its records (a
    partial batch at the end, as Kafka may send, is not counted)."""
    body: Any = decode_response(frame, 1, 12).body
    partition = body.responses[0].partitions[0]
    if partition.error_code != 0:
        raise RuntimeError(f"Fetch at {offset} answered {partition.error_code}")
    data = bytes(partition.records or b"")
    position = 0
    # Not iter_batches: it refuses the partial batch Kafka may end an answer with.
    while position + HEADER_SIZE <= len(data):
        batch = RecordBatchView(data, position)
        if position + batch.size > len(data):
            break
        offset = batch.base_offset + batch.last_offset_delta + 1
        position += batch.size
    return offset, position


def raw_loop(system: bench.System, records: int, think_ms: float = 0) -> dict[str, float]:
    host, port = system.bootstrap.rsplit(":", 1)
    rtts: list[float] = []
    total = 0
    offset = 0
    user_before, sys_before = bench.tree_cpu_user_system(system.root_pid)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while offset < records:
            frame = encode_request(
                fetch_request(offset), correlation_id=len(rtts) + 1, client_id="fetch-rtt"
            )
            began = time.perf_counter()
            sock.sendall(frame)
            answer = bench.receive_frame(sock)
            rtts.append(time.perf_counter() - began)
            after, used = next_offset(answer, offset)
            if after == offset:
                raise RuntimeError(f"no whole batch in the answer at offset {offset}")
            offset, total = after, total + used
            if think_ms:
                time.sleep(think_ms / 1000)
    user_after, sys_after = bench.tree_cpu_user_system(system.root_pid)
    user, system_cpu = user_after - user_before, sys_after - sys_before
    ms = sorted(r * 1000 for r in rtts)
    return {
        "fetches": len(ms),
        "mb": round(total / 1e6, 1),
        "rtt_p50_ms": round(ms[len(ms) // 2], 3),
        "rtt_p90_ms": round(ms[int(len(ms) * 0.9)], 3),
        "rtt_mean_ms": round(statistics.mean(ms), 3),
        "rtt_mb_s": round(total / 1e6 / sum(rtts), 1),
        "broker_cpu_s_per_gb": round((user + system_cpu) / (total / 1e9), 2),
        "broker_user_s_per_gb": round(user / (total / 1e9), 2),
        "broker_system_s_per_gb": round(system_cpu / (total / 1e9), 2),
        "think_ms": think_ms,
    }


def consumer_perf(system: bench.System, records: int) -> dict[str, float]:
    mb = records * bench.RECORD_SIZE / 1e6
    result = bench.measure(
        system, mb, lambda: bench.consumer_perf(system.bootstrap, TOPIC, records)
    )
    return {"mb_s": result["mb_s"], "broker_cpu_s_per_gb": result["broker_cpu_s_per_gb"]}


def bench_system(name: str, rounds: int, records: int, thinks: list[float]) -> list[dict[str, Any]]:
    system: bench.System = bench.Kafka() if name == "kafka" else bench.Bucketlog(1)
    system.start()
    try:
        bench.create_topic(system.bootstrap, "warm-up", 1)
        bench.producers_perf(system.bootstrap, "warm-up", 1, 100_000, "none")
        bench.consumer_perf(system.bootstrap, "warm-up", 100_000)
        bench.create_topic(system.bootstrap, TOPIC, 1)
        bench.producers_perf(system.bootstrap, TOPIC, 1, records, "none")
        out = []
        for round_ in range(rounds):
            row = {
                "raw": [raw_loop(system, records, think) for think in thinks],
                "tool": consumer_perf(system, records),
            }
            print(f"[{datetime.datetime.now():%H:%M:%S}] {name} round {round_ + 1}: {row}")
            out.append(row)
        return out
    finally:
        system.stop()


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| system | round | raw loop: think ms | fetches | RTT p50 / p90 / mean ms | MB/s of "
        "the round trips | broker CPU s/GB (user / system) | ConsumerPerformance fetch MB/s "
        "| its broker CPU s/GB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        for index, row in enumerate(rows, 1):
            tool = row["tool"]
            for n, raw in enumerate(row["raw"]):
                tool_cells = (
                    f"{tool['mb_s']:.1f} | {tool['broker_cpu_s_per_gb']:.2f}" if n == 0 else " | "
                )
                lines.append(
                    f"| {name} | {index} | {raw['think_ms']:g} | {raw['fetches']} | "
                    f"{raw['rtt_p50_ms']:.2f} / {raw['rtt_p90_ms']:.2f} / "
                    f"{raw['rtt_mean_ms']:.2f} | {raw['rtt_mb_s']:.0f} | "
                    f"{raw['broker_cpu_s_per_gb']:.2f} ({raw['broker_user_s_per_gb']:.2f} / "
                    f"{raw['broker_system_s_per_gb']:.2f}) | {tool_cells} |"
                )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="kafka,bucketlog")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument(
        "--think-ms",
        default="0",
        help="comma-separated pauses after each answer of the raw loop, one loop per value",
    )
    parser.add_argument("--out", help="write the table (.md) and the figures (.json) here")
    args = parser.parse_args()
    thinks = [float(value) for value in args.think_ms.split(",") if value]
    started = datetime.datetime.now(datetime.UTC)
    machine = bench.machine()
    results = {
        name: bench_system(name, args.rounds, args.records, thinks)
        for name in args.systems.split(",")
        if name
    }
    lines = [
        "# One Fetch in flight: round trips and ConsumerPerformance",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {args.records:,} records of 1 KiB in one partition,"
        f" {args.rounds} rounds per system, raw loops with {args.think_ms} ms between an"
        f" answer and the next request. Machine: {machine}",
        "",
        *table(results),
    ]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        body = {"date": started.isoformat(), "machine": machine, "results": results}
        out.with_suffix(".json").write_text(json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
