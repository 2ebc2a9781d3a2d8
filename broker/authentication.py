"""Who a client is: the agent's authentication settings and counters, and the state of
one connection's authentication.

Rules (Kafka's SaslServerAuthenticator):
- On a PLAINTEXT or SSL listener the client is authenticated from its first byte:
  `User:ANONYMOUS`, or on SSL the subject of its client certificate.
- On a SASL listener, before authentication, only ApiVersions and one SaslHandshake are
  taken, then only SaslAuthenticate requests (raw tokens after a v0 handshake) until the
  exchange ends; any other request closes the connection. A failed exchange is answered (SASL_AUTHENTICATION_FAILED and
  Kafka's message), then the connection closes; so does a handshake for a mechanism
  that is not enabled (UNSUPPORTED_SASL_MECHANISM).
- Once authenticated, SaslHandshake and SaslAuthenticate are answered ILLEGAL_SASL_STATE:
  sessions do not expire (SaslAuthenticate answers session_lifetime_ms 0), so clients
  never re-authenticate (KIP-368's connections.max.reauth.ms is not supported).
- Before authentication on a SASL listener a frame is at most 512 KiB (Kafka's
  sasl.server.max.receive.size); a larger one closes the connection.
- Successes and failures are counted by mechanism (SSL: client certificates) for the
  stats file; each is one rate-limited line (broker.eventlog), never with a secret.
"""

from __future__ import annotations

import ssl
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from broker import sasl, tls
from broker.listeners import Listener, SecurityProtocol

if TYPE_CHECKING:
    from broker.config import BrokerConfig

# The requests a SASL connection takes before it is authenticated, by state.
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
# Kafka's sasl.server.max.receive.size: the largest frame before authentication.
SASL_MAX_RECEIVE_SIZE = 524288
CERTIFICATE = "SSL"  # the "mechanism" of a client certificate, in the counters


class SaslState(Enum):
    HANDSHAKE = "handshake"  # ApiVersions or SaslHandshake expected
    AUTHENTICATE = "authenticate"  # SaslAuthenticate expected
    DONE = "done"


@dataclass
class AuthStats:
    successes: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"successes": dict(self.successes), "failures": dict(self.failures)}


class Authentication:
    """The agent's side: enabled mechanisms, PLAIN users, the TLS context, counters."""

    def __init__(
        self,
        mechanisms: tuple[str, ...],
        plain_users: dict[str, str],
        tls_contexts: dict[SecurityProtocol, ssl.SSLContext] | None = None,
    ) -> None:
        self.mechanisms = mechanisms
        self.plain_users = plain_users
        self.tls_contexts = tls_contexts or {}
        self.stats = AuthStats()

    @classmethod
    def from_config(cls, config: BrokerConfig) -> Authentication:
        """Loads the files the listeners need; ValueError says what is wrong with them.

        ssl.client.auth applies to SSL listeners only: SASL_SSL clients authenticate with
        SASL, and their certificates are not asked for, as in Kafka (KIP-684)."""
        contexts: dict[SecurityProtocol, ssl.SSLContext] = {}
        for listener in config.bound_listeners:
            if not listener.protocol.tls or listener.protocol in contexts:
                continue
            assert config.ssl_certfile is not None  # checked by BrokerConfig
            client_auth = "none" if listener.protocol.sasl else config.ssl_client_auth
            try:
                contexts[listener.protocol] = tls.server_context(
                    config.ssl_certfile,
                    config.ssl_keyfile,
                    config.ssl_key_password,
                    config.ssl_cafile,
                    client_auth,
                )
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the TLS certificate, key or CAs: {exc}") from None
        plain_users: dict[str, str] = {}
        uses_sasl = any(listener.protocol.sasl for listener in config.bound_listeners)
        if uses_sasl and "PLAIN" in config.enabled_mechanisms and config.sasl_plain_users:
            try:
                plain_users = sasl.load_plain_users(config.sasl_plain_users)
            except OSError as exc:
                raise ValueError(f"cannot read --sasl-plain-users: {exc}") from None
        return cls(config.enabled_mechanisms, plain_users, contexts)

    def new_exchange(self, mechanism: str) -> sasl.PlainServer | sasl.ScramServer:
        if mechanism == "PLAIN":
            return sasl.PlainServer(self.plain_users)
        return sasl.ScramServer(mechanism)


class ConnectionAuth:
    """One connection's authentication: its listener, state, principal and exchange."""

    def __init__(self, listener: Listener, principal: str) -> None:
        self.listener = listener
        self.principal = principal
        self.state = SaslState.HANDSHAKE if listener.protocol.sasl else SaslState.DONE
        self.exchange: sasl.PlainServer | sasl.ScramServer | None = None
        # After a SaslHandshake v0 the tokens come raw, without request headers.
        self.raw_tokens = False
        # Set by a handler whose answer is the connection's last: why it closes.
        self.close_after: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.DONE

    def frame_refusal(self, size: int) -> str | None:
        """Why a frame of `size` bytes is refused: before authentication on a SASL
        listener, frames are at most Kafka's sasl.server.max.receive.size, so that a client
        nobody knows cannot hold much of the agent's request memory."""
        if self.state is SaslState.DONE or size <= SASL_MAX_RECEIVE_SIZE:
            return None
        return (
            f"a frame of {size} bytes before authentication on {self.listener.name}"
            f" (at most {SASL_MAX_RECEIVE_SIZE}, Kafka's sasl.server.max.receive.size)"
        )

    def refusal(self, api_key: int) -> str | None:
        """Why a request with this API key may not be taken now (None: it may)."""
        if self.state is SaslState.DONE:
            return None
        if self.state is SaslState.HANDSHAKE and api_key in (API_VERSIONS, SASL_HANDSHAKE):
            return None
        if self.state is SaslState.AUTHENTICATE and api_key == SASL_AUTHENTICATE:
            return None
        expected = "SaslAuthenticate" if self.state is SaslState.AUTHENTICATE else "SaslHandshake"
        return (
            f"API key {api_key} before authentication on {self.listener.name} (expected {expected})"
        )
