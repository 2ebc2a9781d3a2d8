"""Writing an answer's parts to a connection: one writev when nothing is queued, in order
always."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from broker import connection
from broker.connection import send_frame


@asynccontextmanager
async def connected() -> AsyncIterator[tuple[anyio.abc.SocketStream, socket.socket]]:
    """A server-side anyio stream and the blocking client socket talking to it."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        accepted: list[anyio.abc.SocketStream] = []
        async with anyio.create_task_group() as tg:

            async def accept_one() -> None:
                accepted.append(await listener.listeners[0].accept())  # type: ignore[attr-defined]

            tg.start_soon(accept_one)
            client = await anyio.to_thread.run_sync(
                lambda: socket.create_connection(("127.0.0.1", port))
            )
        try:
            async with accepted[0] as stream:
                yield stream, client
        finally:
            client.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(min(65536, size - len(out)))
        assert chunk, "connection closed early"
        out += chunk
    return bytes(out)


def _frame(seed: int, big: int) -> list[bytes | bytearray | memoryview]:
    """Small heads between large views, as a Fetch answer's records are laid out."""
    body = bytes((seed + i) % 251 for i in range(big))
    parts: list[bytes | bytearray | memoryview] = [b"\x00\x00\x00\x10head"]
    for n in range(4):
        parts.append(bytes([seed, n]) * 8)  # a 16-byte batch head
        parts.append(memoryview(body)[n * (big // 4) : (n + 1) * (big // 4)])
    parts.append(bytearray(b"tail"))
    return parts


def _counting_writev(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Record (parts, bytes given, bytes taken) of each writev the server makes."""
    calls: list[tuple[int, int, int]] = []
    real: Callable[..., int] = os.writev

    def writev(fd: int, buffers: list[bytes | memoryview]) -> int:
        taken = real(fd, buffers)
        calls.append((len(buffers), sum(map(len, buffers)), taken))
        return taken

    monkeypatch.setattr(connection.os, "writev", writev)
    return calls


async def test_a_frame_goes_out_in_one_writev(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_writev(monkeypatch)
    frame = _frame(1, 64 * 1024)
    expected = b"".join(frame)
    async with connected() as (stream, client):
        await send_frame(stream, frame)
        got = await anyio.to_thread.run_sync(_read_exactly, client, len(expected))
    assert got == expected
    assert calls == [(len(frame), len(expected), len(expected))]


async def test_an_answer_of_one_part_goes_out_in_one_writev_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not through the stream's send, which takes a turn of the event loop and a cancel
    # scope for every answer.
    calls = _counting_writev(monkeypatch)
    frame: list[bytes | bytearray | memoryview] = [b"\x00\x00\x00\x04" + b"body"]
    async with connected() as (stream, client):
        await send_frame(stream, frame)
        got = await anyio.to_thread.run_sync(_read_exactly, client, 8)
    assert got == b"\x00\x00\x00\x04body"
    assert calls == [(1, 8, 8)]


async def test_what_the_socket_does_not_take_is_queued_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_writev(monkeypatch)
    # Far more than the socket buffers take while the client does not read yet.
    frames = [_frame(seed, 8 << 20) for seed in (1, 2, 3)]
    expected = b"".join(b"".join(f) for f in frames)
    async with connected() as (stream, client):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        got: list[bytes] = []
        async with anyio.create_task_group() as tg:

            async def read_all() -> None:
                await anyio.sleep(0.2)  # let the first writev fill the socket
                got.append(await anyio.to_thread.run_sync(_read_exactly, client, len(expected)))

            tg.start_soon(read_all)
            for frame in frames:
                await send_frame(stream, frame)
    # The first writev took only part of the first frame; the rest of it was queued, and
    # the next frames did not jump ahead of it.
    parts, given, taken = calls[0]
    assert parts == len(frames[0]) and 0 < taken < given
    assert got[0] == expected


async def test_no_writev_while_bytes_are_queued() -> None:
    # Bytes queued in the stream and room in the socket at the same time: a writev now
    # would put the next frame ahead of the queued bytes.
    first = bytes(range(256)) * (32 << 12)  # 8 MiB, more than the socket takes
    second = _frame(7, 256 * 1024)
    expected = first + b"".join(second)
    async with connected() as (stream, client):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.settimeout(30)
        # The socket takes part (a few MiB); the transport queues the rest. (The stream's
        # own send would wait for the queue to drain, which needs the client to read.)
        stream._transport.write(first)  # type: ignore[attr-defined]
        assert stream._transport.get_write_buffer_size() > 0  # type: ignore[attr-defined]
        head = _read_exactly(client, 256 * 1024)  # room in the socket, loop not run yet
        got: list[bytes] = []
        async with anyio.create_task_group() as tg:

            async def read_rest() -> None:
                rest = len(expected) - len(head)
                got.append(await anyio.to_thread.run_sync(_read_exactly, client, rest))

            tg.start_soon(read_rest)
            await send_frame(stream, second)
    assert head + got[0] == expected


def test_a_frame_goes_out_in_one_writev_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's transports are not asyncio.WriteTransport subclasses; they take the writev
    path all the same."""
    pytest.importorskip("uvloop", reason="uvloop is not installed")
    calls = _counting_writev(monkeypatch)
    frame = _frame(3, 64 * 1024)
    expected = b"".join(frame)

    async def exchange() -> bytes:
        async with connected() as (stream, client):
            await send_frame(stream, frame)
            return await anyio.to_thread.run_sync(_read_exactly, client, len(expected))

    received = anyio.run(exchange, backend_options={"use_uvloop": True})
    assert received == expected
    assert len(calls) == 1 and calls[0] == (len(frame), len(expected), len(expected))
