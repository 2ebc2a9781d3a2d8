"""Expected events of an agent's connections: one line each, rate-limited, and counted.

Rules:

- Bad input from a client (a malformed frame or request, an unsupported version) and a
  client that goes away while it is answered are expected: each is one log line naming
  the peer and the reason, never a traceback. Tracebacks are for bugs (a handler that
  raised), which are counted here too.
- Each kind of event writes at most `BURST` lines per `WINDOW_SECONDS`; the first event
  of a later window first writes how many lines of its kind were left out. A client that
  sends garbage in a loop therefore costs a few lines, not one per attempt.
- Every event is counted, logged or not; the counts go to the agent's stats file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

BURST = 10
WINDOW_SECONDS = 10.0

# The kinds of events and the level of their lines.
MALFORMED_REQUEST = "malformed_requests"
UNSUPPORTED_VERSION = "unsupported_versions"
CLIENT_DISCONNECT = "client_disconnects"
HANDLER_ERROR = "handler_errors"
# A request refused by the authorizer (broker.access): expected, one line within the limit.
AUTHORIZATION_DENIED = "authorization_denied"
# An ACL request refused as invalid (an unknown code, a PREFIXED "*"): INVALID_REQUEST.
INVALID_ACL_REQUEST = "invalid_acl_requests"
# A request that needed the metadata store while it was unreachable: answered with a
# retriable error.
METADATA_UNAVAILABLE = "metadata_unavailable"
# Authentication (broker.authentication): a client refused (bad credentials, a request
# before authentication, an unsupported mechanism), and one that authenticated.
AUTHENTICATION_FAILURE = "authentication_failures"
AUTHENTICATED = "authentications"
# A TLS handshake that failed (plaintext on a TLS port, garbage, a refused certificate),
# and a connection closed before its handshake began (a port probe), not worth a line.
TLS_HANDSHAKE_FAILURE = "tls_handshake_failures"
TLS_CLOSED_EARLY = "tls_closed_before_handshake"
LEVELS = {
    AUTHORIZATION_DENIED: logging.INFO,
    INVALID_ACL_REQUEST: logging.WARNING,
    MALFORMED_REQUEST: logging.WARNING,
    UNSUPPORTED_VERSION: logging.WARNING,
    CLIENT_DISCONNECT: logging.INFO,
    HANDLER_ERROR: logging.ERROR,
    METADATA_UNAVAILABLE: logging.WARNING,
    AUTHENTICATION_FAILURE: logging.WARNING,
    AUTHENTICATED: logging.INFO,
    TLS_HANDSHAKE_FAILURE: logging.WARNING,
    TLS_CLOSED_EARLY: logging.DEBUG,
}


@dataclass(slots=True)
class _Window:
    started: float
    logged: int = 0
    left_out: int = 0


class EventLog:
    """Counts events by kind and logs them within the rate limit."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = BURST,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._window_seconds = window_seconds
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self.counts: dict[str, int] = dict.fromkeys(LEVELS, 0)

    def record(self, kind: str, message: str, *args: object, exc_info: bool = False) -> bool:
        """Count one event of `kind`; log its line unless over the limit. True if logged."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        level = LEVELS.get(kind, logging.WARNING)
        now = self._clock()
        window = self._windows.get(kind)
        if window is None or now - window.started >= self._window_seconds:
            if window is not None and window.left_out:
                self._logger.log(
                    level,
                    "%d more lines like the next were left out in %.0f s",
                    window.left_out,
                    now - window.started,
                )
            window = self._windows[kind] = _Window(now)
        if window.logged >= self._burst:
            window.left_out += 1
            return False
        window.logged += 1
        self._logger.log(level, message, *args, exc_info=exc_info, extra={"event": kind})
        return True
