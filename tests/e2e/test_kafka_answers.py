"""Answers that must be exactly Apache Kafka's, where the first cut of the broker differed."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from protocol.records import build_batch
from tests.e2e.wire import WireClient, list_offsets, metadata, produce
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
