"""What the coordinator holds for each group, and what its offsets and admin parts may use.

A group's slot is its lock and, while this agent coordinates the group, the group as
loaded (a consumer-protocol group is `consumer_coordinator`'s): the machine's state of it, the revision of its record in the store (the fence of
every write), and the promises of the JoinGroup and SyncGroup requests parked on it, by
member id (the machine names a parked request by its member only).

`CoordinatorShell` is the coordinator as `offsets` and `admin` see it: the stores, the
settings, the machine, the locked and claimed slots, and running a transition.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio
from kio.schema.errors import ErrorCode

from broker.groups.classic import ClassicGroup, GroupState, JoinResult, Member, SyncResult
from broker.groups.classic_machine import ClassicGroupMachine, Transition
from broker.groups.placement import Placement
from broker.groups.settings import Clock, GroupSettings
from broker.sync import Promise
from metadata import topics
from metadata.keys import Subspace
from metadata.kv import KV

if TYPE_CHECKING:
    from broker.groups.consumer_coordinator import ConsumerGroups, LoadedConsumerGroup

A = TypeVar("A")
TopicResolver = Callable[[str], Awaitable[topics.Topic | None]]


class CoordinatorError(Exception):
    def __init__(self, error: ErrorCode) -> None:
        super().__init__(error.name)
        self.error = error


@dataclass(frozen=True, slots=True)
class LoadedMember:
    """A member as this agent holds it: its state, and its parked JoinGroup requests."""

    member: Member
    joins: tuple[Promise[JoinResult], ...]

    @property
    def superseded_joins(self) -> tuple[Promise[JoinResult], ...]:
        """Earlier JoinGroup requests of the member, answered with the newest one."""
        return self.joins[:-1]


@dataclass(eq=False, slots=True)
class LoadedGroup:
    group: ClassicGroup
    revision: int | None = None  # of the group record in the store; None: never written
    joins: dict[str, list[Promise[JoinResult]]] = field(default_factory=dict)
    syncs: dict[str, list[Promise[SyncResult]]] = field(default_factory=dict)

    def answer_joins(self, member_id: str, result: JoinResult) -> None:
        for promise in self.joins.pop(member_id, ()):
            if not promise.done():
                promise.set(result)

    def answer_syncs(self, member_id: str, result: SyncResult) -> None:
        for promise in self.syncs.pop(member_id, ()):
            if not promise.done():
                promise.set(result)

    def fail_parked(self, error: ErrorCode) -> None:
        """Answer every parked request `error` (the group is given up)."""
        for member_id in list(self.joins):
            self.answer_joins(member_id, JoinResult(error, member_id=member_id))
        for member_id in list(self.syncs):
            self.answer_syncs(member_id, SyncResult(error))

    # What tests and logs look at: the group's state, with each member's parked joins.

    @property
    def state(self) -> GroupState:
        return self.group.state

    @property
    def generation(self) -> int:
        return self.group.generation

    @property
    def leader_id(self) -> str | None:
        return self.group.leader_id

    @property
    def pending_sync(self) -> frozenset[str]:
        return self.group.pending_sync

    @property
    def awaiting_join_count(self) -> int:
        return self.group.awaiting_join_count

    @property
    def members(self) -> dict[str, LoadedMember]:
        return {
            member_id: LoadedMember(member, tuple(self.joins.get(member_id, ())))
            for member_id, member in self.group.members.items()
        }


@dataclass(eq=False, slots=True)
class GroupSlot:
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    loaded: LoadedGroup | None = None  # a classic group
    consumer: LoadedConsumerGroup | None = None  # a consumer-protocol group (never both)


class CoordinatorShell(Protocol):
    kv: KV
    sub: Subspace
    settings: GroupSettings
    placement: Placement
    clock: Clock
    machine: ClassicGroupMachine
    consumers: ConsumerGroups

    def locked(
        self, group_id: str, *, claim: bool = True
    ) -> AbstractAsyncContextManager[GroupSlot]: ...

    async def claim(self, slot: GroupSlot, group_id: str, *, load: bool = True) -> None: ...

    def slots(self) -> Iterable[tuple[str, GroupSlot]]: ...

    async def apply(
        self, slot: GroupSlot, transition: Transition[A], request: Promise[A] | None = None
    ) -> None: ...

    def forget(self, slot: GroupSlot) -> None: ...
