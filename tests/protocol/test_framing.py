from __future__ import annotations

import datetime
import random
import struct
import time

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.produce.v9.request import ProduceRequest

from protocol.codec import decode_request, encode_response
from protocol.errors import (
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    ProtocolError,
)
from protocol.framing import ClientConnection, ServerConnection, frame


def drain(connection: ServerConnection) -> list[bytes]:
    frames = []
    while (payload := connection.next_frame()) is not None:
        frames.append(payload)
    return frames


# (name, payloads): each stream is the framed payloads, back to back.
STREAMS = [
    ("one empty frame", [b""]),
    ("one byte", [b"x"]),
    ("three frames", [b"abc", b"", b"defgh"]),
    ("frame containing a size-like prefix", [struct.pack(">i", 1000) + b"zz", b"q"]),
    ("binary", [bytes(range(256)), bytes(range(255, -1, -1))]),
]


@pytest.mark.parametrize(("name", "payloads"), STREAMS, ids=[s[0] for s in STREAMS])
def test_split_at_every_byte_boundary(name: str, payloads: list[bytes]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    for cut in range(len(stream) + 1):
        connection = ServerConnection()
        received = []
        for chunk in (stream[:cut], stream[cut:]):
            if chunk:  # b"" would mean end of stream
                connection.receive_data(chunk)
            received += drain(connection)
        assert received == payloads, cut
        assert connection.buffered == 0


@pytest.mark.parametrize(("name", "payloads"), STREAMS, ids=[s[0] for s in STREAMS])
def test_one_byte_at_a_time(name: str, payloads: list[bytes]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    connection = ServerConnection()
    received = []
    for index in range(len(stream)):
        connection.receive_data(stream[index : index + 1])
        received += drain(connection)
    assert received == payloads


def test_frames_across_reads_of_random_sizes() -> None:
    """Frames that start, end and span anywhere among many reads come out whole and in order,
    and every frame is a bytes object (also when it was one whole read)."""
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice((0, 1, 3, 4, 5, 100, 4096, 70_000))) for _ in range(400)]
    stream = b"".join(frame(p) for p in payloads)
    for max_read in (9, 4096, 65536, 300_000):
        connection = ServerConnection()
        received: list[bytes] = []
        position = returned = 0
        while position < len(stream):
            size = rng.randint(1, max_read)
            connection.receive_data(stream[position : position + size])
            position = min(position + size, len(stream))
            for payload in drain(connection):
                received.append(payload)
                returned += 4 + len(payload)
            assert connection.buffered == position - returned
        assert received == payloads, max_read
        assert all(type(p) is bytes for p in received)
        connection.receive_data(b"")
        assert connection.next_frame() is None


def test_frames_are_bytes_and_independent_of_the_buffer() -> None:
    connection = ServerConnection()
    data = bytearray(frame(b"hello"))
    connection.receive_data(data)
    data[4:] = b"XXXXX"
    payload = connection.next_frame()
    assert type(payload) is bytes
    assert payload == b"hello"
    connection.receive_data(memoryview(frame(b"world")))
    assert connection.next_frame() == b"world"


def test_frame_prefix() -> None:
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"


@pytest.mark.parametrize(
    ("prefix", "error"),
    [
        (struct.pack(">i", -1), MalformedFrame),
        (struct.pack(">i", -(2**31)), MalformedFrame),
        (struct.pack(">i", 101), FrameTooLarge),
        (struct.pack(">i", 2**31 - 1), FrameTooLarge),
    ],
)
def test_bad_sizes_fail_as_soon_as_the_prefix_arrives(
    prefix: bytes, error: type[ProtocolError]
) -> None:
    connection = ServerConnection(max_frame_size=100)
    connection.receive_data(prefix[:3])
    assert connection.next_frame() is None
    connection.receive_data(prefix[3:])
    with pytest.raises(error):
        connection.next_frame()
    # The connection stays dead.
    connection.receive_data(frame(b"ok"))
    with pytest.raises(error):
        connection.next_frame()
    assert issubclass(error, ProtocolError)


def test_max_frame_size_is_inclusive() -> None:
    connection = ServerConnection(max_frame_size=100)
    connection.receive_data(frame(b"x" * 100))
    assert connection.next_frame() == b"x" * 100
    connection.receive_data(frame(b"x" * 101))
    with pytest.raises(FrameTooLarge) as info:
        connection.next_frame()
    assert info.value.size == 101
    assert info.value.max_frame_size == 100


def test_default_max_frame_size_is_kafkas() -> None:
    assert ServerConnection().max_frame_size == 104857600


def test_end_of_stream() -> None:
    connection = ServerConnection()
    connection.receive_data(frame(b"a") + frame(b"b")[:3])
    connection.receive_data(b"")
    assert connection.at_eof
    assert connection.next_frame() == b"a"
    with pytest.raises(MalformedFrame):
        connection.next_frame()
    with pytest.raises(LocalProtocolError):
        connection.receive_data(b"more")


def test_clean_end_of_stream() -> None:
    connection = ServerConnection()
    connection.receive_data(frame(b"a"))
    connection.receive_data(b"")
    assert drain(connection) == [b"a"]
    assert connection.next_frame() is None


def test_many_small_frames_in_chunks() -> None:
    payloads = [bytes([i % 251]) * (i % 40) for i in range(100_000)]
    stream = b"".join(frame(p) for p in payloads)
    connection = ServerConnection()
    received = []
    start = time.perf_counter()
    for offset in range(0, len(stream), 65536):
        connection.receive_data(stream[offset : offset + 65536])
        received += drain(connection)
    elapsed = time.perf_counter() - start
    assert received == payloads
    assert elapsed < 2.0
    # What is kept is at most the chunk the last frame ended in, not the whole stream.
    assert connection.buffered < 65536
    assert sum(len(chunk) for chunk in connection._reader._chunks) <= 65536


def test_a_50_mib_frame_in_64_kib_chunks() -> None:
    payload = bytes(range(256)) * (50 * 4096)
    stream = frame(payload) + frame(b"next")
    connection = ServerConnection()
    frames = []
    start = time.perf_counter()
    for offset in range(0, len(stream), 65536):
        connection.receive_data(stream[offset : offset + 65536])
        frames += drain(connection)
    elapsed = time.perf_counter() - start
    assert len(frames) == 2
    assert frames[0] == payload
    assert frames[1] == b"next"
    assert elapsed < 2.0


def metadata_response() -> MetadataResponse:
    return MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=(),
        cluster_id="c",
        controller_id=1,
        topics=(),
    )


def test_client_and_server_talk() -> None:
    client = ClientConnection(client_id="tester")
    server = ServerConnection()
    first, data1 = client.send_request(
        ApiVersionsRequest(client_software_name="t", client_software_version="1")
    )
    second, data2 = client.send_request(
        MetadataRequest(topics=None, include_topic_authorized_operations=False)
    )
    assert (first, second) == (0, 1)
    assert client.pending == 2
    server.receive_data(data1 + data2)
    requests = [decode_request(f) for f in drain(server)]
    assert [r.header.client_id for r in requests] == ["tester", "tester"]
    assert [r.header.correlation_id for r in requests] == [0, 1]
    # Answer out of order: matching is by correlation id.
    client.receive_data(encode_response(1, metadata_response()))
    response = client.next_response()
    assert response is not None
    assert response.correlation_id == 1
    assert response.body == metadata_response()
    assert client.next_response() is None
    assert client.pending == 1


def test_client_rejects_unknown_correlation_ids() -> None:
    client = ClientConnection()
    client.receive_data(encode_response(42, metadata_response()))
    with pytest.raises(ProtocolError):
        client.next_response()


def test_client_expects_no_response_to_acks_0() -> None:
    client = ClientConnection()
    client.send_request(
        ProduceRequest(acks=0, timeout=datetime.timedelta(seconds=1), topic_data=())
    )
    assert client.pending == 0
    client.send_request(
        ProduceRequest(acks=-1, timeout=datetime.timedelta(seconds=1), topic_data=())
    )
    assert client.pending == 1


def test_client_refuses_a_correlation_id_in_flight() -> None:
    client = ClientConnection()
    request = MetadataRequest(topics=None, include_topic_authorized_operations=False)
    client.send_request(request, correlation_id=5)
    with pytest.raises(LocalProtocolError):
        client.send_request(request, correlation_id=5)


def test_server_error_response_round_trip() -> None:
    # An ApiVersions v0 error answer is a complete frame the client can read.
    from kio.schema.api_versions.v0.request import ApiVersionsRequest as V0Request
    from kio.schema.api_versions.v0.response import ApiVersionsResponse as V0Response

    client = ClientConnection()
    correlation_id, _ = client.send_request(V0Request())
    answer = V0Response(error_code=ErrorCode.unsupported_version, api_keys=())
    client.receive_data(encode_response(correlation_id, answer))
    response = client.next_response()
    assert response is not None
    assert response.body == answer


def test_the_size_of_a_frame_still_arriving_is_known_from_its_prefix() -> None:
    connection = ServerConnection(max_frame_size=1000)
    assert connection.pending_frame_size == -1
    connection.receive_data(b"\x00\x00")
    assert connection.next_frame() is None
    assert connection.pending_frame_size == -1  # half a prefix says nothing yet
    connection.receive_data(struct.pack(">h", 700) + b"x" * 100)
    assert connection.next_frame() is None
    assert connection.pending_frame_size == 700
    connection.receive_data(b"x" * 600 + frame(b"next"))
    assert connection.next_frame() == b"x" * 700
    assert connection.next_frame() == b"next"
    assert connection.pending_frame_size == -1
