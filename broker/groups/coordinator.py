"""The group coordinator of one agent: the shell that runs the classic group machine (and,
through `consumer_coordinator`, the consumer group machine of KIP-848 groups).

`classic_machine` decides every transition of a group and says what must happen; this
module does it: it owns the per-group locks, checks that this agent coordinates a group,
loads groups from the store and writes them back, keeps the timers and the promises of
parked requests, and runs the actions of each transition in order. Offsets and admin
requests are in `offsets` and `admin`.

Each group is coordinated by one live agent, chosen by `placement` (rendezvous hashing
over the live agents). A request about a group this agent does not coordinate is
answered NOT_COORDINATOR, and a group this agent stops coordinating (the live agents
changed) is unloaded: its parked requests are answered NOT_COORDINATOR and its clients
find the new coordinator, which loads the group from the metadata store.

Per group, operations run one at a time under the group's lock, as in Apache Kafka's
single-threaded coordinator shards. The lock is held while a transition is written to
the store, never while a JoinGroup or SyncGroup is parked.

What is written, each in one transaction fenced by the group's revision:

* join completion: the new generation, its protocol, leader and members (state
  CompletingRebalance, or Empty when nobody is left) -- so every generation number is
  claimed exactly once, by one coordinator;
* SyncGroup from the leader: the assignment (state Stable) before anyone gets it;
* a static member replaced without a rebalance: the new member id;
* a member removed (LeaveGroup, session expiry) outside a join completion: the members
  left, with state PreparingRebalance so that a coordinator that takes over rebalances.

A write that finds another revision than the one this agent last saw means another agent
coordinates the group too: this agent unloads it and answers NOT_COORDINATOR. Any other
failure while handling a group also unloads it (answering COORDINATOR_NOT_AVAILABLE for a
store failure), so the in-memory state never runs ahead of the store for long: it is
loaded again from the store by the next request. The actions after a failed one are not
run; whatever they would have answered is answered with the error.

A loaded group is Empty, or Stable with the stored members and assignments (members keep
heartbeating with the stored generation); if the store says a rebalance was under way,
a rebalance starts at once and members that do not rejoin in time are dropped.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar, cast

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from broker.groups.actions import (
    CancelTimeout,
    CancelTimeouts,
    Persist,
    Respond,
    ScheduleTimeout,
)
from broker.groups.admin import DescribedGroup, GroupAdmin, ListedGroup
from broker.groups.classic import (
    GroupState,
    JoinRequest,
    JoinResult,
    SyncRequest,
    SyncResult,
)
from broker.groups.classic_machine import (
    Action,
    AnswerJoin,
    AnswerSync,
    ClassicGroupMachine,
    Deleted,
    Heartbeat,
    JoinGroup,
    LeaveAnswer,
    LeaveGroup,
    Load,
    ParkJoin,
    ParkSync,
    SyncGroup,
    Timeout,
    Transition,
    Unload,
    check_join,
)
from broker.groups.consumer import DescribedGroup as DescribedConsumerGroup
from broker.groups.consumer_coordinator import ConsumerGroups, TopicsSource
from broker.groups.consumer_machine import HeartbeatAnswer, HeartbeatRequest
from broker.groups.loaded import (
    CoordinatorError,
    GroupSlot,
    LoadedGroup,
    TopicResolver,
)
from broker.groups.offsets import GroupOffsets, PartitionCommit
from broker.groups.placement import AgentPlacement, PlacedAgent, Placement
from broker.groups.settings import Clock, ConsumerGroupSettings, GroupConfig, GroupSettings
from broker.groups.timer import Timer
from broker.sync import Promise
from metadata import consumer_groups as consumer_layer
from metadata import groups as groups_layer
from metadata.keys import Subspace
from metadata.kv import KV, KVError, ReadTransaction

__all__ = [
    "Clock",
    "CoordinatorError",
    "GroupCoordinator",
    "GroupSettings",
    "JoinRequest",
    "PartitionCommit",
    "SyncRequest",
]

logger = logging.getLogger(__name__)

A = TypeVar("A")
DEAD = GroupState.DEAD
OWNERSHIP_CHECK_SECONDS = 1.0
MAX_TIMER_SLEEP_SECONDS = 1.0


class CoordinatingAgent(PlacedAgent, Protocol):
    """What the coordinator takes from its agent (`broker.agent.Agent`)."""

    @property
    def kv(self) -> KV: ...
    @property
    def sub(self) -> Subspace: ...
    @property
    def config(self) -> GroupConfig: ...
    @property
    def consumer_group_settings(self) -> ConsumerGroupSettings: ...


def new_member_id(client_id: str, instance_id: str | None) -> str:
    return f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"


def parked_deadline(timeout_ms: int) -> float:
    # A parked request is always answered by the group's own timers; this only guards
    # against a bug leaving it parked forever.
    return 2 * max(timeout_ms, 1) / 1000 + 30


class GroupCoordinator:
    def __init__(
        self,
        kv: KV,
        sub: Subspace,
        settings: GroupSettings,
        placement: Placement,
        clock: Clock | None = None,
        consumer_settings: ConsumerGroupSettings | None = None,
        topics: TopicsSource | None = None,
    ) -> None:
        self.kv = kv
        self.sub = sub
        self.settings = settings
        self.placement = placement
        self.clock = clock or Clock()
        self.machine = ClassicGroupMachine(settings)
        self.timer = Timer()
        self._slots: dict[str, GroupSlot] = {}
        self._wake = anyio.Event()
        self.offsets = GroupOffsets(self)
        self.admin = GroupAdmin(self)
        self.consumers = ConsumerGroups(self, consumer_settings or ConsumerGroupSettings(), topics)

    @classmethod
    def for_agent(cls, agent: CoordinatingAgent) -> GroupCoordinator:
        return cls(
            agent.kv,
            agent.sub,
            GroupSettings.from_config(agent.config),
            AgentPlacement(agent),
            consumer_settings=agent.consumer_group_settings,
        )

    # -- plumbing ------------------------------------------------------------------------

    def loaded_group(self, group_id: str) -> LoadedGroup | None:
        slot = self._slots.get(group_id)
        return None if slot is None else slot.loaded

    def slots(self) -> Iterable[tuple[str, GroupSlot]]:
        return self._slots.items()

    def slot(self, group_id: str) -> GroupSlot | None:
        return self._slots.get(group_id)

    async def _owns(self, group_id: str) -> bool:
        await self.placement.refresh(group_id)
        if self.placement.is_local(group_id):
            return True
        # FindCoordinator reads the live agents afresh; so does a "no" here, else a client
        # sent here just after the agents changed would be sent away again.
        await self.placement.refresh(group_id, fresh=True)
        return self.placement.is_local(group_id)

    @asynccontextmanager
    async def locked(self, group_id: str, *, claim: bool = True) -> AsyncIterator[GroupSlot]:
        """The group's slot, locked; with `claim`, checked to be ours and loaded.

        The lock is the first thing a request waits for: it is fair, so the requests of
        one connection, started in order, act on the group in order, as Kafka handles a
        connection's requests one after another. Failures unload the group (see module).
        """
        while True:
            slot = self._slots.setdefault(group_id, GroupSlot())
            await slot.lock.acquire()
            if self._slots.get(group_id) is slot:
                break
            slot.lock.release()  # the slot was dropped while this task waited for it
        try:
            if claim:
                await self.claim(slot, group_id)
            yield slot
        except groups_layer.GroupFenced as exc:
            logger.warning("giving up group %r: %s", group_id, exc.message)
            self._unload(slot, ErrorCode.not_coordinator)
            raise CoordinatorError(ErrorCode.not_coordinator) from None
        except KVError as exc:  # the store is unavailable: expected, the client retries
            logger.warning("metadata store failure for group %r: %s", group_id, exc)
            self._unload(slot, ErrorCode.coordinator_not_available)
            raise CoordinatorError(ErrorCode.coordinator_not_available) from None
        except CoordinatorError:
            raise
        except BaseException:
            self._unload(slot, ErrorCode.coordinator_not_available)
            raise
        finally:
            slot.lock.release()

    async def claim(self, slot: GroupSlot, group_id: str, *, load: bool = True) -> None:
        """NOT_COORDINATOR unless this agent coordinates the group; then load it."""
        if not await self._owns(group_id):
            self._unload(slot, ErrorCode.not_coordinator)
            raise CoordinatorError(ErrorCode.not_coordinator)
        if slot.loaded is None and slot.consumer is None and load:

            def read(
                tr: ReadTransaction,
            ) -> tuple[groups_layer.StoredGroup | None, consumer_layer.StoredConsumerGroup | None]:
                return (
                    groups_layer.get_group(tr, self.sub, group_id),
                    consumer_layer.get_consumer_group(tr, self.sub, group_id),
                )

            stored, consumer = await self.kv.read(read)
            if stored is not None:
                transition = self.machine.handle(None, Load(stored), self.clock.now_ms())
                assert transition.group is not None
                slot.loaded = LoadedGroup(transition.group, stored.revision)
                await self.apply(slot, transition)
            elif consumer is not None:
                self.consumers.load(slot, consumer)

    def _unload(self, slot: GroupSlot, error: ErrorCode) -> None:
        self.consumers.unload(slot)
        loaded = slot.loaded
        if loaded is None:
            return
        slot.loaded = None
        transition = self.machine.handle(loaded.group, Unload(error), self.clock.now_ms())
        for action in transition.actions:
            self._run_local(loaded, action)
        # A transition that failed half-way may have parked requests its state no longer
        # shows as parked: they get the error too.
        loaded.fail_parked(error)

    def forget(self, slot: GroupSlot) -> None:
        """Drop a group deleted from the store."""
        loaded = slot.loaded
        if loaded is None:
            return
        slot.loaded = None
        transition = self.machine.handle(loaded.group, Deleted(), self.clock.now_ms())
        for action in transition.actions:
            self._run_local(loaded, action)

    # -- running transitions -------------------------------------------------------------

    async def apply(
        self, slot: GroupSlot, transition: Transition[A], request: Promise[A] | None = None
    ) -> None:
        """Run a transition's actions in order; `request` is the request being handled.

        The slot holds the new state from the start: if an action fails, the group is
        unloaded (by `locked`) and the actions after it are not run.
        """
        group = transition.group
        loaded = slot.loaded
        if group is not None:
            if loaded is None:
                loaded = slot.loaded = LoadedGroup(group)
            else:
                loaded.group = group
        for action in transition.actions:
            if isinstance(action, Respond):
                assert request is not None, "a transition answered a request that is not there"
                request.set(action.answer)
            elif isinstance(action, Persist):
                assert loaded is not None
                await self._persist(loaded, action.group)
            elif isinstance(action, ParkJoin):
                # Only a JoinGroup transition parks a join: `request` is its promise.
                assert loaded is not None and request is not None
                joins = loaded.joins.setdefault(action.member_id, [])
                joins.append(cast(Promise[JoinResult], request))
            elif isinstance(action, ParkSync):
                assert loaded is not None and request is not None
                syncs = loaded.syncs.setdefault(action.member_id, [])
                syncs.append(cast(Promise[SyncResult], request))
            else:
                assert loaded is not None
                self._run_local(loaded, action)

    def _run_local(self, loaded: LoadedGroup, action: Action | Respond[None]) -> None:
        """An action without I/O: timers and answers to parked requests."""
        group_id = loaded.group.group_id
        if isinstance(action, ScheduleTimeout):
            self._schedule(loaded, action.timeout, action.delay_ms)
        elif isinstance(action, CancelTimeout):
            self.timer.cancel((group_id, action.key))
        elif isinstance(action, CancelTimeouts):
            self.timer.cancel_matching(lambda key: isinstance(key, tuple) and key[0] == group_id)
        elif isinstance(action, AnswerJoin):
            loaded.answer_joins(action.member_id, action.result)
        elif isinstance(action, AnswerSync):
            loaded.answer_syncs(action.member_id, action.result)
        else:
            raise AssertionError(f"{action!r} needs the store or a request")

    async def _persist(self, loaded: LoadedGroup, stored: groups_layer.StoredGroup) -> None:
        expected = loaded.revision
        loaded.revision = await self.kv.transact(
            lambda tr: groups_layer.put_group(tr, self.sub, stored, expected_revision=expected)
        )

    def schedule(
        self, key: tuple[str, object], delay_ms: int, fire: Callable[[], Awaitable[None]]
    ) -> None:
        """Run `fire` in `delay_ms` (replacing what was scheduled with the same key)."""
        self.timer.schedule(key, self.clock.monotonic_ms() + delay_ms, fire)
        self._wake.set()

    def _schedule(self, loaded: LoadedGroup, timeout: Timeout, delay_ms: int) -> None:
        """Hand `timeout` back to the machine when it is due, if the group is still loaded."""
        group_id = loaded.group.group_id

        async def fire() -> None:
            slot = self._slots.get(group_id)
            if slot is None or slot.loaded is not loaded:
                return
            try:
                async with self.locked(group_id, claim=False) as slot:
                    if slot.loaded is loaded and loaded.group.state is not DEAD:
                        now = self.clock.now_ms()
                        await self.apply(slot, self.machine.handle(loaded.group, timeout, now))
            except CoordinatorError:
                pass

        self.timer.schedule((group_id, timeout.key), self.clock.monotonic_ms() + delay_ms, fire)
        self._wake.set()

    # -- background ----------------------------------------------------------------------

    async def run(self) -> None:
        """The coordinator's loops: timers, ownership checks, offsets retention."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._timer_loop, tg)
            tg.start_soon(self._ownership_loop)
            tg.start_soon(self.offsets.run_retention)

    async def _timer_loop(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            self._wake = anyio.Event()
            now = self.clock.monotonic_ms()
            for callback in self.timer.pop_due(now):
                tg.start_soon(self._run_callback, callback)
            deadline = self.timer.next_deadline()
            sleep = MAX_TIMER_SLEEP_SECONDS
            if deadline is not None:
                sleep = min(sleep, max(0.0, (deadline - now) / 1000))
            with anyio.move_on_after(sleep):
                await self._wake.wait()

    @staticmethod
    async def _run_callback(callback: Callable[[], Awaitable[None]]) -> None:
        try:
            await callback()
        except Exception:
            logger.exception("group coordinator timer failed")

    async def run_due_timers(self) -> int:
        """Run every callback that is due now, one after another (for tests)."""
        callbacks = self.timer.pop_due(self.clock.monotonic_ms())
        for callback in callbacks:
            await self._run_callback(callback)
        return len(callbacks)

    async def _ownership_loop(self) -> None:
        while True:
            await anyio.sleep(OWNERSHIP_CHECK_SECONDS)
            try:
                await self.check_ownership()
            except Exception:
                logger.exception("group ownership check failed")

    async def check_ownership(self) -> None:
        """Unload the groups another agent coordinates now."""
        await self.placement.refresh(
            *(
                group_id
                for group_id, slot in self._slots.items()
                if slot.loaded is not None or slot.consumer is not None
            )
        )
        for group_id, slot in list(self._slots.items()):
            held = slot.loaded is not None or slot.consumer is not None
            if held and not self.placement.is_local(group_id):
                async with slot.lock:
                    if slot.loaded is not None or slot.consumer is not None:
                        logger.info("group %r is coordinated by another agent now", group_id)
                        self._unload(slot, ErrorCode.not_coordinator)
            if slot.loaded is None and slot.consumer is None and not slot.lock.locked():
                self._slots.pop(group_id, None)

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ---------------------------------------

    async def join(self, req: JoinRequest) -> JoinResult:
        early = check_join(req, self.settings)
        if early is not None:
            return early
        waiter: Promise[JoinResult] = Promise()
        new_id = "" if req.member_id else new_member_id(req.client_id, req.group_instance_id)
        try:
            async with self.locked(req.group_id) as slot:
                refused = await self.consumers.yield_to_classic(slot)
                if refused is not ErrorCode.none:
                    return JoinResult(refused, member_id=req.member_id)
                group = None if slot.loaded is None else slot.loaded.group
                event = JoinGroup(req, new_id)
                await self.apply(
                    slot, self.machine.handle(group, event, self.clock.now_ms()), waiter
                )
        except CoordinatorError as exc:
            if waiter.done():
                return await waiter.wait()
            return JoinResult(exc.error, member_id=req.member_id)
        with anyio.move_on_after(parked_deadline(req.rebalance_timeout_ms)):
            return await waiter.wait()
        return JoinResult(ErrorCode.rebalance_in_progress, member_id=req.member_id)

    async def sync(self, req: SyncRequest) -> SyncResult:
        if not req.group_id:
            return SyncResult(ErrorCode.invalid_group_id)
        waiter: Promise[SyncResult] = Promise()
        timeout_ms = 0
        try:
            async with self.locked(req.group_id) as slot:
                group = None if slot.loaded is None else slot.loaded.group
                if group is not None:
                    timeout_ms = group.rebalance_timeout_ms()
                event = SyncGroup(req)
                await self.apply(
                    slot, self.machine.handle(group, event, self.clock.now_ms()), waiter
                )
        except CoordinatorError as exc:
            if waiter.done():
                return await waiter.wait()
            return SyncResult(exc.error)
        with anyio.move_on_after(parked_deadline(timeout_ms)):
            return await waiter.wait()
        return SyncResult(ErrorCode.rebalance_in_progress)

    async def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        answer: Promise[ErrorCode] = Promise()
        try:
            async with self.locked(group_id) as slot:
                group = None if slot.loaded is None else slot.loaded.group
                event = Heartbeat(generation, member_id, instance_id)
                await self.apply(
                    slot, self.machine.handle(group, event, self.clock.now_ms()), answer
                )
        except CoordinatorError as exc:
            return exc.error
        return await answer.wait()

    async def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """LeaveGroup: the top-level error and one (member id, instance id, error) each."""
        members = list(members)
        if not group_id:
            return ErrorCode.invalid_group_id, []
        answer: Promise[LeaveAnswer] = Promise()
        try:
            async with self.locked(group_id) as slot:
                group = None if slot.loaded is None else slot.loaded.group
                event = LeaveGroup(tuple(members))
                await self.apply(
                    slot, self.machine.handle(group, event, self.clock.now_ms()), answer
                )
        except CoordinatorError as exc:
            return exc.error, []
        error, answers = await answer.wait()
        return error, list(answers)

    # -- ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848) ------------------------

    async def consumer_heartbeat(
        self, req: HeartbeatRequest, client_id: str, client_host: str, api_version: int
    ) -> HeartbeatAnswer:
        return await self.consumers.heartbeat(req, client_id, client_host, api_version)

    async def consumer_describe(self, group_id: str, version: int) -> DescribedConsumerGroup:
        return await self.consumers.describe(group_id, version)

    # -- offsets and admin ---------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        partitions: list[PartitionCommit],
        *,
        resolve_topic: TopicResolver,
        retention_ms: int = -1,
        api_version: int = 8,
    ) -> dict[tuple[str, int], ErrorCode]:
        return await self.offsets.commit(
            group_id, generation, member_id, instance_id, partitions,
            resolve_topic=resolve_topic, retention_ms=retention_ms, api_version=api_version,
        )  # fmt: skip

    async def fetch_offsets(
        self,
        group_id: str,
        partitions: dict[str, list[int]] | None,
        *,
        require_stable: bool = False,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> tuple[
        ErrorCode, dict[tuple[str, int], groups_layer.CommittedOffset], set[tuple[str, int]]
    ]:
        return await self.offsets.fetch(
            group_id,
            partitions,
            require_stable=require_stable,
            member_id=member_id,
            member_epoch=member_epoch,
        )

    async def expire_offsets(self) -> int:
        """One pass of offsets retention over the groups this agent coordinates."""
        return await self.offsets.expire()

    async def describe(self, group_id: str) -> DescribedGroup:
        return await self.admin.describe(group_id)

    async def list_groups(self) -> list[ListedGroup]:
        """The groups this agent coordinates (a client asks every agent and merges)."""
        return await self.admin.list_groups()

    async def delete_group(self, group_id: str) -> ErrorCode:
        return await self.admin.delete_group(group_id)

    async def delete_offsets(
        self,
        group_id: str,
        partitions: list[tuple[str, int]],
        *,
        resolve_topic: TopicResolver,
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete: a group error, or an error for every partition."""
        return await self.admin.delete_offsets(group_id, partitions, resolve_topic=resolve_topic)
