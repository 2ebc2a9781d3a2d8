"""Listeners in Kafka's form: `PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094`.

Rules:
- A listener's name is its security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).
  Custom names mapped to a protocol (Kafka's listener.security.protocol.map) are refused.
- Names and ports are unique; an empty host means every interface, as in Kafka.
- Advertised listeners name the same listeners as the listeners (a subset: a listener
  without one advertises its own address); a clients' address for each.
- With `--agents N`, agent i serves every listener's port + i, and advertises port + i.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class Listener:
    protocol: SecurityProtocol
    host: str
    port: int

    @property
    def name(self) -> str:
        return self.protocol.value

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"

    def shifted(self, offset: int) -> Listener:
        return replace(self, port=self.port + offset)


def parse_listener(text: str) -> Listener:
    name, sep, address = text.strip().partition("://")
    if not sep:
        raise ValueError(f"listener {text!r} is not of the form NAME://HOST:PORT")
    try:
        protocol = SecurityProtocol(name.upper())
    except ValueError:
        known = ", ".join(SecurityProtocol)
        raise ValueError(
            f"listener name {name!r} is not a security protocol ({known}): custom listener"
            " names (listener.security.protocol.map) are not supported"
        ) from None
    host, colon, port_text = address.rpartition(":")
    if not colon:
        raise ValueError(f"listener {text!r} has no port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"listener {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"listener {text!r}: port {port} is out of range")
    return Listener(protocol, host, port)


def parse_listeners(text: str) -> tuple[Listener, ...]:
    """A comma-separated list of listeners, names and ports unique."""
    listeners = tuple(parse_listener(part) for part in text.split(",") if part.strip())
    if not listeners:
        raise ValueError("no listener given")
    names = [listener.name for listener in listeners]
    for name in set(names):
        if names.count(name) > 1:
            raise ValueError(f"listener {name} is given more than once")
    ports = [listener.port for listener in listeners]
    for port in set(ports):
        if ports.count(port) > 1:
            raise ValueError(f"port {port} is given to more than one listener")
    return listeners


def format_listeners(listeners: tuple[Listener, ...]) -> str:
    return ",".join(map(str, listeners))


def advertised_for(
    listeners: tuple[Listener, ...],
    advertised: tuple[Listener, ...],
    advertised_host: str | None,
) -> tuple[Listener, ...]:
    """The address clients get for each listener, in the listeners' order."""
    names = {listener.name for listener in listeners}
    for entry in advertised:
        if entry.name not in names:
            raise ValueError(
                f"advertised listener {entry} names no listener of --listeners"
                f" ({format_listeners(listeners)})"
            )
    given = {entry.name: entry for entry in advertised}
    result = []
    for listener in listeners:
        entry = given.get(listener.name) or replace(listener, host=advertised_host or listener.host)
        if not entry.host:
            raise ValueError(
                f"listener {listener} binds every interface: give an advertised host for it"
                " (--advertised-listeners or --advertised-host)"
            )
        result.append(entry)
    return tuple(result)
