"""Times the Produce handler: ``python -m tests.broker.bench_produce`` from the checkout.

One Produce v9 request of 4 partitions x 1 MiB (uncompressed batches, views of the
request frame, as the connection decodes them), to a CreateTime and to a LogAppendTime
topic, through ``broker.handlers.produce.handle`` with stand-ins for the agent and the
pipeline (the append is answered at once). A CreateTime batch is checked and queued as
it is; a LogAppendTime batch is stamped on a copy first. Not collected by pytest.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import timeit
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from broker.handlers import produce
from broker.memory import tune_allocator
from broker.metrics import Meter
from broker.sync import Promise
from metadata.log import AppendResult
from metadata.topics import Topic
from protocol.codec import decode_request, encode_request
from protocol.produce import _classes
from protocol.records import build_batch

PARTITIONS = 4
RECORDS_PER_BATCH = 1000  # of 1 KiB each
TS = 1_700_000_000_000


def request_body() -> Any:
    rng = random.Random(1)
    records = [(b"k%d" % i, rng.randbytes(1024), [], TS + i) for i in range(RECORDS_PER_BATCH)]
    batch = build_batch(records)
    request_cls, topic_cls, partition_cls = _classes(9)
    partitions = tuple(partition_cls(index=i, records=batch) for i in range(PARTITIONS))
    request = request_cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(topic_cls(name="bench", partition_data=partitions),),
    )
    body = decode_request(encode_request(request, correlation_id=1, client_id="bench")[4:]).body
    assert isinstance(body.topic_data[0].partition_data[0].records, memoryview)
    return body


class Pipeline:
    def enqueue(self, *_batch: object) -> Promise[AppendResult]:
        promise: Promise[AppendResult] = Promise()
        promise.set(AppendResult(ErrorCode.none, 0, 0))
        return promise


class Journal:
    async def wait_sequenced(self, topic_id: bytes, partition: int) -> None:
        return None


class Agent:
    """What the Produce handler asks of an agent, for a classic topic without ACLs."""

    authorizer = None  # authorization off: no check runs

    def __init__(self, timestamp_type: str) -> None:
        self.pipeline = Pipeline()
        self.journal = Journal()
        self.meter = Meter()
        self.bench = Topic(b"\x01" * 16, "bench", PARTITIONS, {})
        self.configs = {"max.message.bytes": str(2 << 20), "message.timestamp.type": timestamp_type}

    def in_outage(self) -> bool:
        return False

    async def topic(self, name: str, *, fresh: bool = False) -> Topic:
        return self.bench

    def topic_config(self, topic: Topic, name: str) -> str:
        return self.configs.get(name, "")


def main() -> None:
    tune_allocator()  # as the agent does
    body = request_body()
    loop = asyncio.new_event_loop()
    for timestamp_type in ("CreateTime", "LogAppendTime"):
        ctx = SimpleNamespace(
            agent=Agent(timestamp_type),
            api_version=9,
            end_turn=lambda: None,
            principal="User:ANONYMOUS",
            peer="127.0.0.1:1",
            client_id="bench",
        )

        def run(ctx: Any = ctx) -> Any:
            return loop.run_until_complete(produce.handle(body, ctx))

        answer = run().responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.none
        assert (answer.log_append_time is not None) == (timestamp_type == "LogAppendTime")
        number = 200
        best = min(timeit.repeat(run, number=number, repeat=7)) / number
        print(f"Produce v9, {PARTITIONS} x 1 MiB, {timestamp_type:13s} {best * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
