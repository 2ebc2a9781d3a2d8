"""Times the bounds check against kio's reader: ``python tests/protocol/bench_bounds.py``.

For a Fetch as the Java consumer sends it (one topic, one partition, v12-v17) and for
Produce v9 requests of many partitions (those kio reads; up to 8 are read by
protocol.produce, which checks as it reads), prints per request: ``bounds.check``
alone, kio's reader alone, and ``decode_request`` as a whole, which includes both.
Not collected by pytest.
"""

from __future__ import annotations

import datetime
import importlib
import timeit
import uuid
from typing import Any

from protocol import bounds
from protocol.codec import _reader, decode_request, encode_request
from protocol.headers import parse_request_header


def fetch_request(version: int) -> Any:
    module = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    topic = {"topic": "orders"} if version < 13 else {"topic_id": uuid.uuid4()}
    replica = {} if version >= 15 else {"replica_id": -1}
    partition = module.FetchPartition(
        partition=0,
        current_leader_epoch=0,
        fetch_offset=123_456,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return module.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=(module.FetchTopic(partitions=(partition,), **topic),),
        forgotten_topics_data=(),
        rack_id="",
        **replica,
    )


def produce_request(partitions: int, batch_bytes: int = 1024) -> Any:
    module = importlib.import_module("kio.schema.produce.v9.request")
    batch = bytes(batch_bytes)
    return module.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            module.TopicProduceData(
                name="orders",
                partition_data=tuple(
                    module.PartitionProduceData(index=p, records=batch) for p in range(partitions)
                ),
            ),
        ),
    )


def best_us(function: Any, number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=7)) / number * 1e6


def measure(name: str, request: Any) -> None:
    frame = encode_request(request, correlation_id=1, client_id="consumer-1")[4:]
    offset = parse_request_header(frame)[1]
    schema = type(request)
    reader = _reader(schema)
    assert bounds.check(schema, frame, offset) == len(frame)
    assert decode_request(frame).body == request
    number = 20_000 if len(frame) < 4096 else 1_000
    check = best_us(lambda: bounds.check(schema, frame, offset), number)
    kio = best_us(lambda: reader(frame, offset), number)
    whole = best_us(lambda: decode_request(frame), number)
    print(
        f"{name:32s} {len(frame):7d} B   check {check:6.2f} us   "
        f"kio reader {kio:6.2f} us   decode_request {whole:7.2f} us"
    )


def main() -> None:
    for version in (12, 13, 15, 17):
        measure(f"Fetch v{version}, 1 topic, 1 partition", fetch_request(version))
    for partitions in (16, 64, 256):
        measure(f"Produce v9, {partitions} partitions", produce_request(partitions))


if __name__ == "__main__":
    main()
