"""Zones: which zone a client is in, and the home zones of coordinator keys.

Rules:

- An agent's zone is `--zone` (registered as its rack). A client says its zone in its
  client.id: `bucketlog_az=<zone>` anywhere in it, the zone running to the next comma,
  the next whitespace or the end (`myapp,bucketlog_az=us-east-1a` and
  `bucketlog_az=b` name us-east-1a and b; an empty value names none). The first such
  mark counts. A connection parses its client.id again only when it changes.
- Routing by zone (`broker.placement.serving`) sends a zoned client to the live agents of
  its zone, or to every live agent when its zone has none.
- A group or transactional id is coordinated by one agent for every client, so a key's
  coordinator is picked among the live agents of the key's *home zone*: the zone of the
  first zoned client that looked for its coordinator (FindCoordinator), kept in the
  metadata store (metadata.homes) and never changed. A key without a home, or whose home
  has no live agent, is coordinated as if no agent had a zone.
- Homes are cached by each agent: a home once read forever (it never changes), a key
  found without one for HOME_RECHECK_SECONDS (the age the live agents' list may have).
  The cache holds CACHE_LIMIT keys of each kind at most, the oldest dropped first (a
  dropped home is read again when needed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from metadata import homes
from metadata.keys import Subspace
from metadata.kv import KV

MARK = "bucketlog_az="
HOME_RECHECK_SECONDS = 0.5
CACHE_LIMIT = 100_000
# More keys than this to look up at once are read with one range read of every home.
POINT_READS = 16
_ENDS = (",", " ", "\t", "\n", "\r")

V = TypeVar("V")


def client_zone(client_id: str | None) -> str | None:
    """The zone a client.id names (see module), or None."""
    if not client_id:
        return None
    start = client_id.find(MARK)
    if start < 0:
        return None
    rest = client_id[start + len(MARK) :]
    end = len(rest)
    for stop in _ENDS:
        at = rest.find(stop)
        if 0 <= at < end:
            end = at
    return rest[:end] or None


class ClientZone:
    """One connection's client zone, parsed again only when its client.id changes."""

    __slots__ = ("_client_id", "zone")

    def __init__(self) -> None:
        self._client_id: str | None = None
        self.zone: str | None = None

    def of(self, client_id: str | None) -> str | None:
        if client_id != self._client_id:
            self._client_id = client_id
            self.zone = client_zone(client_id)
        return self.zone


class HomeZones:
    """The home zones (metadata.homes) this agent has read, by (kind, key)."""

    def __init__(
        self,
        kv: KV,
        sub: Subspace,
        limit: int = CACHE_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kv = kv
        self._sub = sub
        self._limit = limit
        self._clock = clock
        self._homes: dict[tuple[int, str], str] = {}
        self._absent: dict[tuple[int, str], float] = {}  # -> time.monotonic() of the read

    def home(self, kind: int, key: str) -> str | None:
        """The key's home zone as last read here (None: none, or not read)."""
        return self._homes.get((kind, key))

    def _unknown(self, kind: int, wanted: Iterable[str], max_age: float) -> list[str]:
        clock = self._clock()
        unknown = []
        for key in wanted:
            if (kind, key) in self._homes:
                continue
            read_at = self._absent.get((kind, key))
            if read_at is None or clock - read_at >= max_age:
                unknown.append(key)
        return unknown

    async def load(
        self, kind: int, wanted: Iterable[str], *, max_age: float = HOME_RECHECK_SECONDS
    ) -> None:
        """Read the homes of those of `wanted` not known here, or known to have none for
        max_age seconds or more."""
        unknown = self._unknown(kind, wanted, max_age)
        if not unknown:
            return
        read_at = self._clock()
        sub = self._sub
        if len(unknown) > POINT_READS:
            every = await self._kv.read(lambda tr: homes.get_all(tr, sub, kind))
            found = {key: every[key] for key in unknown if key in every}
        else:
            found = await self._kv.read(
                lambda tr: homes.get_many(tr, sub, kind, unknown), quick=True
            )
        self._learn(kind, unknown, found, read_at)

    async def claim(self, kind: int, wanted: Iterable[str], zone: str) -> None:
        """Make `zone` the home of those of `wanted` that have none (metadata.homes.claim)."""
        unknown = [key for key in wanted if (kind, key) not in self._homes]
        if not unknown:
            return
        read_at = self._clock()
        sub = self._sub
        found = await self._kv.transact(
            lambda tr: {key: homes.claim(tr, sub, kind, key, zone) for key in unknown}
        )
        self._learn(kind, unknown, found, read_at)

    def _learn(self, kind: int, asked: list[str], found: dict[str, str], read_at: float) -> None:
        for key, zone in found.items():
            self._absent.pop((kind, key), None)
            _put(self._homes, (kind, key), zone, self._limit)
        for key in asked:
            if key not in found:
                _put(self._absent, (kind, key), read_at, self._limit)


def _put(table: dict[tuple[int, str], V], key: tuple[int, str], value: V, limit: int) -> None:
    table.pop(key, None)  # to the end: the newest
    if len(table) >= limit:
        del table[next(iter(table))]
    table[key] = value
