"""Leases on background jobs: one agent at a time runs a job, and another takes it over
once the holder stops renewing.

Rules:

- (LEASE, job name) holds (node id, expires_ms). `claim` takes a free or expired lease,
  or renews the caller's own; it answers False while another agent holds it.
- A lease is a way to not do work twice, never the only guard of correctness: every job
  that holds one commits its effects in transactions that check what they change.
"""

from __future__ import annotations

from metadata import keys
from metadata.kv import ReadTransaction, Transaction


def holder(tr: ReadTransaction, sub: keys.Subspace, job: str, now_ms: int) -> int | None:
    """The node id holding the job's lease, or None when nobody does."""
    raw = tr.get(sub.key(keys.LEASE, job))
    if raw is None:
        return None
    node_id, expires_ms = keys.unpack_value(raw)
    return int(node_id) if int(expires_ms) > now_ms else None


def claim(
    tr: Transaction, sub: keys.Subspace, job: str, node_id: int, now_ms: int, duration_ms: int
) -> bool:
    """Take or renew the lease for duration_ms; False while another node holds it."""
    current = holder(tr, sub, job, now_ms)
    if current is not None and current != node_id:
        return False
    tr.set(sub.key(keys.LEASE, job), keys.pack_value((node_id, now_ms + duration_ms)))
    return True


def release(tr: Transaction, sub: keys.Subspace, job: str, node_id: int) -> None:
    """Give the lease up (an agent that stops), if this node holds it."""
    raw = tr.get(sub.key(keys.LEASE, job))
    if raw is not None and int(keys.unpack_value(raw)[0]) == node_id:
        tr.clear(sub.key(keys.LEASE, job))
