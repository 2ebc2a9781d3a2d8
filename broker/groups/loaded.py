"""What the coordinator holds for each group, and what its offsets and admin parts may use.

A group's slot is its lock and, while this agent coordinates the group, the group loaded
from the store. `CoordinatorShell` is the coordinator as `offsets` and `admin` see it:
the stores, the settings, the locked and claimed slots, and the timers of a group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from kio.schema.errors import ErrorCode

from broker.groups.classic import ClassicGroup, Member
from broker.groups.placement import Placement
from broker.groups.settings import Clock, GroupSettings
from metadata.keys import Subspace
from metadata.kv import KV

TopicResolver = Callable[[str], Awaitable[Any]]  # topic name -> Topic (or None)


class CoordinatorError(Exception):
    def __init__(self, error: ErrorCode) -> None:
        super().__init__(error.name)
        self.error = error


@dataclass(eq=False, slots=True)
class GroupSlot:
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    group: ClassicGroup | None = None


class CoordinatorShell(Protocol):
    kv: KV
    sub: Subspace
    settings: GroupSettings
    placement: Placement
    clock: Clock

    def locked(
        self, group_id: str, *, claim: bool = True
    ) -> AbstractAsyncContextManager[GroupSlot]: ...

    async def claim(self, slot: GroupSlot, group_id: str, *, load: bool = True) -> None: ...

    def slots(self) -> Iterable[tuple[str, GroupSlot]]: ...

    def forget(self, slot: GroupSlot) -> None: ...

    def reschedule_heartbeat(self, group: ClassicGroup, member: Member) -> None: ...
