"""SASL mechanisms, server side, without I/O: PLAIN (RFC 4616) and SCRAM-SHA-256/512
(RFC 5802, RFC 7677).

Rules:
- A mechanism takes the client's tokens one by one and answers each with the server's
  token; once it has a principal, the client is authenticated. Bad input and bad
  credentials raise `AuthenticationFailed`, whose message the client gets and the log
  shows: it never holds a password, a proof or a key.
- An unknown user and a wrong password fail alike ("invalid credentials"), so that the
  answer does not tell which user names exist.
- SCRAM: the GS2 header is `n,,` or `y,,` (no channel binding: `p=` is refused), an
  authorization id must be the user name itself, as Kafka wants; the client's nonce is
  extended by the server's, and the final message must end with both (Kafka's check) and
  carry the GS2 header again; the proof is checked against the stored key, then the server signature sent.
  Kafka's delegation tokens (the `tokenauth` extension) are not supported.
- The credentials are the server's view of a password (salt, iterations, stored key,
  server key): what metadata.scram keeps. The salted password itself is never kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping

from metadata.scram import ScramCredential

MIN_ITERATIONS = 4096  # Kafka's minimum for both SCRAM mechanisms
MAX_ITERATIONS = 16384  # Kafka's maximum (ScramControlManager)
# Kafka's ScramMechanism type numbers (AlterUserScramCredentials, Describe...).
SCRAM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
SCRAM_TYPE_OF = {name: number for number, name in SCRAM_TYPES.items()}
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class AuthenticationFailed(Exception):
    """The client failed to authenticate; the message is for the client and the log."""


def _hmac(digest: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, digest).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i): what a client sends in AlterUserScramCredentials."""
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], password.encode(), salt, iterations)


def credential_from_salted(
    mechanism: str, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """The stored key and server key of a salted password (RFC 5802 section 3)."""
    digest = _HASHES[mechanism]
    client_key = _hmac(digest, salted, b"Client Key")
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = _hmac(digest, salted, b"Server Key")
    return ScramCredential(salt, stored_key, server_key, iterations)


class PlainServer:
    """PLAIN: one token, `authzid NUL user NUL password`, checked against the users."""

    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self.principal: str | None = None

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is"
                " different from username"
            )
        expected = self.users.get(user)
        # Compared in constant time, and a missing user costs the same comparison.
        matches = hmac.compare_digest(
            (expected if expected is not None else "\x00" + password).encode(), password.encode()
        )
        if expected is None or not matches:
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.principal = f"User:{user}"
        return b""


def _sasl_name(encoded: str) -> str:
    """A SCRAM user name with its `=2C` and `=3D` escapes undone."""
    out = []
    index = 0
    while index < len(encoded):
        char = encoded[index]
        if char == "=":
            escape = encoded[index : index + 3]
            if escape == "=2C":
                out.append(",")
            elif escape == "=3D":
                out.append("=")
            else:
                raise AuthenticationFailed("Invalid SCRAM message: bad escape in the user name")
            index += 3
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _valid_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


class ScramServer:
    """SCRAM-SHA-256 or -512: client-first, server-first, client-final, server-final.

    `receive_first` gives the user name, whose credential the caller looks up and hands
    to `server_first`; then `receive_final` checks the proof and answers the server's
    signature. Each step may raise AuthenticationFailed.
    """

    def __init__(self, mechanism: str, server_nonce: str | None = None) -> None:
        self.mechanism = mechanism
        # Random unless given (RFC 7677's test vector gives it).
        self._server_nonce = server_nonce or secrets.token_urlsafe(24)
        self.digest = _HASHES[mechanism]
        self.principal: str | None = None
        self.username: str | None = None
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None

    def receive_first(self, token: bytes) -> str:
        try:
            message = token.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SCRAM client first message: not UTF-8") from None
        flag, comma1, rest = message.partition(",")
        authzid_part, comma2, bare = rest.partition(",")
        if not comma1 or not comma2:
            raise AuthenticationFailed("Invalid SCRAM client first message: no GS2 header")
        if flag.startswith("p="):
            raise AuthenticationFailed("SCRAM channel binding is not supported")
        if flag not in ("n", "y"):
            raise AuthenticationFailed("Invalid SCRAM client first message: bad GS2 flag")
        if authzid_part and not authzid_part.startswith("a="):
            raise AuthenticationFailed("Invalid SCRAM client first message: bad GS2 header")
        parts = bare.split(",")
        if len(parts) < 2 or not parts[0].startswith("n=") or not parts[1].startswith("r="):
            raise AuthenticationFailed("Invalid SCRAM client first message: expected n= and r=")
        if parts[0] == "n=":
            raise AuthenticationFailed("Invalid SCRAM client first message: no user name")
        # Extensions (key=value) follow; Kafka's only one is its delegation tokens'.
        extensions = dict(part.partition("=")[::2] for part in parts[2:])
        if extensions.get("tokenauth", "").lower() == "true":
            raise AuthenticationFailed("Delegation token authentication is not supported")
        username = _sasl_name(parts[0][2:])
        authzid = _sasl_name(authzid_part[2:]) if authzid_part else ""
        if authzid and authzid != username:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is"
                " different from username"
            )
        client_nonce = parts[1][2:]
        if not _valid_nonce(client_nonce):
            raise AuthenticationFailed("Invalid SCRAM client first message: bad nonce")
        self._gs2 = f"{flag},{authzid_part},"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        self.username = username
        return username

    def server_first(self, credential: ScramCredential | None) -> bytes:
        if credential is None:
            raise AuthenticationFailed(self._invalid())
        self._credential = credential
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def receive_final(self, token: bytes) -> bytes:
        credential = self._credential
        if credential is None:
            raise AuthenticationFailed("SCRAM client final message before the first one")
        try:
            message = token.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SCRAM client final message: not UTF-8") from None
        without_proof, sep, proof_text = message.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("Invalid SCRAM client final message: no proof")
        parts = without_proof.split(",")
        if len(parts) < 2 or not parts[0].startswith("c=") or not parts[1].startswith("r="):
            raise AuthenticationFailed("Invalid SCRAM client final message: expected c= and r=")
        attrs = {"c": parts[0][2:], "r": parts[1][2:]}  # extensions after them are ignored
        try:
            binding = base64.b64decode(attrs["c"], validate=True).decode()
            proof = base64.b64decode(proof_text, validate=True)
        except (ValueError, UnicodeDecodeError):
            raise AuthenticationFailed("Invalid SCRAM client final message: bad base64") from None
        if binding != self._gs2:
            raise AuthenticationFailed("Invalid SCRAM client final message: channel binding")
        # Must end with the combined nonce, as Kafka checks: librdkafka before 2.x sends
        # its own nonce again in front. The server's fresh nonce is still in the proof.
        if not attrs["r"].endswith(self._nonce):
            raise AuthenticationFailed("Invalid client nonce in the final client message.")
        auth_message = ",".join(
            (self._client_first_bare, self._server_first, without_proof)
        ).encode()
        signature = _hmac(self.digest, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed(self._invalid())
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(
            hashlib.new(self.digest, client_key).digest(), credential.stored_key
        ):
            raise AuthenticationFailed(self._invalid())
        server_signature = _hmac(self.digest, credential.server_key, auth_message)
        self.principal = f"User:{self.username}"
        return b"v=" + base64.b64encode(server_signature)

    def _invalid(self) -> str:
        return (
            "Authentication failed during authentication due to invalid credentials with"
            f" SASL mechanism {self.mechanism}"
        )


def load_plain_users(path: str) -> dict[str, str]:
    """The PLAIN users of a file of `name:password` lines (blank lines and # comments
    skipped); raises ValueError naming the line of a malformed one, never its password."""
    users: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            name, sep, password = text.partition(":")
            name = name.strip()
            if not sep or not name:
                raise ValueError(f"{path}, line {number}: expected name:password")
            if name in users:
                raise ValueError(f"{path}, line {number}: user {name!r} is given twice")
            users[name] = password
    return users
