"""Times response encoding: ``python tests/protocol/bench_encode.py``.

Compares ``protocol.codec.encode_response`` with the plain approach (kio writer
into a BytesIO, then header and size prefix concatenated) for a FetchResponse
carrying 1 MiB of records across 10 partitions and for a MetadataResponse of
100 topics x 10 partitions. Not collected by pytest.
"""

from __future__ import annotations

import datetime
import importlib
import io
import os
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from protocol.codec import encode_response
from protocol.headers import encode_response_header, response_header_version


def fetch_response(version: int, records_bytes: int = 1 << 20, partitions: int = 10) -> Any:
    module = importlib.import_module(f"kio.schema.fetch.v{version}.response")
    records = os.urandom(records_bytes)
    share = records_bytes // partitions
    data = tuple(
        module.PartitionData(
            partition_index=index,
            error_code=ErrorCode.none,
            high_watermark=1000,
            last_stable_offset=1000,
            log_start_offset=0,
            aborted_transactions=None,
            records=records[index * share : (index + 1) * share],
        )
        for index in range(partitions)
    )
    topic = {"topic": "bench"} if version < 13 else {"topic_id": uuid.uuid4()}
    return module.FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(module.FetchableTopicResponse(partitions=data, **topic),),
    )


def metadata_response(topics: int = 100, partitions: int = 10) -> Any:
    module = importlib.import_module("kio.schema.metadata.v12.response")
    return module.MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=(module.MetadataResponseBroker(node_id=1, host="localhost", port=9092, rack=None),),
        cluster_id="bench",
        controller_id=1,
        topics=tuple(
            module.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=f"topic-{t}",
                topic_id=uuid.uuid4(),
                is_internal=False,
                partitions=tuple(
                    module.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=p,
                        leader_id=1,
                        leader_epoch=0,
                        replica_nodes=(1,),
                        isr_nodes=(1,),
                        offline_replicas=(),
                    )
                    for p in range(partitions)
                ),
                topic_authorized_operations=-2147483648,
            )
            for t in range(topics)
        ),
    )


def naive_encode(correlation_id: int, response: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(response))(buffer, response)
    body = buffer.getvalue()
    header = encode_response_header(
        correlation_id, response_header_version(response.__api_key__, response.__version__)
    )
    return struct.pack(">i", len(header) + len(body)) + header + body


def best_ms(function: Callable[[], object], repeat: int = 5, number: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            function()
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1000


def main() -> None:
    cases = [
        ("FetchResponse v12, 1 MiB / 10 partitions", fetch_response(12)),
        ("FetchResponse v15, 1 MiB / 10 partitions", fetch_response(15)),
        ("FetchResponse v15, 50 MiB / 10 partitions", fetch_response(15, 50 << 20)),
        ("MetadataResponse v12, 100 topics x 10 partitions", metadata_response()),
    ]
    for name, response in cases:
        assert encode_response(7, response) == naive_encode(7, response)
        number = 2 if "50 MiB" in name else 20
        ours = best_ms(lambda r=response: encode_response(7, r), number=number)
        naive = best_ms(lambda r=response: naive_encode(7, r), number=number)
        print(f"{name:50s} encode_response {ours:8.3f} ms   BytesIO+concat {naive:8.3f} ms")


if __name__ == "__main__":
    main()
