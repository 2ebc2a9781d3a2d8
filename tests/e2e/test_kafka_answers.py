"""Answers that must be exactly Apache Kafka's, where the first cut of the broker differed."""

from __future__ import annotations

import struct
import uuid

import crc32c
import pytest
from kio.schema.errors import ErrorCode

from protocol.compression import Compression
from protocol.records import build_batch
from tests.e2e.wire import WireClient, list_offsets, metadata, produce, request
from tests.support.brokerproc import BrokerProcess, free_ports

TS = 1_700_000_000_000


def batch(*vs, **kw):
    return build_batch([(None, v, [], TS) for v in vs], **kw)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        data_dir=tmp_path_factory.mktemp("d") / "data",
        port=free_ports(1)[0],
        extra_args=["--default-partitions", "2"],
    )
    yield b.start()
    b.stop()


@pytest.fixture
def c(broker):
    with WireClient(broker.bootstrap) as client:
        yield client


def topic(c):
    name = "t-" + uuid.uuid4().hex[:8]
    assert metadata(c, [name]).topics[0].error_code == 0
    return name


def test_acks_5_keeps_earlier_errors(c):
    t = topic(c)
    r = produce(
        c, {t: {0: batch(b"a"), 1: batch(b"a") + batch(b"b")}, "nope": {0: batch(b"c")}}, acks=5
    )
    assert r[t, 0].error_code == ErrorCode.invalid_required_acks
    assert r[t, 1].error_code == ErrorCode.invalid_record
    assert r["nope", 0].error_code == ErrorCode.unknown_topic_or_partition


def test_illegal_name_without_auto_creation_is_invalid_topic(c):
    m = metadata(c, ["bad name!", ".."], allow_auto=False)
    assert [x.error_code for x in m.topics] == [ErrorCode.invalid_topic_exception] * 2


@pytest.mark.parametrize(("ts", "version"), [(-3, 1), (-3, 6), (-4, 7), (-5, 8), (-6, 8)])
def test_list_offsets_special_timestamp_below_its_version(c, ts, version):
    t = topic(c)
    (a,) = list_offsets(c, t, {0: ts}, version=version).values()
    assert a.error_code == ErrorCode.unsupported_version


def test_transactional_batch_without_transactional_id(c):
    t = topic(c)
    txn = batch(b"x", transactional=True, producer_id=5, producer_epoch=0, base_sequence=0)
    r = produce(c, {t: {0: txn, 1: batch(b"ok")}})
    assert r[t, 0].error_code == ErrorCode.transactional_id_authorization_failed
    assert r[t, 1].error_code == ErrorCode.transactional_id_authorization_failed


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_by_id_or_null_name_before_v12_is_invalid_request(c, version):
    """KafkaApis.handleTopicMetadataRequest: before v12 a topic id or a null name throws
    InvalidRequestException, and MetadataRequest.getErrorResponse answers every topic
    INVALID_REQUEST, a null name as "" (these answers allow no null name)."""
    known, some_id = topic(c), uuid.uuid4()

    def ask(*topics):
        fields = {"include_cluster_authorized_operations": False} if version == 10 else {}
        return c.call(
            request(
                3,
                version,
                topics=list(topics),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
                **fields,
            )
        )

    answer = ask({"name": None, "topic_id": some_id}, {"name": known, "topic_id": None})
    assert [(t.name, t.topic_id, t.error_code) for t in answer.topics] == [
        ("", some_id, ErrorCode.invalid_request),
        (known, None, ErrorCode.invalid_request),
    ]
    assert not any(t.partitions for t in answer.topics)
    (named_with_id,) = ask({"name": known, "topic_id": some_id}).topics
    assert named_with_id.error_code == ErrorCode.invalid_request
    # The connection serves on.
    (by_name,) = ask({"name": known, "topic_id": None}).topics
    assert by_name.error_code == ErrorCode.none and len(by_name.partitions) == 2


def recrc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def test_list_offsets_over_records_that_do_not_decode(c):
    """Batches are stored as produced, their records unread (Kafka decompresses them on
    produce and would refuse these). A lookup by timestamp reads them: a header key that
    is not UTF-8 reads as Kafka reads it (new String replaces what is malformed); zstd
    bytes that do not decompress fail their partition with CORRUPT_MESSAGE, Kafka's
    CorruptRecordException; the other partition answers."""
    t = topic(c)
    odd_key = bytearray(build_batch([(None, b"v", [("h\u00e9", b"")], TS)]))
    at = odd_key.index("h\u00e9".encode())
    odd_key[at + 1 : at + 3] = b"\xff\xfe"
    broken = bytearray(batch(b"v" * 100, compression=Compression.ZSTD))
    broken[61:] = b"\x00" * (len(broken) - 61)
    answers = produce(c, {t: {0: recrc(odd_key), 1: recrc(broken)}})
    assert answers[t, 0].error_code == ErrorCode.none
    assert answers[t, 1].error_code == ErrorCode.none
    for version in (1, 8):
        found = list_offsets(c, t, {0: TS, 1: TS}, version=version)
        assert found[0].error_code == ErrorCode.none
        assert (found[0].offset, found[0].timestamp) == (0, TS)
        assert found[1].error_code == ErrorCode.corrupt_message
        assert found[1].offset == -1
        (latest,) = list_offsets(c, t, {1: -1}, version=version).values()
        assert (latest.error_code, latest.offset) == (ErrorCode.none, 1)
