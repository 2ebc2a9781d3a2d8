"""A connection's requests take effect in the order they were sent, as in Apache Kafka,
where the socket server handles one request of a connection at a time
(`SocketServer.Processor` mutes the channel until its response is sent).

librdkafka sends AddPartitionsToTxn and EndTxn back to back on one connection; if EndTxn
ran first it would find the previous transaction's end and answer INVALID_TXN_STATE,
which is fatal for the producer.
"""

from __future__ import annotations

import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from protocol.records import build_batch
from tests.e2e.rawclient import ensure_topic, fetch_raw
from tests.e2e.wire import WireClient, request

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 22, 24, 26
ROUNDS = 300


def test_add_partitions_and_end_txn_sent_back_to_back_keep_their_order(start_broker) -> None:
    broker = start_broker()
    ensure_topic(broker.port, "ordered")
    tid = f"ordered-{uuid.uuid4().hex[:8]}"
    with WireClient(broker.bootstrap) as client:
        init = client.call(
            request(
                INIT_PRODUCER_ID,
                4,
                transactional_id=tid,
                transaction_timeout=60_000,
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        errors: list[tuple[int, str, ErrorCode]] = []
        for round_ in range(ROUNDS):
            add = client.send(
                request(
                    ADD_PARTITIONS_TO_TXN,
                    3,
                    v3_and_below_transactional_id=tid,
                    v3_and_below_producer_id=pid,
                    v3_and_below_producer_epoch=epoch,
                    v3_and_below_topics=[{"name": "ordered", "partitions": [0]}],
                )
            )
            # Commit and abort alternate: an EndTxn that overtook its AddPartitionsToTxn
            # would find the other outcome's completed state.
            end = client.send(
                request(
                    END_TXN,
                    3,
                    transactional_id=tid,
                    producer_id=pid,
                    producer_epoch=epoch,
                    committed=round_ % 2 == 0,
                )
            )
            added = client.receive(add)
            for topic in added.results_by_topic_v3_and_below:
                for partition in topic.results_by_partition:
                    if partition.partition_error_code != ErrorCode.none:
                        errors.append(
                            (round_, "AddPartitionsToTxn", partition.partition_error_code)
                        )
            ended = client.receive(end)
            if ended.error_code != ErrorCode.none:
                errors.append((round_, "EndTxn", ended.error_code))
        assert errors == []


@pytest.mark.parametrize(
    "bad_size", [struct.pack(">i", -1), b"GET / HTTP/1.1\r\n"], ids=["negative", "over-max"]
)
def test_requests_before_a_bad_size_are_answered_then_the_connection_closes(
    start_broker, bad_size
) -> None:
    """Kafka reads a frame's size only once the request before it is answered: requests
    sent before a size it refuses (negative, or "GET " read as 1195725856 bytes) are
    answered in order, a Produce among them taken, and then the connection closes."""
    broker = start_broker()
    ensure_topic(broker.port, "before-bad-size")
    records = build_batch([(None, b"kept", [], 1_700_000_000_000)])
    with WireClient(broker.bootstrap) as client:
        produced, data = client.encode(
            request(
                0,
                9,
                transactional_id=None,
                acks=-1,
                timeout=30_000,
                topic_data=[
                    {
                        "name": "before-bad-size",
                        "partition_data": [{"index": 0, "records": records}],
                    }
                ],
            )
        )
        versions, more = client.encode(
            request(18, 3, client_software_name="wire", client_software_version="1")
        )
        client.send_raw(data + more + bad_size)
        (part,) = client.receive(produced).responses[0].partition_responses
        assert (part.error_code, part.base_offset) == (ErrorCode.none, 0)
        assert client.receive(versions).error_code == ErrorCode.none
        assert client.wait_closed(), "the broker kept the connection open"
    assert fetch_raw(broker.port, "before-bad-size", 0, offset=0) == [(0, b"kept")]
