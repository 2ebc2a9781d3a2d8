"""SaslHandshake (v0-1) and SaslAuthenticate (v0-2): a SASL listener's authentication.

The connection's state is `ctx.session` (broker.authentication.ConnectionAuth); the
connection takes only these requests (and ApiVersions) before it is authenticated.
After a SaslHandshake v1 the tokens come in SaslAuthenticate requests; after a v0 one
they come raw, each a size-prefixed frame without a request header, and are answered
the same way (`raw_token`, called by the connection), as Kafka does: there a failure
closes the connection without an answer, the protocol having no room for an error.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from broker import eventlog
from broker.authentication import ConnectionAuth, SaslState
from broker.context import AgentServices, HandlerContext
from broker.entities import build
from broker.handlers import api, response_class
from broker.sasl import SCRAM_TYPE_OF, AuthenticationFailed, PlainServer
from metadata import scram

HANDSHAKE_KEY = 17
AUTHENTICATE_KEY = 36
UNSUPPORTED = "unsupported"  # the counters' name for a mechanism not enabled


@api(HANDSHAKE_KEY, 0, 1)
async def handle_handshake(request: Any, ctx: HandlerContext) -> Any:
    auth = ctx.agent.auth
    session = ctx.session
    mechanisms = list(auth.mechanisms)
    cls = response_class(request)
    if session is None or not session.listener.protocol.sasl or session.authenticated:
        return build(cls, {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": mechanisms})
    if request.mechanism not in auth.mechanisms:
        session.close_after = (
            f"SASL mechanism {request.mechanism[:64]!r} is not enabled"
            f" (enabled: {', '.join(mechanisms)})"
        )
        auth.stats.failures[UNSUPPORTED] += 1
        return build(
            cls, {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": mechanisms}
        )
    session.exchange = auth.new_exchange(request.mechanism)
    session.state = SaslState.AUTHENTICATE
    session.raw_tokens = ctx.api_version == 0
    return build(cls, {"error_code": ErrorCode.none, "mechanisms": mechanisms})


async def _step(agent: AgentServices, session: ConnectionAuth, peer: str, token: bytes) -> bytes:
    """Feed the client's token to the exchange; the server's token. On failure the
    connection's last answer is set and AuthenticationFailed raised; on success the
    session holds the principal."""
    exchange = session.exchange
    assert exchange is not None  # the connection takes tokens only after a handshake
    stats = agent.auth.stats
    try:
        if isinstance(exchange, PlainServer):
            answer = exchange.step(token)
        elif exchange.username is None:
            user = exchange.receive_first(token)
            mechanism = SCRAM_TYPE_OF[exchange.mechanism]
            credential = await agent.kv.read(
                lambda tr: scram.get_credential(tr, agent.sub, user, mechanism)
            )
            answer = exchange.server_first(credential)
        else:
            answer = exchange.receive_final(token)
    except AuthenticationFailed as exc:
        stats.failures[exchange.mechanism] += 1
        named = getattr(exchange, "username", None)
        session.close_after = (
            f"{exchange.mechanism} authentication"
            f"{f' of user {named!r}' if named else ''} failed: {exc}"
        )
        raise
    if exchange.principal is not None:
        session.principal = exchange.principal
        session.state = SaslState.DONE
        session.exchange = None
        stats.successes[exchange.mechanism] += 1
        agent.events.record(
            eventlog.AUTHENTICATED,
            "%s authenticated as %s with %s on %s",
            peer,
            exchange.principal,
            exchange.mechanism,
            session.listener.name,
        )
    return answer


async def raw_token(
    agent: AgentServices, session: ConnectionAuth, peer: str, token: bytes
) -> list[bytes]:
    """A raw token after SaslHandshake v0: the server's token as a size-prefixed frame
    (PLAIN's success is an empty one). AuthenticationFailed closes the connection."""
    answer = await _step(agent, session, peer, token)
    return [struct.pack(">i", len(answer)), answer]


def _authenticate_answer(
    request: Any, code: ErrorCode, message: str | None, auth_bytes: bytes = b""
) -> Any:
    return build(
        response_class(request),
        {
            "error_code": code,
            "error_message": message,
            "auth_bytes": auth_bytes,
            # Sessions do not expire: clients never re-authenticate (KIP-368).
            "session_lifetime": datetime.timedelta(0),
        },
    )


@api(AUTHENTICATE_KEY, 0, 2)
async def handle_authenticate(request: Any, ctx: HandlerContext) -> Any:
    session = ctx.session
    if session is None or not session.listener.protocol.sasl or session.authenticated:
        return _authenticate_answer(
            request,
            ErrorCode.illegal_sasl_state,
            "SaslAuthenticate request received after successful authentication",
        )
    try:
        answer = await _step(ctx.agent, session, ctx.peer, request.auth_bytes)
    except AuthenticationFailed as exc:
        return _authenticate_answer(request, ErrorCode.sasl_authentication_failed, str(exc))
    return _authenticate_answer(request, ErrorCode.none, None, answer)
