"""Cluster identity and the agent registry.

Agents are stateless; each registers its advertised address with a lease that it renews.
An address (the first listener's) keeps its node id across restarts, so clients see stable
broker ids. The record also carries the advertised address of each of the agent's
listeners; a record without them (written before listeners existed) is a PLAINTEXT
listener at the agent's address. The live
agents are those whose lease has not expired; the caller passes the clock in, keeping the
transaction functions pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from metadata import keys
from metadata.kv import ReadTransaction, Transaction

# A listener's advertised endpoint: (listener name, host, port).
Endpoint = tuple[str, str, int]
PLAINTEXT = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class Agent:
    node_id: int
    host: str
    port: int
    rack: str | None
    lease_expires_ms: int
    listeners: tuple[Endpoint, ...] = ()  # none: PLAINTEXT at host:port

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of `listener` reach this agent (None: it has no such listener)."""
        if not self.listeners:
            return (self.host, self.port) if listener == PLAINTEXT else None
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return None


def _record(
    host: str, port: int, rack: str | None, expires_ms: int, listeners: tuple[Endpoint, ...]
) -> bytes:
    return keys.pack_value((host, port, rack, expires_ms, tuple(listeners)))


def ensure_cluster_id(tr: Transaction, sub: keys.Subspace, proposed: str) -> str:
    """The cluster's id; the first caller's proposal wins."""
    key = sub.key(keys.CLUSTER, "id")
    raw = tr.get(key)
    if raw is not None:
        return raw.decode()
    tr.set(key, proposed.encode())
    return proposed


def _next_counter(tr: Transaction, key: bytes, start: int) -> int:
    raw = tr.get(key)
    value = keys.unpack_value(raw)[0] if raw is not None else start
    tr.set(key, keys.pack_value((value + 1,)))
    return int(value)


def register_agent(
    tr: Transaction,
    sub: keys.Subspace,
    host: str,
    port: int,
    rack: str | None,
    lease_expires_ms: int,
    listeners: tuple[Endpoint, ...] = (),
) -> int:
    """Register (or re-register) the agent at host:port and return its node id."""
    node_key = sub.key(keys.NODE, f"{host}:{port}")
    raw = tr.get(node_key)
    if raw is None:
        node_id = _next_counter(tr, sub.key(keys.CLUSTER, "next_node_id"), 1)
        tr.set(node_key, keys.pack_value((node_id,)))
    else:
        node_id = int(keys.unpack_value(raw)[0])
    tr.set(sub.key(keys.AGENT, node_id), _record(host, port, rack, lease_expires_ms, listeners))
    return node_id


def renew_lease(tr: Transaction, sub: keys.Subspace, agent: Agent) -> None:
    tr.set(
        sub.key(keys.AGENT, agent.node_id),
        _record(agent.host, agent.port, agent.rack, agent.lease_expires_ms, agent.listeners),
    )


def deregister_agent(tr: Transaction, sub: keys.Subspace, node_id: int) -> None:
    tr.clear(sub.key(keys.AGENT, node_id))


def deregister_address(tr: Transaction, sub: keys.Subspace, host: str, port: int) -> int | None:
    """Deregister the agent at host:port, as its supervisor does when it sees it die;
    return its node id (None if no agent ever registered there). It keeps its node id."""
    raw = tr.get(sub.key(keys.NODE, f"{host}:{port}"))
    if raw is None:
        return None
    node_id = int(keys.unpack_value(raw)[0])
    tr.clear(sub.key(keys.AGENT, node_id))
    return node_id


def live_agents(tr: ReadTransaction, sub: keys.Subspace, now_ms: int) -> list[Agent]:
    begin, end = sub.range(keys.AGENT)
    agents = []
    for key, value in tr.get_range(begin, end):
        (node_id,) = sub.unpack(key)[1:]
        host, port, rack, expires, *rest = keys.unpack_value(value)
        listeners = tuple((str(n), str(h), int(p)) for n, h, p in rest[0]) if rest else ()
        if expires > now_ms:
            agents.append(Agent(int(node_id), host, int(port), rack, int(expires), listeners))
    return agents


def allocate_producer_id(tr: Transaction, sub: keys.Subspace) -> int:
    return _next_counter(tr, sub.key(keys.CLUSTER, "next_producer_id"), 1000)
