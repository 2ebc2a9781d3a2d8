"""Home zones of coordinator keys: the zone whose agents coordinate a group or a
transactional id (broker.zones).

Rules:

- (HOME_ZONE, kind, key) holds (zone,). `kind` is FindCoordinator's key type: 0 a group
  id, 1 a transactional id; the two are separate names, as in Kafka.
- `claim` sets a key's home only if it has none, in the caller's transaction, and answers
  the home the key has after it: the first zone to claim a key keeps it.
- A home is never changed nor cleared, so that an agent may remember one forever once it
  has read it; a deleted group keeps its home (a few bytes), which a group created again
  under the same id finds.
"""

from __future__ import annotations

from collections.abc import Iterable

from metadata import keys
from metadata.kv import ReadTransaction, Transaction

GROUP = 0
TRANSACTION = 1


def get(tr: ReadTransaction, sub: keys.Subspace, kind: int, key: str) -> str | None:
    """The key's home zone, or None when it has none."""
    raw = tr.get(sub.key(keys.HOME_ZONE, kind, key))
    return None if raw is None else str(keys.unpack_value(raw)[0])


def get_many(
    tr: ReadTransaction, sub: keys.Subspace, kind: int, wanted: Iterable[str]
) -> dict[str, str]:
    """The home zones of those of `wanted` that have one, by key (point reads)."""
    found = {}
    for key in wanted:
        zone = get(tr, sub, kind, key)
        if zone is not None:
            found[key] = zone
    return found


def get_all(tr: ReadTransaction, sub: keys.Subspace, kind: int) -> dict[str, str]:
    """Every key of `kind` that has a home zone, with it (one range read)."""
    begin, end = sub.range(keys.HOME_ZONE, kind)
    homes = {}
    for raw_key, raw in tr.get_range(begin, end):
        _tag, _kind, key = sub.unpack(raw_key)
        homes[str(key)] = str(keys.unpack_value(raw)[0])
    return homes


def claim(tr: Transaction, sub: keys.Subspace, kind: int, key: str, zone: str) -> str:
    """Make `zone` the key's home if it has none; the key's home zone after."""
    current = get(tr, sub, kind, key)
    if current is not None:
        return current
    tr.set(sub.key(keys.HOME_ZONE, kind, key), keys.pack_value((zone,)))
    return zone
