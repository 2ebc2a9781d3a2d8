"""The server-side assignors of the consumer group protocol (KIP-848): `uniform` and `range`.

An assignor maps each member to the partitions it should own, from the members'
subscriptions (topic ids), their current target assignment and the partition count of every
subscribed topic. Rules every assignor here keeps (Apache Kafka's, for the same names):

* pure and deterministic: the same input gives the same output whatever the order of the
  mappings handed in (members are taken by member id, partitions by (topic id, partition));
* every partition of a topic that some member subscribes to goes to exactly one member that
  subscribes to it, and a member gets partitions of its subscribed topics only;
* sticky: a member keeps the partitions of its current target assignment where the balance
  allows, so a rebalance moves as few partitions as it can.

`uniform` spreads all partitions evenly over the members: when every member subscribes to
the same topics each gets ⌊P/M⌋ or ⌈P/M⌉ partitions; otherwise no partition could move to
a member subscribed to its topic that has two fewer partitions than its owner. `range`
works topic by topic: each subscriber of a topic gets ⌊P/M⌋ or ⌈P/M⌉ of that topic's
partitions, keeping its lowest current ones first, new ones in contiguous ranges, so that
co-partitioned topics go to the same members when nothing moves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

TopicPartition = tuple[bytes, int]
Partitions = frozenset[TopicPartition]
Assignment = dict[str, Partitions]


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of a member."""

    subscribed: frozenset[bytes]  # topic ids
    current: Partitions = frozenset()  # its current target assignment


Assignor = Callable[[Mapping[str, MemberSpec], Mapping[bytes, int]], Assignment]


def _valid(spec: MemberSpec, partitions: Mapping[bytes, int]) -> list[TopicPartition]:
    """The member's current partitions that it may keep: of a subscribed topic that exists."""
    return sorted(
        (t, p)
        for t, p in spec.current
        if t in spec.subscribed and t in partitions and 0 <= p < partitions[t]
    )


def uniform(members: Mapping[str, MemberSpec], partitions: Mapping[bytes, int]) -> Assignment:
    """Every partition of a subscribed topic, spread evenly and stickily over the members."""
    ids = sorted(members)
    if not ids:
        return {}
    subscriptions = {frozenset(members[m].subscribed & partitions.keys()) for m in ids}
    if len(subscriptions) == 1:
        return _uniform_homogeneous(ids, members, partitions, next(iter(subscriptions)))
    return _uniform_heterogeneous(ids, members, partitions)


def _uniform_homogeneous(
    ids: list[str],
    members: Mapping[str, MemberSpec],
    partitions: Mapping[bytes, int],
    topics: frozenset[bytes],
) -> Assignment:
    total = sum(partitions[t] for t in topics)
    quota, extra = divmod(total, len(ids))
    owned: dict[str, list[TopicPartition]] = {}
    taken: set[TopicPartition] = set()
    for m in ids:
        keep = [tp for tp in _valid(members[m], partitions) if tp not in taken]
        limit = quota
        if len(keep) > quota and extra > 0:
            limit, extra = quota + 1, extra - 1
        owned[m] = keep[:limit]
        taken.update(owned[m])
    free = iter(sorted((t, p) for t in topics for p in range(partitions[t]) if (t, p) not in taken))
    for m in ids:
        owned[m].extend(next(free) for _ in range(quota - len(owned[m])))
    for m in ids:
        if extra == 0:
            break
        if len(owned[m]) == quota:
            owned[m].append(next(free))
            extra -= 1
    return {m: frozenset(owned[m]) for m in ids}


def _uniform_heterogeneous(
    ids: list[str], members: Mapping[str, MemberSpec], partitions: Mapping[bytes, int]
) -> Assignment:
    subscribers: dict[bytes, list[str]] = {}
    for m in ids:
        for t in sorted(members[m].subscribed & partitions.keys()):
            subscribers.setdefault(t, []).append(m)
    owner: dict[TopicPartition, str] = {}
    owned: dict[str, set[TopicPartition]] = {m: set() for m in ids}
    for m in ids:
        for tp in _valid(members[m], partitions):
            if tp not in owner:
                owner[tp] = m
                owned[m].add(tp)
    # The partitions nobody keeps, those with the fewest candidates first, each to its
    # least loaded subscriber.
    free = [
        (t, p) for t in sorted(subscribers) for p in range(partitions[t]) if (t, p) not in owner
    ]
    free.sort(key=lambda tp: (len(subscribers[tp[0]]), tp))
    for tp in free:
        m = min(subscribers[tp[0]], key=lambda c: (len(owned[c]), c))
        owner[tp] = m
        owned[m].add(tp)
    # Then move partitions from a member to a subscriber with at least two fewer, the most
    # loaded member first, until none can move: each move lowers the sum of squared loads.
    moved = True
    while moved:
        moved = False
        for m in sorted(ids, key=lambda c: (-len(owned[c]), c)):
            load = len(owned[m])
            for tp in sorted(owned[m], reverse=True):
                candidates = [c for c in subscribers[tp[0]] if len(owned[c]) < load - 1]
                if candidates:
                    target = min(candidates, key=lambda c: (len(owned[c]), c))
                    owned[m].discard(tp)
                    owned[target].add(tp)
                    moved = True
                    break
            if moved:
                break
    return {m: frozenset(owned[m]) for m in ids}


def range_(members: Mapping[str, MemberSpec], partitions: Mapping[bytes, int]) -> Assignment:
    """Topic by topic: each subscriber gets an even share, its lowest current partitions
    kept first, new ones handed out in ascending ranges in member id order."""
    ids = sorted(members)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in ids}
    topics = sorted({t for m in ids for t in members[m].subscribed if t in partitions})
    for t in topics:
        subscribers = [m for m in ids if t in members[m].subscribed]
        count = partitions[t]
        quota, extra = divmod(count, len(subscribers))
        kept: set[int] = set()
        remaining: list[tuple[str, int]] = []
        for m in subscribers:
            current = [p for tt, p in _valid(members[m], partitions) if tt == t and p not in kept]
            owned[m].update((t, p) for p in current[:quota])
            kept.update(current[:quota])
            if len(current) > quota and extra > 0:
                extra -= 1
                owned[m].add((t, current[quota]))
                kept.add(current[quota])
            else:
                remaining.append((m, quota - min(len(current), quota)))
        free = [p for p in range(count) if p not in kept]
        start = 0
        for m, need in remaining:
            if extra > 0:
                need, extra = need + 1, extra - 1
            owned[m].update((t, p) for p in free[start : start + need])
            start += need
    return {m: frozenset(owned[m]) for m in ids}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
