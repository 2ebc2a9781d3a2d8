"""One client connection: frames in, requests handled in order, answers out in order.

Per connection, one task reads frames continuously and starts a handler task for each
request; another task writes the answers strictly in request order, those that are ready
together in one write (a flush answers all the Produce requests it holds at once). The
handler tasks are the event loop's own tasks, not a task group's (an anyio task costs a
cancel scope and several loop lookups, per request): the connection cancels those still
running when it ends. A connection's requests take effect in the order they were sent,
as in Kafka: each request starts once the one before it has ended its turn
(`broker.sync.Turn`), which a request does when its answer is ready or when it parks
after taking effect (a Produce once its batches are queued for a flush, a Fetch once it
waits for data). So a Produce waiting for its flush never holds back the next request,
while an EndTxn never overtakes the AddPartitionsToTxn sent before it. A JoinGroup or
SyncGroup holds its turn until it is answered, as a Kafka connection does. At most
`MAX_IN_FLIGHT` requests per connection are pending; past that, reading pauses.

Every frame holds its size of the agent's request memory (`broker.memory.RequestMemory`)
from the moment its size prefix arrives until its request is answered; while the memory
is used up, the connection does not read. A frame that stops arriving while other
connections wait for memory would hold theirs forever (a client that sends only a large
size prefix): after `FRAME_STALL_SECONDS` without a byte of it in that state, its
connection is closed as a malformed request.

A connection belongs to one listener (`broker.listeners`): on SSL and SASL_SSL the TLS
handshake comes first (`broker.tls`); on SASL listeners only the authentication requests
are taken until the client has authenticated (`broker.authentication`), and a failed
authentication's answer is the connection's last. Each request carries the listener's
name and the client's principal.

A malformed frame or request closes the connection once the requests before it are
answered, an unsupported version too (but for ApiVersions, which is answered), and a
client may go away at any time: each is an expected event, logged as one rate-limited
line and counted (`broker.eventlog`). Anything unexpected in a handler is a bug: logged
with its traceback and answered with an UNKNOWN_SERVER_ERROR-shaped response where the
API allows, otherwise the connection is closed; the agent keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from broker import eventlog, tls
from broker.agent import Agent
from broker.authentication import CERTIFICATE, ConnectionAuth
from broker.handlers import REGISTRY, api_versions, sasl
from broker.handlers.errors import error_response
from broker.listeners import Listener, SecurityProtocol
from broker.sasl import AuthenticationFailed
from broker.sync import Channel, Promise, Turn
from broker.zones import ClientZone
from metadata.kv import KVError
from protocol.codec import (
    MalformedRequest,
    UnsupportedVersion,
    decode_request,
    encode_response_parts,
    request_schema,
)
from protocol.framing import ProtocolError, ServerConnection

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
# Kafka's principal of a client that did not authenticate.
ANONYMOUS = "User:ANONYMOUS"
READ_SIZE = 256 * 1024
# The listener of a connection that names none (tests): --host/--port's.
PLAINTEXT = Listener(SecurityProtocol.PLAINTEXT, "", 0)
FRAME_STALL_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class RequestContext:
    agent: Agent
    api_version: int
    correlation_id: int
    client_id: str | None
    peer: str
    turn: Turn = field(default_factory=Turn)
    # Who sent it, in Kafka's form ("User:alice"): what authorization checks.
    principal: str = ANONYMOUS
    # The listener it came in on (its security protocol), and its connection's
    # authentication, which SaslHandshake and SaslAuthenticate move on.
    listener: str = PLAINTEXT.name
    session: ConnectionAuth | None = None
    # The zone its client.id names (broker.zones), or None.
    client_zone: str | None = None

    def end_turn(self) -> None:
        """This request has taken effect: the connection's next request may start."""
        self.turn.end()


# How a client that went away shows: reset, broken pipe, or a stream anyio closed for it.
GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError)


def _why_gone(exc: BaseException) -> str:
    """The OS's words for a connection that went away (anyio wraps them)."""
    cause = exc.__cause__ or exc.__context__
    return str(cause or exc) or type(cause or exc).__name__


class _Close(Exception):
    """Answer nothing more on this connection and close it; `kind` is the event logged."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _request_name(api_key: int | None, api_version: int | None) -> str:
    """ "MetadataRequest v12", as far as the header told."""
    if api_key is None:
        return "a request"
    schema = request_schema(api_key, api_version or 0)
    name = schema.__name__ if schema is not None else f"API key {api_key}"
    return name if api_version is None else f"{name} v{api_version}"


Frame = list[bytes | bytearray | memoryview]  # an answer's parts, written in order
# At most this many parts per writev (Linux takes up to 1024).
WRITEV_PARTS = 512


async def send_frame(stream: anyio.abc.ByteStream, frame: Frame) -> None:
    """Write an answer's parts in order.

    When nothing is queued in the stream's transport, the parts go to the socket in one
    writev: one system call, and the kernel packs the small parts (batch heads) together
    with the large ones instead of sending each as a packet of its own. Whatever the socket
    does not take then goes through the stream as usual, which queues it in order.
    """
    transport: Any = getattr(stream, "_transport", None)
    # asyncio's transports are WriteTransports; uvloop's have the same methods but are not
    # subclasses of it. (The socket from the transport itself: the stream's `extra` builds
    # a table of every attribute it has on each call.)
    if hasattr(transport, "get_write_buffer_size"):
        if transport.get_write_buffer_size() == 0 and not transport.is_closing():
            fd = transport.get_extra_info("socket").fileno()
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
        # anyio's types say bytes; its stream writes any buffer, and a copy would cost.
        await stream.send(cast(bytes, part))


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


def _unsupported(api_key: int, api_version: int, correlation_id: int) -> Frame:
    """ApiVersions gets its v0 UNSUPPORTED_VERSION answer; any other API closes the
    connection, as Kafka does."""
    if api_key == api_versions.API_KEY:
        return encode_response_parts(correlation_id, api_versions.unsupported_version_answer())
    raise _Close(
        eventlog.UNSUPPORTED_VERSION, f"{_request_name(api_key, api_version)} is not supported"
    )


async def _handle_frame(
    agent: Agent,
    frame: bytes,
    peer: str,
    turn: Turn,
    principal: str = ANONYMOUS,
    session: ConnectionAuth | None = None,
    client: ClientZone | None = None,
) -> Frame | None:
    try:
        request = decode_request(frame)
    except UnsupportedVersion as exc:
        return _unsupported(exc.api_key, exc.api_version, exc.correlation_id)
    except MalformedRequest as exc:
        what = _request_name(exc.api_key, exc.api_version)
        reason = str(exc) if what in str(exc) else f"{what}: {exc}"
        raise _Close(eventlog.MALFORMED_REQUEST, reason) from None
    header, body = request.header, request.body
    api = REGISTRY.get(header.api_key)
    if api is None or not api.supports(header.api_version):
        return _unsupported(header.api_key, header.api_version, header.correlation_id)
    api_name = type(body).__name__.removesuffix("Request")
    client_zone = None if client is None else client.of(header.client_id)
    agent.meter.zone_request(client_zone, api_name)
    ctx = RequestContext(
        agent,
        header.api_version,
        header.correlation_id,
        header.client_id,
        peer,
        turn,
        principal,
        PLAINTEXT.name if session is None else session.listener.name,
        session,
        client_zone,
    )
    began = time.monotonic()
    try:
        response = await api.handler(body, ctx)
    except KVError as exc:  # the metadata store is unreachable: an expected event
        response = error_response(body, _unavailable_code(header.api_key))
        if response is None:  # no error field: the client reconnects and asks again
            raise _Close(
                eventlog.METADATA_UNAVAILABLE, f"{api.name}: metadata store unreachable: {exc}"
            ) from None
        agent.events.record(
            eventlog.METADATA_UNAVAILABLE,
            "%s v%d from %s (client id %r): metadata store unreachable, answered %s: %s",
            api.name,
            header.api_version,
            peer,
            header.client_id,
            response.error_code.name,
            exc,
        )
    except Exception:  # a bug: its traceback is wanted
        agent.events.record(
            eventlog.HANDLER_ERROR,
            "%s v%d from %s (client id %r) failed",
            api.name,
            header.api_version,
            peer,
            header.client_id,
            exc_info=True,
        )
        response = error_response(body)
        if response is None:
            raise _Close(
                eventlog.HANDLER_ERROR, f"{api.name} has no error answer to give"
            ) from None
    agent.meter.request_seconds[api_name].observe(time.monotonic() - began)
    if response is None:
        return None
    return encode_response_parts(header.correlation_id, response)


# The APIs answered by a group or transaction coordinator: their clients look for the
# coordinator again on COORDINATOR_NOT_AVAILABLE.
_COORDINATOR_APIS = frozenset(
    {
        8,  # OffsetCommit
        9,  # OffsetFetch
        10,  # FindCoordinator
        11,  # JoinGroup
        12,  # Heartbeat
        13,  # LeaveGroup
        14,  # SyncGroup
        15,  # DescribeGroups
        16,  # ListGroups
        22,  # InitProducerId
        24,  # AddPartitionsToTxn
        25,  # AddOffsetsToTxn
        26,  # EndTxn
        28,  # TxnOffsetCommit
        42,  # DeleteGroups
        68,  # ConsumerGroupHeartbeat
        69,  # ConsumerGroupDescribe
    }
)


def _unavailable_code(api_key: int) -> ErrorCode:
    """The retriable error a request gets while the metadata store is unreachable."""
    if api_key in _COORDINATOR_APIS:
        return ErrorCode.coordinator_not_available
    return ErrorCode.request_timed_out


async def handle_connection(
    agent: Agent, stream: anyio.abc.ByteStream, listener: Listener = PLAINTEXT
) -> None:
    """Serve one client of `listener`: the TLS handshake first on SSL and SASL_SSL."""
    agent.meter.connected(listener.name)
    try:
        await _handle_connection(agent, stream, listener)
    finally:
        agent.meter.disconnected(listener.name)


async def _handle_connection(
    agent: Agent, stream: anyio.abc.ByteStream, listener: Listener
) -> None:
    principal = ANONYMOUS
    if listener.protocol.tls:
        context = agent.auth.tls_contexts[listener.protocol]  # loaded at start
        try:
            stream = await tls.handshake(cast(anyio.abc.SocketStream, stream), context)
        except tls.HandshakeFailed as exc:
            kind = eventlog.TLS_CLOSED_EARLY if exc.quiet else eventlog.TLS_HANDSHAKE_FAILURE
            if not exc.quiet:
                agent.auth.stats.failures[CERTIFICATE] += 1
            agent.events.record(
                kind, "closing connection from %s on %s: %s", _peer(stream), listener, exc
            )
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            return
        certified = tls.peer_principal(stream)
        if certified is not None and not listener.protocol.sasl:
            principal = certified
            agent.auth.stats.successes[CERTIFICATE] += 1
            agent.events.record(
                eventlog.AUTHENTICATED,
                "%s authenticated as %s with its client certificate on %s",
                _peer(stream),
                principal,
                listener.name,
            )
    await _Connection(agent, stream, listener, principal).serve()


def _peer(stream: anyio.abc.ByteStream) -> str:
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except anyio.TypedAttributeLookupError:
        address = "?"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


class _Connection:
    """One client connection: a reader task, a handler task per request, a writer task."""

    def __init__(
        self,
        agent: Agent,
        stream: anyio.abc.ByteStream,
        listener: Listener = PLAINTEXT,
        principal: str = ANONYMOUS,
    ) -> None:
        self.agent = agent
        self.stream = stream
        self.events = agent.events
        self.peer = _peer(stream)
        self.framing = ServerConnection(max_frame_size=agent.config.frame_limit)
        self.memory = agent.request_memory
        self.held = 0  # request memory held for the frame now arriving
        self.gone = False  # the client went away: said once, then quiet
        self.answering: _Answer | None = None  # the answer the writer waits for or writes
        # Until the client authenticates: ANONYMOUS, or its certificate's on SSL.
        self.principal = principal
        self.auth = ConnectionAuth(listener, principal)
        self.client = ClientZone()
        self.handlers: set[asyncio.Task[None]] = set()  # of requests not yet handled
        # A frame's stall (see _receive): one loop timer per frame arriving, not a
        # cancel scope per read (a 1 MiB frame comes in four reads or more).
        self._reads = 0  # reads completed
        self._reading = False  # the reader waits in a read now
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_scope = anyio.CancelScope()

    def went_away(self, exc: BaseException) -> None:
        if not self.gone:
            self.gone = True
            answering = self.answering
            self.events.record(
                eventlog.CLIENT_DISCONNECT,
                "connection from %s went away%s: %s",
                self.peer,
                "" if answering is None else f" before its {answering.what()} was answered",
                _why_gone(exc),
            )

    async def serve(self) -> None:
        answers: Channel[_Answer] = Channel(MAX_IN_FLIGHT)
        try:
            async with self.stream, anyio.create_task_group() as tg:
                tg.start_soon(self.writer, answers, tg.cancel_scope)
                try:
                    await self.reader(answers)
                finally:
                    answers.close()
                # The client closed its side: answer what is in flight, then close.
        except GONE as exc:  # closing a stream the client reset
            self.went_away(exc)
        except Exception:
            logger.exception("connection from %s failed", self.peer)
        finally:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
            for task in self.handlers:  # none once every answer went out
                task.cancel()
            self.memory.release(self.held)

    async def reader(self, answers: Channel[_Answer]) -> None:
        with self._stall_scope:  # cancelled by _check_stall only
            await self._read(answers)
        if self._stall_scope.cancelled_caught:
            refused: Promise[Frame | _Last | None] = Promise()
            reason = (
                f"{self.held} bytes of a frame held for {FRAME_STALL_SECONDS:g} s "
                "without a byte more while others wait for request memory"
            )
            refused.fail(_Close(eventlog.MALFORMED_REQUEST, reason))
            await answers.put(_Answer(b"", refused))

    async def _read(self, answers: Channel[_Answer]) -> None:
        loop = asyncio.get_running_loop()
        previous = Turn.ended_already()
        while True:
            try:
                chunk = await self._receive()
            except anyio.EndOfStream:
                return
            except GONE as exc:
                self.went_away(exc)
                return
            self.framing.receive_data(chunk)
            while True:
                try:
                    frame = self.framing.next_frame()
                except ProtocolError as exc:
                    # The requests before it are answered first, then the connection
                    # closes (the writer logs why): Kafka reads a frame's size only once
                    # the request before it is answered.
                    refused: Promise[Frame | _Last | None] = Promise()
                    refused.fail(_Close(eventlog.MALFORMED_REQUEST, str(exc)))
                    await answers.put(_Answer(b"", refused))
                    return
                size = self.framing.pending_frame_size if frame is None else len(frame)
                refusal = self.auth.frame_refusal(size)
                if refusal is not None:
                    refused = Promise()
                    refused.fail(_Close(eventlog.AUTHENTICATION_FAILURE, refusal))
                    await answers.put(_Answer(b"", refused))
                    return
                if frame is None:
                    # Hold the memory of the frame still arriving before reading on.
                    if size > self.held:
                        await self.memory.reserve(size - self.held)
                        self.held = size
                    break
                # A frame that came whole within one read is held now (at most one read
                # more than the memory allows is ever buffered).
                if size > self.held:
                    await self.memory.reserve(size - self.held)
                    self.held = size
                answer = _Answer(frame[:4], Promise())
                await answers.put(answer)
                turn = Turn()
                task = loop.create_task(self.run_one(frame, answer.frame, previous, turn))
                self.handlers.add(task)
                task.add_done_callback(self.handlers.discard)
                self.held = 0  # run_one releases it
                previous = turn

    async def _receive(self) -> bytes:
        """The next bytes from the client. While a frame holding request memory arrives,
        a timer checks every FRAME_STALL_SECONDS that it got bytes: one that got none
        while other connections wait for memory is cut off (the reader's stall scope)."""
        if self.held and self._stall_timer is None:
            self._watch_stall()
        self._reading = True
        try:
            chunk = await self.stream.receive(READ_SIZE)
        finally:
            self._reading = False
        self._reads += 1
        return chunk

    def _watch_stall(self) -> None:
        self._stall_timer = asyncio.get_running_loop().call_later(
            FRAME_STALL_SECONDS, self._check_stall, self._reads
        )

    def _check_stall(self, reads_before: int) -> None:
        """On the loop, FRAME_STALL_SECONDS after the timer was set."""
        self._stall_timer = None
        if not self.held:
            return  # the frame came whole: the next one sets its own timer
        if self._reading and self._reads == reads_before and self.memory.contended:
            self._stall_scope.cancel()  # the reader waits in its read: it stops there
        else:
            self._watch_stall()

    async def run_one(
        self, frame: bytes, slot: Promise[Frame | _Last | None], after: Turn, turn: Turn
    ) -> None:
        """Handle one request in its turn; its frame's memory is released once answered."""
        try:
            await after.wait_ended()
            auth = self.auth
            answer: Frame | None
            if auth.raw_tokens and not auth.authenticated:  # after a SaslHandshake v0
                try:
                    answer = list(await sasl.raw_token(self.agent, auth, self.peer, frame))
                except AuthenticationFailed:
                    assert auth.close_after is not None
                    raise _Close(eventlog.AUTHENTICATION_FAILURE, auth.close_after) from None
            else:
                if not auth.authenticated:
                    refusal = auth.refusal(_api_key(frame))
                    if refusal is not None:
                        raise _Close(eventlog.AUTHENTICATION_FAILURE, refusal)
                answer = await _handle_frame(
                    self.agent, frame, self.peer, turn, self.principal, auth, self.client
                )
            self.principal = auth.principal
            if auth.close_after is not None:  # the answer is the last one
                slot.set(_Last(answer, eventlog.AUTHENTICATION_FAILURE, auth.close_after))
            else:
                slot.set(answer)
        except _Close as exc:
            slot.fail(exc)
        except Exception as exc:  # a bug outside the handler (encoding the answer)
            self.events.record(
                eventlog.HANDLER_ERROR, "request from %s failed", self.peer, exc_info=True
            )
            slot.fail(_Close(eventlog.HANDLER_ERROR, str(exc)))
        finally:
            turn.end()
            self.memory.release(len(frame))

    async def writer(self, pending: Channel[_Answer], scope: anyio.CancelScope) -> None:
        """Write the answers in request order. Answers that are ready together (a flush
        answers every Produce of the connection it holds) go out in one write: one
        system call, and fewer packets for the client to take."""
        following: _Answer | None = None  # taken from pending, not yet written
        while True:
            if following is not None:
                answer, following = following, None
            else:
                taken = await pending.take()
                if taken is None:  # the reader ended, and every answer went out
                    return
                answer = taken
            self.answering = answer
            try:
                data = await answer.frame.wait()
            except _Close as exc:
                self.events.record(
                    exc.kind, "closing connection from %s: %s", self.peer, exc.reason
                )
                scope.cancel()
                return
            last = data if isinstance(data, _Last) else None
            frame = last.frame if last is not None else cast(Frame | None, data)
            if last is None:
                frame, following = _with_ready(frame, pending)
            if frame is not None:
                try:
                    await send_frame(self.stream, frame)
                except GONE as exc:
                    self.went_away(exc)
                    scope.cancel()
                    return
            if last is not None:
                self.events.record(
                    last.kind, "closing connection from %s: %s", self.peer, last.reason
                )
                scope.cancel()
                return
            self.answering = None


def _with_ready(
    frame: Frame | None, pending: Channel[_Answer]
) -> tuple[Frame | None, _Answer | None]:
    """`frame` followed by the parts of the answers queued after it that are ready
    already, up to the first that is not ready, fails (closes the connection) or is the
    connection's last; that one is returned to be written on its own."""
    parts = frame
    while True:
        answer = pending.take_nowait()
        if answer is None:
            return parts, None
        promise = answer.frame
        if not promise.done() or promise.failed():
            return parts, answer
        data = promise.value()
        if isinstance(data, _Last):
            return parts, answer
        if data is not None:
            parts = data if parts is None else parts + data


@dataclass(frozen=True, slots=True)
class _Last:
    """An answer after which the connection closes (a failed authentication)."""

    frame: Frame | None
    kind: str
    reason: str


def _api_key(frame: bytes) -> int:
    return struct.unpack_from(">h", frame)[0] if len(frame) >= 2 else -1


@dataclass(frozen=True, slots=True)
class _Answer:
    """An answer to come, in request order; `head` is its request's first four bytes."""

    head: bytes
    frame: Promise[Frame | _Last | None]

    def what(self) -> str:
        if len(self.head) < 4:
            return "a request"
        api_key, api_version = struct.unpack(">hh", self.head)
        return _request_name(api_key, api_version)
