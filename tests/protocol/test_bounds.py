"""Lengths and nulls checked before kio's reader (protocol.bounds, through codec).

Every request and response of every API and version kio knows still decodes exactly as
before. A length longer than the bytes left, or a null where Kafka's schema allows
none, is a malformed request, and kio never gets to reserve memory for it.

kio reserves room for an array's announced length before it reads one item, and dies
(SIGABRT) when that fails. Cases that did so run in a child process whose address space
is limited to 1 GiB: a regression fails the test, with the child's signal, instead of
killing pytest.
"""

from __future__ import annotations

import datetime
import importlib
import json
import random
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol import bounds
from protocol.codec import (
    decode_entity,
    decode_request,
    decode_response,
    encode_entity,
    encode_request,
    encode_response,
)
from protocol.errors import MalformedRequest
from protocol.headers import parse_request_header
from tests.protocol.kio_samples import length_sites, payload_classes, prefix_of, sample
from tests.support.regression_frames import (
    BAD_TAGGED_FIELDS,
    FORBIDDEN_NULLS,
    OVER_LONG_ARRAYS,
    fetch_v15_with_tags,
    uvarint,
)

ROOT = Path(__file__).resolve().parents[2]
CHILD_ADDRESS_SPACE = 1 << 30

REQUESTS = payload_classes("request")
RESPONSES = payload_classes("response")


def schema(name: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{name}.v{version}.{kind}")


def frame_of(entity: Any) -> bytes:
    return encode_request(entity, correlation_id=1, client_id="c")[4:]


def in_child(code: str, *args: str) -> str:
    """Run `code` in a fresh interpreter limited to CHILD_ADDRESS_SPACE; its stdout."""
    prelude = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_ADDRESS_SPACE}, {CHILD_ADDRESS_SPACE}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if result.returncode < 0:
        cause = f"killed by {signal.Signals(-result.returncode).name}"
    else:
        cause = f"exit status {result.returncode}"
    assert result.returncode == 0, f"the child was {cause}:\n{result.stderr[-3000:]}"
    return result.stdout


DECODE_IN_CHILD = """
import sys
from protocol.codec import decode_request
for hex_frame in sys.argv[1:]:
    try:
        decode_request(bytes.fromhex(hex_frame))
    except Exception as error:
        print(type(error).__name__, error)
    else:
        print("decoded")
"""


def decode_in_child(frames: list[bytes]) -> list[str]:
    return in_child(DECODE_IN_CHILD, *(f.hex() for f in frames)).splitlines()


# -- lengths that made kio reserve tens of gigabytes ----------------------------------------

# (case, frame without its size prefix, what the error names)
ABORTING = [(bad.case, bad.payload, bad.refusal) for bad in OVER_LONG_ARRAYS]


@pytest.mark.parametrize(("case", "frame", "named"), ABORTING, ids=[c[0] for c in ABORTING])
def test_over_long_arrays_are_malformed_without_reserving_memory(case, frame, named):
    (outcome,) = decode_in_child([frame])
    assert outcome.startswith("MalformedRequest ")
    assert named in outcome
    assert "over the" in outcome


LENGTH_SWEEP = """
import json
from protocol.codec import decode_request
from protocol.errors import MalformedRequest
from tests.protocol.test_bounds import over_long_frames
failures = []
count = 0
for where, frame in over_long_frames():
    count += 1
    try:
        decode_request(frame)
    except MalformedRequest:
        continue
    failures.append(where)
print(json.dumps({"count": count, "failures": failures}))
"""


def over_long_frames() -> Any:
    """For every array, string and bytes field of one sample request of every API and
    version: the frame with that field's length just over the bytes left, and the
    largest its prefix can hold."""
    rng = random.Random(2024)
    for cls in REQUESTS:
        entity = sample(cls, rng)
        for site in length_sites(entity, rng):
            before, _width, after = prefix_of(site, frame_of)
            left = len(after)
            if site.flexible:
                prefixes = [uvarint(left + 2), b"\xff\xff\xff\xff\x7f"]
            elif site.legacy_prefix == 2:
                assert left < 2**15 - 1, "a sample too large to over-run with an int16 length"
                prefixes = [struct.pack(">h", left + 1), b"\x7f\xff"]
            else:
                prefixes = [struct.pack(">i", left + 1), b"\x7f\xff\xff\xff"]
            for prefix in prefixes:
                where = f"{cls.__name__} v{cls.__version__} {site.where} {prefix.hex()}"
                yield where, before + prefix + after


def test_every_length_of_every_request_over_the_bytes_left_is_malformed():
    report = json.loads(in_child(LENGTH_SWEEP))
    assert report["count"] > 1500
    assert report["failures"] == []


# -- nulls where Kafka's schema allows none --------------------------------------------------


# (case, frame without its size prefix, the refusal naming the field)
NULLS = [(bad.case, bad.payload, bad.refusal) for bad in FORBIDDEN_NULLS]


@pytest.mark.parametrize(("case", "frame", "refusal"), NULLS, ids=[c[0] for c in NULLS])
def test_null_where_the_schema_allows_none_is_malformed(case, frame, refusal):
    assert refusal.startswith("non-nullable field ")
    with pytest.raises(MalformedRequest, match=re.escape(refusal)):
        decode_request(frame)


def null_prefix(site: Any) -> bytes:
    if site.flexible:
        return b"\x00"
    return b"\xff" * site.legacy_prefix


def test_every_null_of_every_request_is_refused_unless_the_schema_allows_it():
    """Each array, string and bytes field of one sample request of every API and version,
    made null: a null-allowing field reads as None, any other is a malformed request."""
    rng = random.Random(7)
    refused = accepted = 0
    wrong = []
    for cls in REQUESTS:
        entity = sample(cls, rng)
        for site in length_sites(entity, rng):
            before, _width, after = prefix_of(site, frame_of)
            frame = before + null_prefix(site) + after
            try:
                body = decode_request(frame).body
            except MalformedRequest as error:
                refused += 1
                if site.nullable or "non-nullable field" not in str(error):
                    wrong.append(f"{site.where}: {error}")
                continue
            accepted += 1
            if not site.nullable or body != site.rebuild(None):
                wrong.append(f"{site.where} v{cls.__version__} read as {body}")
    assert wrong == []
    assert refused > 600 and accepted > 150


# -- tagged fields -------------------------------------------------------------------------


# (case, a Fetch v15 frame without its size prefix, the refusal)
TAGGED = [(bad.case, bad.payload, bad.refusal) for bad in BAD_TAGGED_FIELDS]


@pytest.mark.parametrize(("case", "frame", "refusal"), TAGGED, ids=[c[0] for c in TAGGED])
def test_tagged_field_sizes_are_checked(case, frame, refusal):
    with pytest.raises(MalformedRequest, match=re.escape(refusal)):
        decode_request(frame)


def test_tagged_field_of_the_right_size_is_read():
    body = decode_request(fetch_v15_with_tags(b"\x01" + b"\x00" + b"\x04" + b"\x04abc")[4:]).body
    assert body.cluster_id == "abc"


@pytest.mark.parametrize("size", [1, 126, 127, 16_382, 16_383, 2**21 - 2, 2**21 - 1])
def test_records_lengths_of_every_varint_size(size):
    """Records whose compact length takes 1 to 4 bytes, in a Produce kio reads (nine
    partitions): read whole; cut one byte short (with the three tagged-field counts after
    it), malformed."""
    module = schema("produce", 9)
    records = bytes(range(256)) * (size // 256) + bytes(size % 256)
    request = module.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            module.TopicProduceData(
                name="t",
                partition_data=tuple(
                    module.PartitionProduceData(index=i, records=records) for i in range(9)
                ),
            ),
        ),
    )
    frame = frame_of(request)
    assert decode_request(frame).body == request
    with pytest.raises(MalformedRequest, match="PartitionProduceData.records has a length"):
        decode_request(frame[:-4])


# -- decode_entity and decode_response read remote bytes too ------------------------------


ENTITY_IN_CHILD = """
import importlib
from protocol.codec import decode_entity, decode_response
subscription = importlib.import_module("kio.schema.consumer_protocol_subscription.v0.data")
try:
    decode_entity(subscription.ConsumerProtocolSubscription, b"\\x7f\\xff\\xff\\xff")
except ValueError as error:
    print("ValueError", error)
try:
    # MetadataResponse v12: throttle time, then 2**35-2 brokers.
    decode_response(b"\\x00\\x00\\x00\\x01\\x00" + b"\\x00" * 4 + b"\\xff\\xff\\xff\\xff\\x7f", 3, 12)
except Exception as error:
    print(type(error).__name__, error)
"""


def test_entities_and_responses_with_over_long_arrays_do_not_reserve_memory():
    subscription, response = in_child(ENTITY_IN_CHILD).splitlines()
    assert subscription.startswith("ValueError ")
    assert "ConsumerProtocolSubscription.topics has 2147483647 items" in subscription
    assert response.startswith("MalformedResponse ")
    assert "MetadataResponse.brokers has 34359738366 items" in response


def test_entity_with_a_null_array_is_refused():
    module = schema("consumer_protocol_assignment", 1, "data")
    assignment = module.ConsumerProtocolAssignment(assigned_partitions=None, user_data=None)
    with pytest.raises(ValueError, match="non-nullable field .*assigned_partitions"):
        decode_entity(module.ConsumerProtocolAssignment, encode_entity(assignment))


# -- valid input decodes as before -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["request", "response"])
def test_every_api_and_version_round_trips(kind):
    """Random valid entities of every API and version: encoded, checked to their last
    byte, and decoded to the same entity."""
    rng = random.Random(kind)
    classes = REQUESTS if kind == "request" else RESPONSES
    assert len(classes) > 250
    for cls in classes:
        for _ in range(5):
            entity = sample(cls, rng)
            if kind == "request":
                frame = frame_of(entity)
                offset = parse_request_header(frame)[1]
                decoded = decode_request(frame).body
            else:
                frame = encode_response(1, entity)[4:]
                offset = len(frame) - len(encode_entity(entity))
                decoded = decode_response(frame, entity.__api_key__, entity.__version__).body
            assert bounds.check(cls, frame, offset) == len(frame)
            assert decoded == entity


# -- damaged frames: a result or a protocol error, never an abort --------------------------

WINDOWS_IN_CHILD = """
import json, random, sys
from protocol.codec import decode_request
from protocol.errors import ProtocolError
from tests.protocol.test_bounds import REQUESTS, frame_of
from tests.protocol.kio_samples import sample
rng = random.Random(int(sys.argv[1]))
outcomes = {"decoded": 0, "refused": 0}
for cls in REQUESTS:
    for _ in range(3):
        frame = frame_of(sample(cls, rng))
        for _ in range(40):
            data = bytearray(frame)
            at = rng.randrange(8, max(9, len(data) - 3))
            data[at : at + 4] = rng.choice([
                rng.randbytes(4), b"\\xff\\xff\\xff\\xff", b"\\x7f\\xff\\xff\\xff", b"\\xff\\xff\\xff\\x0f",
                b"\\x00\\x00\\x00\\x00", bytes([rng.randrange(256)]) * 4,
            ])
            try:
                decode_request(bytes(data))
            except ProtocolError:
                outcomes["refused"] += 1
            else:
                outcomes["decoded"] += 1
print(json.dumps(outcomes))
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_random_damage_is_decoded_or_refused_never_fatal(seed):
    """Random 4-byte windows of valid requests of every API and version overwritten:
    decode_request returns or raises a ProtocolError (anything else propagates and fails
    the child), and never reserves more than the child's address space allows."""
    outcomes = json.loads(in_child(WINDOWS_IN_CHILD, str(seed)))
    assert outcomes["refused"] > 10_000
    assert outcomes["decoded"] > 1_000
