"""One client connection: frames in, requests handled in order, answers out in order.

Per connection, one task reads frames continuously and starts a handler task for each
request; another task writes the answers strictly in request order. A connection's
requests take effect in the order they were sent, as in Kafka: each request starts once
the one before it has ended its turn (`broker.sync.Turn`), which a request does when its
answer is ready or when it parks after taking effect (a Produce once its batches are
queued for a flush, a Fetch once it waits for data). So a Produce waiting for its flush
never holds back the next request, while an EndTxn never overtakes the AddPartitionsToTxn
sent before it. At most `MAX_IN_FLIGHT` requests per connection are pending; past that,
reading pauses.

A malformed frame closes the connection with a logged reason. Anything unexpected in a
handler is logged and answered with UNKNOWN_SERVER_ERROR-shaped responses where the
API allows, otherwise the connection is closed; the agent keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from broker.agent import Agent
from broker.handlers import REGISTRY
from broker.handlers.errors import error_response
from broker.sync import Promise, Turn
from protocol.codec import UnsupportedVersion, decode_request, encode_response_parts
from protocol.framing import ProtocolError, ServerConnection

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
READ_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class RequestContext:
    agent: Agent
    api_version: int
    correlation_id: int
    client_id: str | None
    peer: str
    turn: Turn = field(default_factory=Turn)

    def end_turn(self) -> None:
        """This request has taken effect: the connection's next request may start."""
        self.turn.end()


class _Close(Exception):
    """Answer nothing more on this connection and close it."""


Frame = list[bytes | bytearray | memoryview]  # an answer's parts, written in order
# At most this many parts per writev (Linux takes up to 1024).
WRITEV_PARTS = 512


async def send_frame(stream: anyio.abc.SocketStream, frame: Frame) -> None:
    """Write an answer's parts in order.

    When nothing is queued in the stream's transport, the parts go to the socket in one
    writev: one system call, and the kernel packs the small parts (batch heads) together
    with the large ones instead of sending each as a packet of its own. Whatever the socket
    does not take then goes through the stream as usual, which queues it in order.
    """
    transport = getattr(stream, "_transport", None)
    if len(frame) > 1 and isinstance(transport, asyncio.WriteTransport):
        if transport.get_write_buffer_size() == 0 and not transport.is_closing():
            fd = stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
            while frame:
                batch = frame[:WRITEV_PARTS]
                try:
                    sent = os.writev(fd, batch)
                except (BlockingIOError, InterruptedError):
                    break
                frame = _after(frame, sent)
                if sent < sum(map(len, batch)):
                    break
    for part in frame:
        await stream.send(part)


def _after(frame: Frame, sent: int) -> Frame:
    """The parts of frame from byte `sent` on."""
    for index, part in enumerate(frame):
        size = len(part)
        if sent < size:
            rest = frame[index:]
            if sent:
                rest[0] = memoryview(part)[sent:]
            return rest
        sent -= size
    return []


async def _handle_frame(agent: Agent, frame: bytes, peer: str, turn: Turn) -> Frame | None:
    try:
        request = decode_request(frame)
    except UnsupportedVersion as exc:
        from broker.handlers import api_versions

        if exc.api_key == api_versions.API_KEY:
            return encode_response_parts(
                exc.correlation_id, api_versions.unsupported_version_answer()
            )
        raise _Close(
            f"unsupported API key {exc.api_key} version {exc.api_version} from {peer}"
        ) from None
    header, body = request.header, request.body
    api = REGISTRY.get(header.api_key)
    if api is None or not api.supports(header.api_version):
        if api is not None and header.api_key == 18:
            from broker.handlers import api_versions

            return encode_response_parts(
                header.correlation_id, api_versions.unsupported_version_answer()
            )
        raise _Close(
            f"unsupported API key {header.api_key} version {header.api_version} from {peer}"
        )
    ctx = RequestContext(
        agent, header.api_version, header.correlation_id, header.client_id, peer, turn
    )
    try:
        response = await api.handler(body, ctx)
    except Exception:
        log.exception("%s v%d from %s failed", api.name, header.api_version, peer)
        response = error_response(body)
        if response is None:
            raise _Close("no error answer for this request") from None
    if response is None:
        return None
    return encode_response_parts(header.correlation_id, response)


async def handle_connection(agent: Agent, stream: anyio.abc.SocketStream) -> None:
    try:
        host, port = stream.extra(anyio.abc.SocketAttribute.remote_address)[:2]
        peer = f"{host}:{port}"
    except Exception:
        peer = "?"
    conn = ServerConnection(max_frame_size=agent.config.max_frame_bytes)
    send: MemoryObjectSendStream[Promise[Frame | None]]
    receive: MemoryObjectReceiveStream[Promise[Frame | None]]
    send, receive = anyio.create_memory_object_stream(MAX_IN_FLIGHT)

    async def run_one(frame: bytes, slot: Promise[Frame | None], after: Turn, turn: Turn) -> None:
        try:
            await after.wait_ended()
            slot.set(await _handle_frame(agent, frame, peer, turn))
        except _Close as exc:
            slot.fail(exc)
        except Exception as exc:
            log.exception("request from %s failed", peer)
            slot.fail(_Close(str(exc)))
        finally:
            turn.end()

    async def writer() -> None:
        async with receive:
            async for slot in receive:
                try:
                    data = await slot.wait()
                except _Close as exc:
                    log.warning("closing connection from %s: %s", peer, exc)
                    tg.cancel_scope.cancel()
                    return
                if data is not None:
                    await send_frame(stream, data)

    previous = Turn.ended_already()
    try:
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(writer)
            async with send:
                while True:
                    try:
                        chunk = await stream.receive(READ_SIZE)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                        break
                    conn.receive_data(chunk)
                    while True:
                        try:
                            frame = conn.next_frame()
                        except ProtocolError as exc:
                            log.warning("closing connection from %s: %s", peer, exc)
                            tg.cancel_scope.cancel()
                            return
                        if frame is None:
                            break
                        slot: Promise[Frame | None] = Promise()
                        await send.send(slot)
                        turn = Turn()
                        tg.start_soon(run_one, frame, slot, previous, turn)
                        previous = turn
            # The peer closed its side: answer what is in flight, then close.
    except (anyio.BrokenResourceError, ConnectionError, anyio.ClosedResourceError):
        pass
    except Exception:
        log.exception("connection from %s failed", peer)
