"""TLS for the SSL and SASL_SSL listeners: the server context, the handshake, and the
principal of a client certificate.

Rules:
- The standard library's `ssl` on anyio streams; certificates and keys are PEM files
  (Kafka's ssl.keystore.* and ssl.truststore.*), ssl.client.auth is none, requested or
  required.
- A handshake that fails (a plaintext client, garbage, an expired or unknown client
  certificate) or takes longer than HANDSHAKE_SECONDS is the client's fault: one line,
  the connection closed, the agent serving on.
- The principal of a client certificate is `User:` and its subject as Kafka's default
  principal builder renders it (X500Principal.getName(), RFC 2253, with the default
  ssl.principal.mapping.rules): the RDNs last to first, CN/OU/O/L/ST/C/STREET/DC/UID
  by keyword, other attributes as OID=#hex of their DER value.
"""

from __future__ import annotations

import ssl

import anyio
import anyio.abc
from anyio.streams.tls import TLSAttribute, TLSStream

HANDSHAKE_SECONDS = 10.0

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(
    certfile: str,
    keyfile: str | None,
    password: str | None,
    cafile: str | None,
    client_auth: str,
) -> ssl.SSLContext:
    """The agents' TLS context; raises OSError or ssl.SSLError for unusable files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile, password)
    if cafile:
        context.load_verify_locations(cafile=cafile)
    context.verify_mode = _CLIENT_AUTH[client_auth]
    return context


class HandshakeFailed(Exception):
    """The client's TLS handshake failed; `quiet` when it went away before saying a word
    (a port probe), which is not worth a line."""

    def __init__(self, reason: str, *, quiet: bool = False) -> None:
        super().__init__(reason)
        self.quiet = quiet


async def handshake(stream: anyio.abc.SocketStream, context: ssl.SSLContext) -> TLSStream:
    """The TLS stream over `stream` once the handshake is done."""
    try:
        with anyio.fail_after(HANDSHAKE_SECONDS):
            return await TLSStream.wrap(
                stream, server_side=True, ssl_context=context, standard_compatible=False
            )
    except TimeoutError:
        raise HandshakeFailed(f"no TLS handshake within {HANDSHAKE_SECONDS:g} s") from None
    except ssl.SSLEOFError:
        raise HandshakeFailed("closed during the TLS handshake", quiet=True) from None
    except ssl.SSLError as exc:
        raise HandshakeFailed(f"TLS handshake failed: {_why(exc)}") from None
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError, OSError) as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError):
            raise HandshakeFailed(f"TLS handshake failed: {_why(cause)}") from None
        raise HandshakeFailed("closed during the TLS handshake", quiet=True) from None


def _why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, and for a refused certificate what was wrong with it."""
    reason = exc.reason or str(exc)
    verify = getattr(exc, "verify_message", None)
    return f"{reason} ({verify})" if verify else reason


def peer_principal(stream: TLSStream) -> str | None:
    """`User:<subject DN>` of the client's certificate, or None without one."""
    der = stream.extra(TLSAttribute.peer_certificate_binary, None)
    if not der:
        return None
    return "User:" + subject_dn(der)


# -- the subject of a DER certificate, as RFC 2253 ---------------------------------------

_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.9": "STREET",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
_STRINGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x16: "ascii",  # IA5String
    0x14: "latin-1",  # TeletexString
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}


def _tlv(data: bytes, at: int) -> tuple[int, int, int, int]:
    """(tag, start of the value, end of the value, end of the element) at `at`."""
    tag = data[at]
    length = data[at + 1]
    start = at + 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    end = start + length
    if end > len(data):
        raise ValueError("truncated DER")
    return tag, start, end, end


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    items = []
    at = start
    while at < end:
        tag, vstart, vend, nxt = _tlv(data, at)
        items.append((tag, at, vstart, vend))
        at = nxt
    return items


def _oid(raw: bytes) -> str:
    first = raw[0]
    parts = [first // 40 if first < 80 else 2, first % 40 if first < 80 else first - 80]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(map(str, parts))


def _escape(value: str) -> str:
    out = []
    for index, char in enumerate(value):
        if char in ',+"\\<>;' or (
            char == " " and index in (0, len(value) - 1) or char == "#" and index == 0
        ):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def subject_dn(der: bytes) -> str:
    """The certificate's subject as Java's X500Principal.getName() writes it."""
    _tag, start, end, _ = _tlv(der, 0)  # Certificate
    _tag, start, end, _ = _tlv(der, start)  # TBSCertificate
    fields = _children(der, start, end)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    _tag, _at, subject_start, subject_end = fields[4]  # serial, sig, issuer, validity, subject
    rdns = []
    for _set_tag, _a, set_start, set_end in _children(der, subject_start, subject_end):
        parts = []
        for _seq, _b, seq_start, seq_end in _children(der, set_start, set_end):
            (oid_item, value_item) = _children(der, seq_start, seq_end)[:2]
            oid = _oid(der[oid_item[2] : oid_item[3]])
            value_tag, value_at, value_start, value_end = value_item
            keyword = _KEYWORDS.get(oid)
            encoding = _STRINGS.get(value_tag)
            if keyword is not None and encoding is not None:
                text = der[value_start:value_end].decode(encoding, errors="replace")
                parts.append(f"{keyword}={_escape(text)}")
            else:
                parts.append(f"{keyword or oid}=#{der[value_at:value_end].hex()}")
        rdns.append("+".join(parts))
    return ",".join(reversed(rdns))
