"""Protocol fuzzing: structure-aware frames of every API and version, and random bytes.

    .venv/bin/python integration/chaos/fuzz.py --cases 100000 --report fuzz.json
    .venv/bin/python integration/chaos/fuzz.py --bootstrap 10.0.0.5:9092 --seconds 600 \\
        --pid 4242 --broker-log /var/log/bucketlog.log

Without --bootstrap it starts its own broker (tests.support.brokerproc.BrokerProcess, on
a fresh data dir). Exit status 0 when nothing was found, 1 otherwise.

What is sent. A *case* is one frame. Frames are sent in *plans*: one connection, one to
six frames, then a half-close (the broker answers what it read and closes), a reset, or
a close after the first answer. Frames come from, by weight:

- valid requests of every API key and version the broker advertises in ApiVersions
  (tests.protocol.kio_samples fills every field of kio's schema at random), and
  targeted ones (Produce of real record batches, Fetch and ListOffsets of the fuzzer's
  own topics: plain, compacted, LogAppendTime);
- the same, mutated: length prefix wrong, short or huge; body cut short; api key,
  version, correlation id, client id and header tagged fields damaged; an array,
  string or bytes length set over the bytes left, to -1, -2 or to the largest its
  prefix holds; varints made endless or too long; tagged-field garbage; strings made
  invalid UTF-8; bytes overwritten, flipped, inserted or deleted; the body of another
  API; inside record batches (the CRC made right again so the records get read):
  record lengths and varints, header keys, batch header fields, compressed bytes;
- random bytes, with and without a plausible size and header;
- the regression frames of tests.support.regression_frames, before anything else, as
  they are and mutated.

What is checked. Each plan's bytes are split and decoded as the broker will (its own
protocol.framing and protocol.codec), which says what it must answer: each request it
can decode and serves gets an answer, in order, that decodes and carries no
UNKNOWN_SERVER_ERROR (the answer to a handler that failed); the first frame it cannot
use closes the connection, and nothing after it is answered. After every batch of
cases: every agent process is alive, its RSS (VmRSS) is under the bound, the broker
log has no ERROR line or traceback (bad input is one WARNING line: broker.eventlog),
no handler error was counted in the stats file, and a well-behaved client
(confluent-kafka) still produces a record and consumes it.

Every finding keeps the frames of its plan (hex) to reproduce it. An agent that died is
restarted and the plans it was serving are sent again one by one, to name the one
that kills it.

Engines. `random` (the default) draws plans from `random.Random(seed)` and keeps many
connections open at once. `hypothesis` draws them from hypothesis
(`st.randoms(use_true_random=False)`), one connection at a time, with the per-plan
checks as a property: a failure is shrunk to a smaller plan. It is several times
slower (see the report's cases/s), so long runs use `random`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import random
import re
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import crc32c  # noqa: E402
from kio.index import KioIndexError, load_request_schema  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402

from broker.entities import build  # noqa: E402
from protocol.codec import decode_request, decode_response, encode_request  # noqa: E402
from protocol.compression import Compression, compress  # noqa: E402
from protocol.errors import ProtocolError, UnsupportedVersion  # noqa: E402
from protocol.framing import DEFAULT_MAX_FRAME_SIZE, ServerConnection  # noqa: E402
from protocol.headers import request_header_version  # noqa: E402
from tests.protocol.kio_samples import length_sites, prefix_of, sample  # noqa: E402
from tests.support import regression_frames  # noqa: E402
from tests.support.brokerproc import BrokerProcess, free_ports, pid_alive  # noqa: E402

API_VERSIONS, PRODUCE, FETCH, LIST_OFFSETS = 18, 0, 1, 2
HEALTH_TOPIC = "fuzz-health"
PLAIN_TOPIC, COMPACT_TOPIC, APPEND_TIME_TOPIC = "fuzz-plain", "fuzz-compact", "fuzz-append-time"
FUZZ_TOPICS = {PLAIN_TOPIC: {}, COMPACT_TOPIC: {"cleanup.policy": "compact"}}
FUZZ_TOPICS[APPEND_TIME_TOPIC] = {"message.timestamp.type": "LogAppendTime"}
FUZZ_PARTITIONS = 3
DRAIN_SECONDS = 0.3  # how long a batch's last connections get to end before the checks
TS = 1_700_000_000_000


# -- what the broker speaks --------------------------------------------------------------


@dataclass(frozen=True)
class Catalog:
    """The broker's advertised APIs, the kio request classes of them, its topics."""

    advertised: dict[int, tuple[int, int]]
    requests: tuple[type, ...]
    topic_ids: dict[str, uuid.UUID]
    max_frame: int = DEFAULT_MAX_FRAME_SIZE

    def request_class(self, api_key: int, version: int) -> type | None:
        try:
            return load_request_schema(api_key, version)
        except KioIndexError:
            return None


def advertised_requests(advertised: dict[int, tuple[int, int]]) -> tuple[type, ...]:
    """kio's request class of every advertised API key and version it knows (the broker
    advertises Produce v0-v2, which it refuses, as Kafka 4 does)."""
    out = []
    for api_key, (low, high) in sorted(advertised.items()):
        for version in range(low, high + 1):
            try:
                out.append(load_request_schema(api_key, version))
            except KioIndexError:
                continue
    return tuple(out)


# -- frames and plans ----------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    data: bytes  # as sent, size prefix included (or none, for bytes that are no frame)
    what: str  # how it was made


@dataclass(frozen=True)
class Plan:
    """One connection: frames sent in order, then an ending."""

    index: int
    frames: tuple[Frame, ...]
    ending: str  # "half-close", "reset" or "drop"

    @property
    def data(self) -> bytes:
        return b"".join(f.data for f in self.frames)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "ending": self.ending,
            "frames": [{"what": f.what, "hex": f.data.hex()} for f in self.frames],
        }


def chance(rng: random.Random, p: float) -> bool:
    """True with probability p. Drawn as an integer: hypothesis's Random gives floats
    near 0 far more often than uniform, and integers nearly uniform."""
    return rng.randrange(1000) < p * 1000


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> bytes:
    return uvarint((value << 1) ^ (value >> 63))


CLIENT_IDS = (None, "", "fuzz", "fuzz-client-" + "é" * 40, "c" * 300)
# A few values that often sit on the edges a reader gets wrong.
EDGE_INT32 = (0, 1, -1, -2, 0x7FFFFFFF, -0x80000000, 0x7FFF, 0xFFFF, 2**24)
# Varints that never end, end too late or announce more than any frame holds.
BAD_VARINTS = (
    b"\xff\xff\xff\xff\x0f",  # 2**32-1
    b"\xff\xff\xff\xff\x7f",  # 2**35-1
    b"\x80\x80\x80\x80\x80\x01",  # six bytes
    b"\xff" * 10,
    b"\x80" * 16,
    b"\x80\x00",  # zero, over-long
    b"\xfe\xff\xff\xff\x07",  # 2**31-2 (zigzag: 2**30-1)
)
INVALID_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\x80", b"\xf8\x88\x80\x80\x80")


@dataclass
class Encoded:
    """A valid request: its entity, its frame without size prefix, where its body starts."""

    entity: Any
    payload: bytes
    body_at: int
    correlation_id: int
    client_id: str | None

    @property
    def name(self) -> str:
        return f"{type(self.entity).__name__} v{type(self.entity).__version__}"

    def encode(self, entity: Any) -> bytes:
        return encode_request(entity, correlation_id=self.correlation_id, client_id=self.client_id)[
            4:
        ]


def encoded(entity: Any, rng: random.Random) -> Encoded:
    correlation_id = rng.randrange(1 << 31)
    client_id = rng.choice(CLIENT_IDS)
    payload = encode_request(entity, correlation_id=correlation_id, client_id=client_id)[4:]
    header_size = 10 + (len(client_id.encode()) if client_id is not None else 0)
    header_size += 1 if request_header_version(entity.__api_key__, entity.__version__) == 2 else 0
    return Encoded(entity, payload, header_size, correlation_id, client_id)


def tame(value: Any, rng: random.Random) -> Any:
    """The entity with its durations made short: most requests should be answered at once
    (a Fetch with a random max_wait waits for days)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, datetime.timedelta):
            changes[f.name] = datetime.timedelta(milliseconds=rng.choice((0, 1, 20, 100)))
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
            changes[f.name] = tuple(tame(item, rng) for item in v)
        elif dataclasses.is_dataclass(v):
            changes[f.name] = tame(v, rng)
    return dataclasses.replace(value, **changes) if changes else value


# Record batches ---------------------------------------------------------------------------

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")


def records_body(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes]]]],
) -> bytes:
    body = bytearray()
    for delta, (key, value, headers) in enumerate(records):
        record = bytearray(b"\x00")
        record += zigzag(delta) + zigzag(delta)  # timestamp delta, offset delta
        for part in (key, value):
            record += zigzag(-1) if part is None else zigzag(len(part)) + part
        record += zigzag(len(headers))
        for hkey, hvalue in headers:
            record += zigzag(len(hkey)) + hkey + zigzag(len(hvalue)) + hvalue
        body += zigzag(len(record)) + record
    return bytes(body)


def batch_of(
    payload: bytes,
    *,
    attributes: int,
    count: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A magic 2 batch of `payload` (records as stored) with a right CRC."""
    out = bytearray(61) + payload
    _BATCH_HEADER.pack_into(
        out, 0, 0, len(out) - 12, -1, 2, 0, attributes, count - 1,
        TS, TS + count, producer_id, producer_epoch, base_sequence, count,
    )  # fmt: skip
    return recrc(out)


def recrc(batch: bytearray) -> bytes:
    if len(batch) >= 21:
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


_BOMBS: dict[int, bytes] = {}


def bomb(codec: int) -> bytes:
    """One record of 64 MiB of zeros, compressed (a few hundred KiB at most)."""
    if codec not in _BOMBS:
        _BOMBS[codec] = compress(codec, records_body([(b"k", bytes(64 << 20), [])]))
    return _BOMBS[codec]


def record_batch(rng: random.Random) -> tuple[bytes, str]:
    """A record batch, valid or damaged past its CRC (which is made right again)."""
    count = rng.choice((1, 1, 2, 5))
    records = []
    for _ in range(count):
        key = rng.choice((None, b"", b"k", rng.randbytes(8)))
        value = rng.choice((None, b"", b"v", rng.randbytes(rng.randrange(200))))
        headers = []
        for _ in range(rng.choice((0, 0, 1, 3))):
            hkey = rng.choice((b"h", "é".encode(), rng.choice(INVALID_UTF8), b""))
            headers.append((hkey, rng.randbytes(rng.randrange(10))))
        records.append((key, value, headers))
    body = records_body(records)
    what = [f"{count} records"]
    if chance(rng, 0.3):  # damage the records themselves
        at = rng.randrange(len(body) + 1)
        junk = rng.choice((rng.choice(BAD_VARINTS), rng.randbytes(rng.randrange(1, 6)), b"\x01"))
        body = body[:at] + junk + body[at + len(junk) * rng.randrange(2) :]
        what.append(f"records damaged at {at}")
    codec = rng.choice((0, 0, 0, 1, 2, 3, 4))
    payload = compress(codec, body) if codec else body
    if codec and chance(rng, 0.15):
        at = rng.randrange(len(payload))
        payload = payload[:at] + rng.randbytes(rng.randrange(1, 8)) + payload[at + 4 :]
        what.append("compressed bytes damaged")
    if codec and chance(rng, 0.004):
        payload = bomb(codec)
        count = 1
        what.append("64 MiB of zeros compressed")
    if codec:
        what.append(Compression(codec).name.lower())
    attributes = codec
    if chance(rng, 0.1):
        attributes |= rng.choice((0x08, 0x10, 0x20, 0x40, 0x07, rng.randrange(1 << 16)))
        what.append(f"attributes {attributes:#x}")
        attributes -= (attributes & 0x8000) << 1  # as an int16
    producer = {}
    if chance(rng, 0.2):
        producer = {
            "producer_id": rng.choice((0, 1, 7, rng.randrange(1 << 40))),
            "producer_epoch": rng.choice((0, -1, 0x7FFF)),
            "base_sequence": rng.choice((0, -1, 0x7FFFFFFF)),
        }
        what.append("producer")
    batch = bytearray(batch_of(payload, attributes=attributes, count=count, **producer))
    if chance(rng, 0.15):  # a header field lies
        at, fmt = rng.choice(((8, ">i"), (16, ">b"), (23, ">i"), (57, ">i"), (0, ">q")))
        struct.pack_into(fmt, batch, at, rng.choice(EDGE_INT32) if fmt != ">b" else 3)
        batch = bytearray(recrc(batch) if chance(rng, 0.7) else bytes(batch))
        what.append(f"header field at {at} set")
    if chance(rng, 0.05):
        batch = batch[: rng.randrange(len(batch))]
        what.append("cut short")
    if chance(rng, 0.05):
        batch += batch_of(records_body(records), attributes=0, count=count)
        what.append("two batches")
    return bytes(batch), ", ".join(what)


# Request generators -----------------------------------------------------------------------


def valid_request(rng: random.Random, catalog: Catalog) -> tuple[Encoded, str]:
    cls = rng.choice(catalog.requests)
    entity = sample(cls, rng)
    if chance(rng, 0.9):
        entity = tame(entity, rng)
    return encoded(entity, rng), "sample"


def produce_request(rng: random.Random, catalog: Catalog) -> tuple[Encoded, str]:
    low, high = catalog.advertised[PRODUCE]
    versions = [v for v in range(low, high + 1) if catalog.request_class(PRODUCE, v)]
    version = rng.choice(versions)
    topics, whats = [], []
    for _ in range(rng.choice((1, 1, 2))):
        topic = rng.choice((*FUZZ_TOPICS, "fuzz-no-such-topic"))
        parts = []
        for _ in range(rng.choice((1, 1, 2, 9))):
            records, what = record_batch(rng)
            parts.append({"index": rng.choice((0, 1, 2, 3, -1)), "records": records})
            whats.append(what)
        topics.append({"name": topic, "partition_data": parts})
    request = build(
        load_request_schema(PRODUCE, version),
        {
            "transactional_id": rng.choice((None, None, "fuzz-txn")),
            "acks": rng.choice((-1, -1, 1, 0, 5)),
            "timeout": rng.choice((0, 100, 5000)),
            "topic_data": topics,
        },
    )
    return encoded(request, rng), "produce " + "; ".join(whats)


def fetch_request(rng: random.Random, catalog: Catalog) -> tuple[Encoded, str]:
    low, high = catalog.advertised[FETCH]
    version = rng.randrange(low, high + 1)
    topic = rng.choice(list(FUZZ_TOPICS))
    partition = {
        "partition": rng.choice((0, 1, 2, 7)),
        "fetch_offset": rng.choice((0, 0, 1, 5, 1 << 40, -1)),
        "log_start_offset": -1,
        "partition_max_bytes": rng.choice((0, 1, 1 << 20)),
        "current_leader_epoch": -1,
        "last_fetched_epoch": -1,
    }
    request = build(
        load_request_schema(FETCH, version),
        {
            "replica_id": -1,
            "max_wait": rng.choice((0, 10, 100)),
            "min_bytes": rng.choice((0, 1, 1 << 20)),
            "max_bytes": rng.choice((1, 1 << 20, 0x7FFFFFFF)),
            "isolation_level": rng.choice((0, 1)),
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "topic_id": catalog.topic_ids.get(topic),
                    "partitions": [partition],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    return encoded(request, rng), f"fetch {topic}"


def list_offsets_request(rng: random.Random, catalog: Catalog) -> tuple[Encoded, str]:
    low, high = catalog.advertised[LIST_OFFSETS]
    version = rng.randrange(low, high + 1)
    topic = rng.choice(list(FUZZ_TOPICS))
    request = build(
        load_request_schema(LIST_OFFSETS, version),
        {
            "replica_id": -1,
            "isolation_level": rng.choice((0, 1)),
            "timeout_ms": 100,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": rng.choice((0, 1, 9)),
                            "current_leader_epoch": -1,
                            "timestamp": rng.choice((-1, -2, -3, -4, -5, 0, TS, TS + 3)),
                        }
                    ],
                }
            ],
        },
    )
    return encoded(request, rng), f"list-offsets {topic}"


# Mutators: (rng, request, catalog) -> (payload without size prefix, what) ----------------


def m_truncate(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    at = rng.randrange(len(req.payload))
    return req.payload[:at], f"cut to {at} bytes"


def m_header(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    data = bytearray(req.payload)
    api_key, version = struct.unpack_from(">hh", data)
    low, high = catalog.advertised.get(api_key, (0, 0))
    choice = rng.randrange(6)
    if choice == 0:
        new = rng.choice((*catalog.advertised, rng.randrange(-(1 << 15), 1 << 15), 999, -1))
        struct.pack_into(">h", data, 0, new)
        return bytes(data), f"api key {new}"
    if choice == 1:
        new = rng.choice((low - 1, high + 1, -1, 0x7FFF, rng.randrange(-(1 << 15), 1 << 15)))
        struct.pack_into(">h", data, 2, new)
        return bytes(data), f"api version {new}"
    if choice == 2:
        new = rng.choice((-1, 0, -0x80000000, 0x7FFFFFFF))
        struct.pack_into(">i", data, 4, new)
        return bytes(data), f"correlation id {new}"
    if choice == 3:
        length = len(req.client_id.encode()) if req.client_id is not None else 0
        new = rng.choice((-2, -0x8000, length + 1, length + 100, 0x7FFF, max(0, length - 1)))
        struct.pack_into(">h", data, 8, new)
        return bytes(data), f"client id length {new}"
    if choice == 4 and req.client_id:
        at = 10 + rng.randrange(len(req.client_id.encode()))
        junk = rng.choice(INVALID_UTF8)
        data[at : at + 1] = junk
        struct.pack_into(">h", data, 8, len(req.client_id.encode()) - 1 + len(junk))
        return bytes(data), "client id not UTF-8"
    # Header tagged fields: present where the header has none, garbage where it has some.
    at = req.body_at - 1 if request_header_version(api_key, version) == 2 else req.body_at
    garbage = tagged_garbage(rng)
    drop = 1 if request_header_version(api_key, version) == 2 else 0
    return bytes(data[:at]) + garbage + bytes(data[at + drop :]), "header tagged fields"


def tagged_garbage(rng: random.Random) -> bytes:
    fields = rng.choice((0, 1, 1, 2, 3))
    count = rng.choice((uvarint(fields), uvarint(fields), rng.choice(BAD_VARINTS)))
    out = bytearray(count)
    for _ in range(fields):
        value = rng.randbytes(rng.choice((0, 1, 4, 16)))
        size = rng.choice((len(value), len(value), len(value) + 1, max(0, len(value) - 1)))
        out += uvarint(rng.choice((0, 1, 2, 3, 9, 1 << 20)))
        out += rng.choice((uvarint(size), uvarint(size), rng.choice(BAD_VARINTS)))
        out += value
    return bytes(out)


def m_length(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    """An array, string or bytes length prefix made to lie (protocol.bounds' ground)."""
    sites = list(length_sites(req.entity, rng))
    if not sites:
        return m_window(rng, req, catalog)
    site = rng.choice(sites)
    try:
        before, _width, after = prefix_of(site, req.encode)
    except StopIteration:  # the two encodings did not differ where expected
        return m_window(rng, req, catalog)
    left = len(after)
    if site.flexible:
        prefix = rng.choice(
            (uvarint(left + 2), uvarint(left + 1), uvarint(0), uvarint(rng.randrange(1 << 20)))
            + BAD_VARINTS
        )
    elif site.legacy_prefix == 2:
        value = rng.choice((-1, -2, -0x8000, 0x7FFF, min(left + 1, 0x7FFF), 0))
        prefix = struct.pack(">h", value)
    else:
        value = rng.choice((-1, -2, -0x80000000, 0x7FFFFFFF, left + 1, 0, 1 << 24))
        prefix = struct.pack(">i", value)
    return before + prefix + after, f"length of {site.where} {prefix.hex()}"


def m_varint(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    at = rng.randrange(req.body_at, len(req.payload) + 1)
    junk = rng.choice(BAD_VARINTS)
    cut = rng.choice((0, 1, len(junk)))
    return req.payload[:at] + junk + req.payload[at + cut :], f"varint {junk.hex()} at {at}"


def m_tagged(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    """Tagged-field garbage in place of a zero byte of the body (the last one is the
    request's own tagged-field count; others are those of structs, or empty arrays)."""
    zeros = [i for i in range(req.body_at, len(req.payload)) if req.payload[i] == 0]
    if not zeros:
        return m_varint(rng, req, catalog)
    at = zeros[-1] if chance(rng, 0.5) else rng.choice(zeros)
    garbage = tagged_garbage(rng)
    return req.payload[:at] + garbage + req.payload[at + 1 :], f"tagged fields at {at}"


def m_string(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    """A byte of a string made invalid UTF-8 (kio_samples' strings are known)."""
    spots = []
    for needle in (b"orders", "ünïcode-名前".encode(), b"xxxx", b"fuzz"):
        start = req.payload.find(needle, req.body_at)
        if start >= 0:
            spots.append((start, len(needle)))
    if not spots:
        return m_window(rng, req, catalog)
    start, size = rng.choice(spots)
    at = start + rng.randrange(size)
    junk = rng.choice(INVALID_UTF8)[:1]
    return req.payload[:at] + junk + req.payload[at + 1 :], f"invalid UTF-8 at {at}"


def m_window(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    data = bytearray(req.payload)
    at = rng.randrange(8, max(9, len(data)))
    width = rng.choice((1, 2, 4, 8))
    junk = rng.choice(
        (rng.randbytes(width), b"\xff" * width, b"\x7f" + b"\xff" * (width - 1), bytes(width))
    )
    data[at : at + width] = junk
    return bytes(data), f"bytes at {at} set to {junk.hex()}"


def m_flip(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    data = bytearray(req.payload)
    flips = [rng.randrange(len(data) * 8) for _ in range(rng.choice((1, 1, 2, 8)))]
    for bit in flips:
        data[bit // 8] ^= 1 << (bit % 8)
    return bytes(data), f"bits {flips} flipped"


def m_splice(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    at = rng.randrange(len(req.payload) + 1)
    if chance(rng, 0.5):
        junk = rng.randbytes(rng.choice((1, 2, 7, 100)))
        return req.payload[:at] + junk + req.payload[at:], f"{len(junk)} bytes inserted at {at}"
    n = rng.choice((1, 2, 7, 100))
    return req.payload[:at] + req.payload[at + n :], f"{n} bytes deleted at {at}"


def m_swap_body(rng: random.Random, req: Encoded, catalog: Catalog) -> tuple[bytes, str]:
    other, _ = valid_request(rng, catalog)
    return req.payload[: req.body_at] + other.payload[other.body_at :], f"body of {other.name}"


MUTATORS: dict[str, Callable[[random.Random, Encoded, Catalog], tuple[bytes, str]]] = {
    "truncate": m_truncate,
    "header": m_header,
    "length": m_length,
    "varint": m_varint,
    "tagged": m_tagged,
    "string": m_string,
    "window": m_window,
    "flip": m_flip,
    "splice": m_splice,
    "swap-body": m_swap_body,
}
MUTATOR_WEIGHTS = {"length": 4, "header": 2, "varint": 2, "tagged": 2, "window": 2}


def size_prefix(rng: random.Random, payload: bytes, catalog: Catalog) -> tuple[bytes, str]:
    """Most frames carry their true size; some lie (short, long, zero, negative, huge)."""
    if chance(rng, 0.88):
        return sized(payload), ""
    n = len(payload)
    size = rng.choice(
        (
            max(0, n - rng.choice((1, 2, 4, 9))),
            n + rng.choice((1, 4, 100)),
            0,
            -1,
            -0x80000000,
            catalog.max_frame,
            catalog.max_frame + 1,
            0x7FFFFFFF,
        )
    )
    return struct.pack(">i", size) + payload, f", size prefix {size} for {n} bytes"


def random_frame(rng: random.Random, catalog: Catalog) -> Frame:
    kind = rng.randrange(4)
    if kind == 0:  # a plausible header, then random bytes
        api_key = rng.choice(list(catalog.advertised))
        low, high = catalog.advertised[api_key]
        header = struct.pack(">hhih", api_key, rng.randrange(low, high + 1), 1, 4) + b"fuzz"
        body = rng.randbytes(rng.choice((0, 1, 5, 50, 500)))
        return Frame(sized(header + b"\x00" * rng.randrange(2) + body), "random body")
    if kind == 1:  # random bytes with a true size
        return Frame(sized(rng.randbytes(rng.choice((0, 3, 8, 30, 300)))), "random frame")
    if kind == 2:  # bytes that are no Kafka at all
        junk = rng.choice(
            (
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(40),  # TLS hello
                b"\x00" * rng.randrange(1, 64),
                b"\xff" * rng.randrange(1, 64),
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
            )
        )
        return Frame(junk, "not Kafka")
    return Frame(rng.randbytes(rng.choice((1, 4, 9, 200))), "random bytes")


def regression_frame(rng: random.Random, catalog: Catalog) -> Frame:
    bad = rng.choice(regression_frames.ALL)
    if chance(rng, 0.5) or len(bad.payload) < 9:
        return Frame(bad.frame, f"regression {bad.case}")
    data = bytearray(bad.payload)
    at = rng.randrange(8, len(data))
    data[at] = rng.randrange(256)
    return Frame(sized(bytes(data)), f"regression {bad.case}, byte {at} set")


TARGETED = (produce_request, fetch_request, list_offsets_request)


def make_frame(rng: random.Random, catalog: Catalog) -> Frame:
    """One case: valid (35%), mutated (50%), random (10%) or a regression frame (5%)."""
    roll = rng.randrange(1000) / 1000
    if roll < 0.10:
        return random_frame(rng, catalog)
    if roll < 0.15:
        return regression_frame(rng, catalog)
    if chance(rng, 0.3):
        req, what = rng.choice(TARGETED)(rng, catalog)
    else:
        req, what = valid_request(rng, catalog)
    what = f"{req.name} {what}"
    if roll < 0.50:
        payload = req.payload
    else:
        names = list(MUTATORS)
        weights = [MUTATOR_WEIGHTS.get(n, 1) for n in names]
        payload = req.payload
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            name = rng.choices(names, weights)[0]
            current = dataclasses.replace(req, payload=payload)
            payload, how = MUTATORS[name](rng, current, catalog)
            what += f"; {name}: {how}"
            if len(payload) < req.body_at:
                break
    data, how = size_prefix(rng, payload, catalog)
    return Frame(data, what + how)


def make_plan(rng: random.Random, catalog: Catalog, index: int) -> Plan:
    count = rng.choice((1, 1, 2, 2, 3, 4, 6))
    frames = tuple(make_frame(rng, catalog) for _ in range(count))
    ending = rng.choices(("half-close", "reset", "drop"), (8, 1, 1))[0]
    return Plan(index, frames, ending)


def seed_plans(start: int) -> list[Plan]:
    """Each regression frame alone, then all of them on one connection."""
    plans = [
        Plan(start + i, (Frame(bad.frame, f"regression {bad.case}"),), "half-close")
        for i, bad in enumerate(regression_frames.ALL)
    ]
    frames = tuple(Frame(bad.frame, f"regression {bad.case}") for bad in regression_frames.ALL)
    plans.append(Plan(start + len(plans), frames, "half-close"))
    return plans


# -- what the broker must do with a plan ------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """The broker's view of a plan: the answers it owes, in order, and whether it closes."""

    answers: tuple[tuple[int, int, int, str], ...]  # (correlation id, api key, version, what)
    closes: bool  # a frame it cannot use ends the connection (else: our half-close does)
    silent: bool  # a request without an answer (Produce acks=0) comes before the end


def broker_view(
    data: bytes, half_closed: bool, advertised: dict[int, tuple[int, int]], max_frame: int
) -> Expected:
    """What the broker owes for these bytes, by its own framing and decoder."""
    connection = ServerConnection(max_frame_size=max_frame)
    connection.receive_data(data)
    if half_closed:
        connection.receive_data(b"")
    answers: list[tuple[int, int, int, str]] = []
    silent = False
    while True:
        try:
            payload = connection.next_frame()
        except ProtocolError:
            return Expected(tuple(answers), True, silent)
        if payload is None:
            return Expected(tuple(answers), False, silent)
        try:
            request = decode_request(payload)
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS:
                answers.append((exc.correlation_id, API_VERSIONS, 0, "ApiVersions v0 answer"))
                continue
            return Expected(tuple(answers), True, silent)
        except ProtocolError:
            return Expected(tuple(answers), True, silent)
        header = request.header
        low, high = advertised.get(header.api_key, (0, -1))
        if not low <= header.api_version <= high:
            if header.api_key == API_VERSIONS:
                answers.append((header.correlation_id, API_VERSIONS, 0, "ApiVersions v0"))
                continue
            return Expected(tuple(answers), True, silent)
        if header.api_key == PRODUCE and getattr(request.body, "acks", None) == 0:
            silent = True
            continue
        name = f"{type(request.body).__name__} v{header.api_version}"
        answers.append((header.correlation_id, header.api_key, header.api_version, name))


# -- sending -------------------------------------------------------------------------------


@dataclass
class Outcome:
    plan: Plan
    local_port: int = 0
    received: bytes = b""
    ended: str = ""  # "eof", "reset", "timeout", "ours" (we closed first) or "connect"
    error: str = ""
    seconds: float = 0.0


async def run_plan(host: str, port: int, plan: Plan, limit: float) -> Outcome:
    """Send a plan's frames on a new connection and read until it ends (`limit` s at most)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome = Outcome(plan)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), limit)
    except (OSError, TimeoutError) as exc:
        outcome.ended, outcome.error = "connect", str(exc) or type(exc).__name__
        return outcome
    sock = writer.get_extra_info("socket")
    outcome.local_port = sock.getsockname()[1]
    received = bytearray()
    try:
        try:
            for frame in plan.frames:
                writer.write(frame.data)
                await writer.drain()
            if plan.ending == "half-close":
                writer.write_eof()
        except (ConnectionError, OSError):
            pass  # the broker closed while we were writing: read what it said
        if plan.ending == "reset":
            outcome.ended = "ours"
            return outcome
        deadline = started + limit
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                outcome.ended = "timeout"
                break
            try:
                chunk = await asyncio.wait_for(reader.read(1 << 16), remaining)
            except TimeoutError:
                outcome.ended = "timeout"
                break
            except (ConnectionError, OSError):
                outcome.ended = "reset"
                break
            if not chunk:
                outcome.ended = "eof"
                break
            received += chunk
            if plan.ending == "drop":
                outcome.ended = "ours"
                break
    finally:
        outcome.received = bytes(received)
        outcome.seconds = loop.time() - started
        if outcome.ended in ("ours", "timeout"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return outcome


def split_frames(data: bytes) -> list[bytes]:
    frames, at = [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, at)
        if size < 0 or at + 4 + size > len(data):
            break
        frames.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


def error_codes(value: Any) -> Iterator[tuple[str, ErrorCode]]:
    """Every ErrorCode in a response entity, with the field that holds it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if isinstance(v, ErrorCode):
                yield f"{type(value).__name__}.{f.name}", v
            elif isinstance(v, tuple):
                for item in v:
                    yield from error_codes(item)
            else:
                yield from error_codes(v)


# -- findings --------------------------------------------------------------------------------


@dataclass
class Finding:
    kind: str
    detail: str
    plan: Plan | None = None
    log: list[str] = field(default_factory=list)

    def signature(self) -> str:
        return self.kind + ":" + re.sub(r"\d+", "N", self.detail)[:160]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "detail": self.detail}
        if self.plan is not None:
            out["plan"] = self.plan.to_json()
        if self.log:
            out["log"] = self.log[:40]
        return out


def judge_answers(
    data: bytes,
    received: bytes,
    ended: str,
    advertised: dict[int, tuple[int, int]],
    max_frame: int,
) -> list[tuple[str, str]]:
    """(kind, detail) of each way the answers to a half-closed plan's bytes differ from
    what the broker owes."""
    expected = broker_view(data, True, advertised, max_frame)
    got = split_frames(received)
    found: list[tuple[str, str]] = []
    for index, frame in enumerate(got):
        if index >= len(expected.answers):
            if not expected.silent:
                found.append(("answered-past-the-end", f"answer {index + 1} unasked"))
            break
        correlation_id, api_key, version, what = expected.answers[index]
        if len(frame) < 4 or struct.unpack_from(">i", frame)[0] != correlation_id:
            if not expected.silent:
                found.append(("answer-out-of-order", f"answer {index + 1} to {what}"))
            break
        try:
            body = decode_response(frame, api_key, version).body
        except Exception as exc:
            # kio reads int64 times as datetimes and cannot read Kafka's -1 (a
            # transaction's start time when none is ongoing): not the broker's fault.
            if "negative timestamp" not in str(exc):
                found.append(("answer-undecodable", f"{what}: {exc}"))
            break
        for where, code in error_codes(body):
            if code == ErrorCode.unknown_server_error:
                found.append(("unknown-server-error", f"{what}: {where}"))
                break
    if ended == "eof" and len(got) < len(expected.answers) and not expected.silent:
        found.append(("closed-before-answering", expected.answers[len(got)][3]))
    return found


class Judge:
    """Judges outcomes in a child process. The judging decodes what the broker decodes,
    with the broker's code: a decoder defect that aborts the process (kio reserving
    memory for a length it was told) must show as a finding, not end the fuzzer."""

    def __init__(self, catalog: Catalog) -> None:
        self.advertised = dict(catalog.advertised)
        self.max_frame = catalog.max_frame
        self._pool: ProcessPoolExecutor | None = None
        self._alone = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def judge(self, outcome: Outcome) -> list[Finding]:
        plan = outcome.plan
        if outcome.ended in ("connect", "ours") or plan.ending != "half-close":
            return []
        args = (plan.data, outcome.received, outcome.ended, self.advertised, self.max_frame)
        pool = self._executor()
        try:
            found = await asyncio.get_running_loop().run_in_executor(pool, judge_answers, *args)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
            # Every plan queued on the process failed with it: this one is judged again
            # alone, to tell the plan that kills it from the others.
            found = await asyncio.to_thread(self._judge_alone, args)
            if found is None:
                detail = "decoding these frames, with the broker's decoder, killed the process"
                return [Finding("decoder-died", detail, plan)]
        return [Finding(kind, detail, plan) for kind, detail in found]

    def _judge_alone(self, args: tuple[Any, ...]) -> list[tuple[str, str]] | None:
        """judge_answers(*args) in a process of its own; None if the process dies."""
        with self._alone:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                try:
                    return pool.submit(judge_answers, *args).result()
                except BrokenProcessPool:
                    return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


async def run_and_judge(
    host: str, port: int, plan: Plan, limit: float, judge: Judge
) -> tuple[Outcome, list[Finding]]:
    outcome = await run_plan(host, port, plan, limit)
    return outcome, await judge.judge(outcome)


# -- the broker under test ------------------------------------------------------------------


class Target:
    """The broker under test: its address, its agent processes, its log and stats."""

    bootstrap: str

    def agent_pids(self) -> list[int]:
        """The pids of its agent processes alive now (none if not known)."""
        return []

    def agents(self) -> int:
        """How many agent processes it should have alive."""
        return 0

    def log_lines(self) -> list[str]:
        """The log lines written since the last call."""
        return []

    def handler_errors(self) -> int | None:
        return None

    def restart(self) -> bool:
        return False


class OwnBroker(Target):
    """A broker process started here (tests.support.brokerproc), which can be restarted."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap
        self._log_at = 0
        self._errors_before = 0

    def agents(self) -> int:
        return self.broker.agents

    def agent_pids(self) -> list[int]:
        proc = self.broker.proc
        if proc is None or proc.poll() is not None:
            return []
        if self.broker.agents == 1:
            return [proc.pid]
        return sorted(self.broker.agent_pids().values())

    def log_lines(self) -> list[str]:
        path = self.broker.log_path
        if path is None or not path.exists():
            return []
        with open(path, "rb") as log:
            log.seek(self._log_at)
            data = log.read()
        cut = data.rfind(b"\n") + 1
        self._log_at += cut
        return data[:cut].decode(errors="replace").splitlines()

    def handler_errors(self) -> int | None:
        total = 0
        for port in self.broker.ports:
            counters = self.broker.stats(port).get("connections") or {}
            total += int(counters.get("handler_errors", 0))
        return self._errors_before + total

    def restart(self) -> bool:
        """Start the broker again on the same data (after an agent died)."""
        self._errors_before = self.handler_errors() or 0
        self.broker.stop()
        with contextlib.suppress(OSError):
            for port in self.broker.ports:
                (self.broker.data_dir / f"stats-{port}.json").unlink(missing_ok=True)
        self.broker.start()
        return True


class External(Target):
    def __init__(self, bootstrap: str, pids: list[int], log: Path | None) -> None:
        self.bootstrap = bootstrap
        self.pids = pids
        self.log = log
        self._log_at = log.stat().st_size if log is not None and log.exists() else 0

    def agents(self) -> int:
        return len(self.pids)

    def agent_pids(self) -> list[int]:
        return [pid for pid in self.pids if pid_alive(pid)]

    def log_lines(self) -> list[str]:
        if self.log is None or not self.log.exists():
            return []
        with open(self.log, "rb") as log:
            log.seek(self._log_at)
            data = log.read()
        cut = data.rfind(b"\n") + 1
        self._log_at += cut
        return data[:cut].decode(errors="replace").splitlines()


def unindented(lines: list[str], keep: int = 30) -> list[str]:
    """The last lines that are not a stack frame (a dying process's native backtrace
    buries its one line of reason under hundreds)."""
    return [line for line in lines if line[:1] not in (" ", "\t")][-keep:]


def rss_kib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
PEER = re.compile(r"127\.0\.0\.1:(\d+)|\[::1\]:(\d+)")


class WellBehavedClient:
    """confluent-kafka: produce one record to HEALTH_TOPIC and read it back."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer, Producer

        # Its own failures are what check() returns: librdkafka's lines would only repeat
        # them (and go on after the broker stops).
        common = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000, "log_level": 2}
        self.producer = Producer(
            {**common, "acks": "all", "linger.ms": 0, "message.timeout.ms": 20_000}
        )
        self.consumer = Consumer({**common, "group.id": "fuzz-health", "enable.auto.commit": False})

    def check(self, timeout: float = 20.0) -> str | None:
        """None if a record went in and came back, else what went wrong."""
        from confluent_kafka import TopicPartition

        value = uuid.uuid4().bytes
        reports: list[Any] = []
        self.producer.produce(
            HEALTH_TOPIC, value=value, partition=0, on_delivery=lambda e, m: reports.append((e, m))
        )
        if self.producer.flush(timeout) or not reports:
            return f"the record was not acknowledged in {timeout:.0f} s"
        error, message = reports[0]
        if error is not None:
            return f"produce failed: {error}"
        offset = message.offset()
        self.consumer.assign([TopicPartition(HEALTH_TOPIC, 0, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.consumer.poll(0.5)
            if got is None:
                continue
            if got.error() is not None:
                continue
            if got.offset() == offset and got.value() == value:
                return None
        return f"the record at offset {offset} was not read back in {timeout:.0f} s"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.producer.flush(1)


def prepare_topics(bootstrap: str) -> dict[str, uuid.UUID]:
    """Create the fuzzer's topics if absent; their ids."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    wanted = [NewTopic(HEALTH_TOPIC, 1)] + [
        NewTopic(name, FUZZ_PARTITIONS, config=config) for name, config in FUZZ_TOPICS.items()
    ]
    for name, future in admin.create_topics(wanted, request_timeout=20).items():
        try:
            future.result(30)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise RuntimeError(f"cannot create topic {name}: {exc}") from exc
    from tests.e2e.wire import WireClient, metadata

    with WireClient(bootstrap) as client:
        answer = metadata(client, [HEALTH_TOPIC, *FUZZ_TOPICS], allow_auto=False)
    return {t.name: t.topic_id for t in answer.topics if t.error_code == ErrorCode.none}


def discover(bootstrap: str) -> dict[int, tuple[int, int]]:
    from tests.e2e.wire import WireClient, api_versions

    with WireClient(bootstrap) as client:
        return api_versions(client)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Settings:
    cases: int | None
    seconds: float | None
    seed: int
    batch: int = 1000
    concurrency: int = 64
    plan_timeout: float = 3.0
    max_rss_mb: float = 1024.0
    max_frame: int = DEFAULT_MAX_FRAME_SIZE  # the broker's --max-frame-bytes
    engine: str = "random"
    seeds: bool = True  # the regression frames first
    replay: tuple[Plan, ...] = ()  # these plans only (cases: their frames)
    verbose: bool = False


@dataclass
class Run:
    settings: Settings
    target: Target
    catalog: Catalog
    client: WellBehavedClient
    judge: Judge
    started: float = field(default_factory=time.monotonic)
    cases: int = 0
    plans: int = 0
    deaths: int = 0
    max_rss_kib: int = 0
    rss_series: list[tuple[int, float]] = field(default_factory=list)
    health_checks: int = 0
    slow: Counter[str] = field(default_factory=Counter)
    endings: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    signatures: Counter[str] = field(default_factory=Counter)
    recent: dict[int, Plan] = field(default_factory=dict)  # local port -> plan
    handler_errors_seen: int = 0
    refused_seen: int = 0
    seeded: int = 0  # plans of regression frames sent
    pids_seen: set[int] = field(default_factory=set)  # the agents' pids at the last check
    draining: float = 0.0  # seconds waiting for a batch's last connections
    latencies: list[float] = field(default_factory=list)  # seconds of each connection
    checking: float = 0.0  # seconds in the checks after each batch
    stopped: str = ""

    def add(self, finding: Finding) -> None:
        signature = finding.signature()
        self.signatures[signature] += 1
        if self.signatures[signature] <= 3:
            self.findings.append(finding)
            if self.settings.verbose:
                print(f"finding: {finding.kind}: {finding.detail}", file=sys.stderr)

    def done(self) -> bool:
        s = self.settings
        if s.cases is not None and self.cases >= s.cases:
            return True
        return s.seconds is not None and time.monotonic() - self.started >= s.seconds

    def record(self, outcome: Outcome, found: list[Finding]) -> None:
        self.plans += 1
        self.cases += len(outcome.plan.frames)
        self.endings[outcome.ended] += 1
        self.latencies.append(outcome.seconds)
        if outcome.local_port:
            self.recent[outcome.local_port] = outcome.plan
        if outcome.ended == "timeout":
            first = outcome.plan.frames[0].what.split(";")[0].split(" ")
            self.slow[" ".join(first[:2])] += 1
        for finding in found:
            self.add(finding)

    # after every batch

    def check(self, candidates: list[Plan]) -> None:
        """The checks after a batch; `candidates` are the plans an agent that died may
        have died of."""
        pids = self.target.agent_pids()
        # A supervisor restarts an agent that died: its pid changes.
        died = bool(self.pids_seen - set(pids)) or len(pids) < self.target.agents()
        self.pids_seen = set(pids)
        lines = self.target.log_lines()
        self.check_log(lines)
        refused = self.endings["connect"] - self.refused_seen
        self.refused_seen = self.endings["connect"]
        if died:
            self.deaths += 1
            self.add(Finding("agent-death", "an agent process exited", None, unindented(lines)))
            self.isolate_death(candidates)
            return
        if refused:
            self.add(Finding("connect", f"{refused} connections refused or timed out"))
        rss = sum(rss_kib(pid) for pid in pids)
        self.max_rss_kib = max(self.max_rss_kib, rss)
        self.rss_series.append((self.cases, round(rss / 1024, 1)))
        if rss / 1024 > self.settings.max_rss_mb:
            self.add(
                Finding("rss", f"RSS {rss / 1024:.0f} MiB over {self.settings.max_rss_mb:.0f}")
            )
        errors = self.target.handler_errors()
        if errors is not None and errors > self.handler_errors_seen:
            self.add(Finding("handler-errors", f"{errors - self.handler_errors_seen} counted"))
            self.handler_errors_seen = errors
        self.health_checks += 1
        problem = self.client.check()
        if problem is not None:
            self.add(Finding("well-behaved-client", problem, None, self.target.log_lines()[-40:]))

    def check_log(self, lines: list[str]) -> None:
        """An ERROR line (with its traceback) is a finding, named by its last exception
        and tied to its plan by the peer's port where the line names it."""
        found = False
        for i, line in enumerate(lines):
            if not re.search(r" (ERROR|CRITICAL) ", line):
                continue
            found = True
            excerpt = [line]
            for more in lines[i + 1 :]:
                if LOG_LINE.match(more):
                    break
                excerpt.append(more)
            raised = [x for x in excerpt[1:] if re.match(r"^[\w.]+(Error|Exception)\b", x)]
            match = PEER.search(line)
            plan = self.recent.get(int(match.group(1) or match.group(2))) if match else None
            what = line.split(": ", 1)[-1][:120]
            self.add(Finding("error-log", f"{what} {raised[-1] if raised else ''}", plan, excerpt))
        if not found and any(line.startswith("Traceback") for line in lines):
            self.add(Finding("error-log", "a traceback without an ERROR line", None, lines[-40:]))

    def isolate_death(self, candidates: list[Plan]) -> None:
        """Restart the broker and send the plans that were in flight one at a time, to
        name the one that kills an agent."""
        if not self.target.restart():
            self.stopped = "an agent died and the broker cannot be restarted from here"
            return
        self.target.log_lines()
        deadline = time.monotonic() + 120
        host, port = split_address(self.target.bootstrap)
        for plan in candidates:
            if time.monotonic() > deadline:
                break
            before = set(self.target.agent_pids())
            asyncio.run(run_plan(host, port, plan, self.settings.plan_timeout))
            if not wait_for_exit(self.target, before, 0.3):
                continue
            lines = unindented(self.target.log_lines())
            self.add(Finding("agent-death", "this plan kills an agent", plan, lines))
            self.target.restart()
            break
        self.client.close()
        self.client = WellBehavedClient(self.target.bootstrap)
        self.pids_seen = set(self.target.agent_pids())

    def report(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "engine": self.settings.engine,
            "seed": self.settings.seed,
            "target": self.target.bootstrap,
            "cases": self.cases,
            "connections": self.plans,
            "regression_plans": self.seeded,
            "seconds": round(elapsed, 1),
            "cases_per_second": round(self.cases / elapsed, 1) if elapsed else 0,
            "agent_deaths": self.deaths,
            "max_rss_mb": round(self.max_rss_kib / 1024, 1),
            "rss_limit_mb": self.settings.max_rss_mb,
            "rss_mb_by_cases": self.rss_series,
            "health_checks": self.health_checks,
            "connection_seconds": percentiles(self.latencies),
            "seconds_draining_batches": round(self.draining, 1),
            "seconds_checking": round(self.checking, 1),
            "connection_endings": dict(self.endings),
            "slow_connections": dict(self.slow.most_common(20)),
            "errors_found": sum(self.signatures.values()),
            "findings": [f.to_json() for f in self.findings],
            "stopped": self.stopped,
        }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    at = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
    return {
        k: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) for k, q in at.items()
    }


def wait_for_exit(target: Target, before: set[int], seconds: float) -> bool:
    """True if an agent of `before` has exited, or exits within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        now = set(target.agent_pids())
        if before - now or len(now) < target.agents():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def split_address(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host, int(port)


async def fuzz_random(run: Run) -> None:
    """Plans from random.Random(seed), `concurrency` connections at once, checked in
    batches of `batch` cases. A batch's last connections get DRAIN_SECONDS to end before
    the checks; those still waiting (a long poll) end during the next batch."""
    host, port = split_address(run.target.bootstrap)
    rng = random.Random(run.settings.seed)
    pending = list(run.settings.replay) or (seed_plans(0) if run.settings.seeds else [])
    run.seeded = 0 if run.settings.replay else len(pending)
    index = len(pending)
    in_flight: dict[asyncio.Task[tuple[Outcome, list[Finding]]], Plan] = {}
    while (not run.done() and not run.stopped) or in_flight:
        batch_end = run.cases + run.settings.batch
        drain_until = None
        while True:
            sending = run.cases < batch_end and not run.done() and not run.stopped
            while sending and len(in_flight) < run.settings.concurrency:
                if pending:
                    plan = pending.pop(0)
                else:
                    plan = make_plan(rng, run.catalog, index)
                    index += 1
                task = asyncio.ensure_future(
                    run_and_judge(host, port, plan, run.settings.plan_timeout, run.judge)
                )
                in_flight[task] = plan
                # Count cases as they are sent, so that the batch ends on time.
                run.cases += len(plan.frames)
                sending = run.cases < batch_end and not run.done()
            if not in_flight:
                break
            now = time.monotonic()
            if not sending:
                # The last run waits for every connection; a batch, for DRAIN_SECONDS.
                last = run.done() or run.stopped
                drain_until = drain_until or (
                    now + (run.settings.plan_timeout + 1) if last else now + DRAIN_SECONDS
                )
                if now >= drain_until:
                    break
            done, _ = await asyncio.wait(
                in_flight,
                timeout=None if drain_until is None else drain_until - now,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if drain_until is not None:
                run.draining += time.monotonic() - now
            for task in done:
                plan = in_flight.pop(task)
                run.cases -= len(plan.frames)
                run.record(*task.result())
        # Should an agent have died, the plans it may have died of: those still in
        # flight (their judging may take long), then the last ones, newest first.
        recent = list(run.recent.values())[-4 * run.settings.concurrency :]
        candidates = list(in_flight.values()) + recent[::-1]
        checked = time.monotonic()
        await asyncio.to_thread(run.check, candidates)
        run.checking += time.monotonic() - checked
        run.recent.clear()


def fuzz_hypothesis(run: Run) -> None:
    """Plans drawn by hypothesis, one connection at a time; the per-plan checks are the
    property, so a failing plan is shrunk. Batches are hypothesis runs of `batch` cases'
    worth of examples, each with its own seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    host, port = split_address(run.target.bootstrap)
    if run.settings.seeds:
        for plan in seed_plans(0):
            limit = run.settings.plan_timeout
            run.record(*asyncio.run(run_and_judge(host, port, plan, limit, run.judge)))
            run.seeded += 1
        run.check([])
    index = [10_000]
    failing: list[tuple[Plan, list[Finding]]] = []

    def attempt(rng: random.Random) -> None:
        plan = make_plan(rng, run.catalog, index[0])
        index[0] += 1
        limit = run.settings.plan_timeout
        outcome, found = asyncio.run(run_and_judge(host, port, plan, limit, run.judge))
        run.record(outcome, [])  # what it finds is added once shrunk
        lines = run.target.log_lines()
        mine = [ln for ln in lines if " ERROR " in ln and f":{outcome.local_port}" in ln]
        if mine:
            found.append(Finding("error-log", mine[0].split(": ", 1)[-1][:160], plan, lines))
        if found:
            failing.append((plan, found))
            raise AssertionError(found[0].detail)

    round_number = 0
    while not run.done() and not run.stopped:
        examples = max(1, run.settings.batch // 3)
        property_ = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=(Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
        )(given(st.randoms(use_true_random=False))(attempt))
        hypothesis_seed(run.settings.seed * 1000 + round_number)(property_)
        round_number += 1
        failing.clear()
        try:
            property_()
        except Exception as exc:
            if not failing:  # hypothesis itself gave up (flaky, health check)
                run.add(Finding("hypothesis", f"{type(exc).__name__}: {exc}"[:300]))
            else:
                _plan, found = failing[-1]  # the last failure is the shrunk one
                for finding in found:
                    finding.detail += " (shrunk by hypothesis)"
                    run.add(finding)
        run.check(list(run.recent.values())[-20:][::-1])
        run.recent.clear()


def fuzz(target: Target, settings: Settings) -> dict[str, Any]:
    advertised = discover(target.bootstrap)
    topic_ids = prepare_topics(target.bootstrap)
    catalog = Catalog(advertised, advertised_requests(advertised), topic_ids, settings.max_frame)
    client = WellBehavedClient(target.bootstrap)
    problem = client.check()
    if problem is not None:
        raise RuntimeError(f"the broker does not work before fuzzing: {problem}")
    target.log_lines()
    judge = Judge(catalog)
    run = Run(
        settings, target, catalog, client, judge, handler_errors_seen=target.handler_errors() or 0
    )
    run.pids_seen = set(target.agent_pids())
    try:
        if settings.engine == "hypothesis":
            fuzz_hypothesis(run)
        else:
            asyncio.run(fuzz_random(run))
        # The stats file is written each second: count the handler errors of the end too.
        time.sleep(1.5)
        run.check([])
    finally:
        run.client.close()
        judge.close()
    return run.report()


def plans_of_report(path: Path) -> tuple[Plan, ...]:
    """The plans of a report's findings, to send again."""
    report = json.loads(path.read_text())
    plans = []
    for finding in report["findings"]:
        plan = finding.get("plan")
        if plan is not None:
            frames = tuple(Frame(bytes.fromhex(f["hex"]), f["what"]) for f in plan["frames"])
            plans.append(Plan(plan["index"], frames, plan["ending"]))
    return tuple(plans)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker (default: start one)")
    parser.add_argument("--cases", type=int, help="stop after this many cases (frames)")
    parser.add_argument("--seconds", type=float, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--engine", choices=("random", "hypothesis"), default="random")
    parser.add_argument("--batch", type=int, default=2000, help="cases between checks")
    parser.add_argument("--concurrency", type=int, default=64, help="connections at once")
    parser.add_argument("--plan-timeout", type=float, default=3.0, help="seconds per connection")
    parser.add_argument("--max-rss-mb", type=float, default=1024.0, help="bound on agents' RSS")
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=DEFAULT_MAX_FRAME_SIZE,
        help="the broker's --max-frame-bytes (given to the broker started)",
    )
    parser.add_argument("--agents", type=int, default=1, help="agents of the broker started")
    parser.add_argument("--broker-arg", action="append", default=[], help="for the broker started")
    parser.add_argument("--data-dir", type=Path, help="data dir of the broker started")
    parser.add_argument("--pid", type=int, action="append", default=[], help="an agent's pid")
    parser.add_argument("--broker-log", type=Path, help="the log of the broker at --bootstrap")
    parser.add_argument("--no-seeds", action="store_true", help="skip the regression frames")
    parser.add_argument(
        "--replay", type=Path, help="send the plans of a report's findings again, and only them"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    replay = plans_of_report(args.replay) if args.replay else ()
    if replay:
        args.cases, args.seconds, args.concurrency = sum(len(p.frames) for p in replay), None, 1
    if args.cases is None and args.seconds is None:
        args.seconds = 60.0
    settings = Settings(
        cases=args.cases,
        seconds=args.seconds,
        seed=args.seed,
        batch=args.batch,
        concurrency=args.concurrency,
        plan_timeout=args.plan_timeout,
        max_rss_mb=args.max_rss_mb,
        max_frame=args.max_frame_bytes,
        engine=args.engine,
        seeds=not args.no_seeds,
        replay=replay,
        verbose=args.verbose,
    )
    target: Target
    if args.bootstrap:
        target = External(args.bootstrap, args.pid, args.broker_log)
    else:
        data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bucketlog-fuzz-")) / "data"
        broker = BrokerProcess(
            data_dir=data_dir,
            port=free_ports(args.agents)[0],
            agents=args.agents,
            extra_args=["--max-frame-bytes", str(args.max_frame_bytes), *args.broker_arg],
        )
        target = OwnBroker(broker.start())
    try:
        report = fuzz(target, settings)
    finally:
        if isinstance(target, OwnBroker):
            target.broker.stop()
    if isinstance(target, OwnBroker):
        report["broker_log"] = str(target.broker.log_path)
        if args.data_dir is None and not report["errors_found"]:
            shutil.rmtree(target.broker.data_dir.parent, ignore_errors=True)  # nothing to look at
            report["broker_log"] = None
    text = json.dumps(report, indent=2)
    if args.report:
        args.report.write_text(text + "\n")
    summary = {k: report[k] for k in ("cases", "cases_per_second", "agent_deaths", "max_rss_mb")}
    print(json.dumps({**summary, "errors_found": report["errors_found"]}))
    for finding in report["findings"]:
        print(f"  {finding['kind']}: {finding['detail']}", file=sys.stderr)
    return 0 if report["errors_found"] == 0 and not report["stopped"] else 1


if __name__ == "__main__":
    sys.exit(main())
