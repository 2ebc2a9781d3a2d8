"""The group coordinator of one agent: classic groups' live state machines and timers.

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
loaded again from the store by the next request.

A loaded group is Empty, or Stable with the stored members and assignments (members keep
heartbeating with the stored generation); if the store says a rebalance was under way,
a rebalance starts at once and members that do not rejoin in time are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from broker.groups.admin import DescribedGroup, GroupAdmin, ListedGroup
from broker.groups.classic import (
    ClassicGroup,
    GroupState,
    JoinRequest,
    JoinResult,
    Member,
    SyncRequest,
    SyncResult,
)
from broker.groups.loaded import CoordinatorError, GroupSlot, TopicResolver
from broker.groups.offsets import GroupOffsets, PartitionCommit
from broker.groups.placement import Placement
from broker.groups.settings import Clock, GroupSettings
from broker.groups.timer import Timer
from broker.sync import Promise
from metadata import groups as store
from metadata.keys import Subspace
from metadata.kv import KV, KVError

__all__ = [
    "Clock",
    "CoordinatorError",
    "GroupCoordinator",
    "GroupSettings",
    "JoinRequest",
    "PartitionCommit",
    "SyncRequest",
]

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)
OWNERSHIP_CHECK_SECONDS = 1.0
MAX_TIMER_SLEEP_SECONDS = 1.0


class GroupCoordinator:
    def __init__(
        self,
        kv: KV,
        sub: Subspace,
        settings: GroupSettings,
        placement: Placement,
        clock: Clock | None = None,
    ) -> None:
        self.kv = kv
        self.sub = sub
        self.settings = settings
        self.placement = placement
        self.clock = clock or Clock()
        self.timer = Timer()
        self._slots: dict[str, GroupSlot] = {}
        self._wake = anyio.Event()
        self.offsets = GroupOffsets(self)
        self.admin = GroupAdmin(self)

    @classmethod
    def for_agent(cls, agent: Any) -> GroupCoordinator:
        from broker.groups.placement import AgentPlacement

        return cls(
            agent.kv, agent.sub, GroupSettings.from_config(agent.config), AgentPlacement(agent)
        )

    # -- plumbing ------------------------------------------------------------------------

    def loaded_group(self, group_id: str) -> ClassicGroup | None:
        slot = self._slots.get(group_id)
        return None if slot is None else slot.group

    def slots(self) -> Iterable[tuple[str, GroupSlot]]:
        return self._slots.items()

    def forget(self, slot: GroupSlot) -> None:
        """Drop a group deleted from the store."""
        group = slot.group
        if group is None:
            return
        group.transition_to(DEAD, self.clock.now_ms())
        self._cancel_group_timers(group.group_id)
        slot.group = None

    async def _owns(self, group_id: str) -> bool:
        await self.placement.refresh()
        if self.placement.is_local(group_id):
            return True
        # FindCoordinator reads the live agents afresh; so does a "no" here, else a client
        # sent here just after the agents changed would be sent away again.
        await self.placement.refresh(fresh=True)
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
            group = slot.group
            if group is not None and group.dirty and group.state is not DEAD:
                await self._persist(group)
        except store.GroupFenced as exc:
            log.warning("giving up group %r: %s", group_id, exc.message)
            self._unload(slot, ErrorCode.not_coordinator)
            raise CoordinatorError(ErrorCode.not_coordinator) from None
        except KVError:
            log.exception("metadata store failure for group %r", group_id)
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
        if slot.group is None and load:
            slot.group = await self._load(group_id)

    def _unload(self, slot: GroupSlot, error: ErrorCode) -> None:
        group = slot.group
        if group is None:
            return
        slot.group = None
        group.fail_all_waiters(error)
        group.state = DEAD
        self._cancel_group_timers(group.group_id)

    def _cancel_group_timers(self, group_id: str) -> None:
        self.timer.cancel_matching(lambda key: isinstance(key, tuple) and key[1] == group_id)

    async def _load(self, group_id: str) -> ClassicGroup | None:
        stored = await self.kv.read(lambda tr: store.get_group(tr, self.sub, group_id))
        if stored is None:
            return None
        group = ClassicGroup.from_stored(stored)
        log.info(
            "loaded group %r generation %d with %d members (%s)",
            group_id,
            group.generation,
            len(group.members),
            stored.state,
        )
        for member in group.members.values():
            self.reschedule_heartbeat(group, member)
        if group.members and stored.state != store.STABLE:
            await self._prepare_rebalance(group, f"loaded in state {stored.state}")
        return group

    async def _persist(
        self,
        group: ClassicGroup,
        *,
        state: GroupState | None = None,
        assignments: dict[str, bytes] | None = None,
    ) -> None:
        stored = group.to_stored(state=state, assignments=assignments)
        expected = group.revision
        group.revision = await self.kv.transact(
            lambda tr: store.put_group(tr, self.sub, stored, expected_revision=expected)
        )
        group.dirty = False

    def _schedule(
        self, key: Hashable, delay_ms: int, callback: Callable[[], Awaitable[None]]
    ) -> None:
        self.timer.schedule(key, self.clock.monotonic_ms() + delay_ms, callback)
        self._wake.set()

    def _timer_callback(
        self, group: ClassicGroup, action: Callable[[ClassicGroup], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        """A callback that runs `action` under the group's lock if the group is still loaded."""
        group_id = group.group_id

        async def fire() -> None:
            slot = self._slots.get(group_id)
            if slot is None or slot.group is not group:
                return
            try:
                async with self.locked(group_id, claim=False) as slot:
                    if slot.group is group and group.state is not DEAD:
                        await action(group)
            except CoordinatorError:
                pass

        return fire

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
            log.exception("group coordinator timer failed")

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
                log.exception("group ownership check failed")

    async def check_ownership(self) -> None:
        """Unload the groups another agent coordinates now."""
        await self.placement.refresh()
        for group_id, slot in list(self._slots.items()):
            if slot.group is not None and not self.placement.is_local(group_id):
                async with slot.lock:
                    if slot.group is not None:
                        log.info("group %r is coordinated by another agent now", group_id)
                        self._unload(slot, ErrorCode.not_coordinator)
            if slot.group is None and not slot.lock.locked():
                self._slots.pop(group_id, None)

    # -- timers --------------------------------------------------------------------------

    def reschedule_heartbeat(
        self, group: ClassicGroup, member: Member, timeout_ms: int | None = None
    ) -> None:
        member_id = member.member_id
        self._schedule(
            ("heartbeat", group.group_id, member_id),
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            self._timer_callback(group, lambda g: self._heartbeat_expired(g, member_id)),
        )

    def _schedule_pending_heartbeat(
        self, group: ClassicGroup, member_id: str, timeout_ms: int
    ) -> None:
        self._schedule(
            ("heartbeat", group.group_id, member_id),
            timeout_ms,
            self._timer_callback(group, lambda g: self._heartbeat_expired(g, member_id)),
        )

    def _cancel_heartbeat(self, group: ClassicGroup, member_id: str) -> None:
        self.timer.cancel(("heartbeat", group.group_id, member_id))

    async def _heartbeat_expired(self, group: ClassicGroup, member_id: str) -> None:
        if member_id in group.pending_join:
            log.info("pending member %s of group %r expired", member_id, group.group_id)
            group.remove(member_id)
            if group.state is PREPARING and group.has_all_members_joined():
                await self._complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        log.info("member %s of group %r failed its session, removing it", member_id, group.group_id)
        await self._remove_member_and_update(group, member)

    # -- the state machine ---------------------------------------------------------------

    async def _remove_member_and_update(self, group: ClassicGroup, member: Member) -> None:
        self._drop_member(group, member)
        if group.state in (STABLE, COMPLETING):
            await self._maybe_prepare_rebalance_or_complete_join(group, "member removed")
        elif group.state is PREPARING and group.has_all_members_joined():
            await self._complete_join(group)

    def _drop_member(self, group: ClassicGroup, member: Member) -> None:
        """Remove a member, answering its parked requests UNKNOWN_MEMBER_ID."""
        self._cancel_heartbeat(group, member.member_id)
        unknown = ErrorCode.unknown_member_id
        group.complete_join(member, JoinResult(unknown))
        group.complete_sync(member, SyncResult(unknown))
        group.remove(member.member_id)
        group.dirty = True

    async def _maybe_prepare_rebalance_or_complete_join(
        self, group: ClassicGroup, reason: str
    ) -> None:
        if group.can_rebalance():
            await self._prepare_rebalance(group, reason)
        else:
            await self._maybe_complete_join_phase(group)

    async def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.state is COMPLETING:
            for member in group.members.values():
                member.assignment = b""
            self._propagate_assignment(group, ErrorCode.rebalance_in_progress)
        group.pending_sync.clear()
        self.timer.cancel(("sync", group.group_id))
        initial = group.state is EMPTY
        if initial:
            delay = self.settings.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_initial_join(group, delay, remaining)
        log.info(
            "preparing to rebalance group %r in state %s with old generation %d (%s)",
            group.group_id,
            group.state,
            group.generation,
            reason,
        )
        group.transition_to(PREPARING, self.clock.now_ms())
        if not initial:
            await self._maybe_complete_join_else_schedule(group)

    def _schedule_initial_join(self, group: ClassicGroup, delay_ms: int, remaining_ms: int) -> None:
        self._schedule(
            ("join", group.group_id),
            delay_ms,
            self._timer_callback(
                group, lambda g: self._try_complete_initial_rebalance(g, delay_ms, remaining_ms)
            ),
        )

    async def _try_complete_initial_rebalance(
        self, group: ClassicGroup, delay_ms: int, remaining_ms: int
    ) -> None:
        if group.new_member_added and remaining_ms != 0:
            # A member joined during the delay: wait once more, within the rebalance timeout.
            group.new_member_added = False
            new_delay = min(self.settings.initial_rebalance_delay_ms, remaining_ms)
            self._schedule_initial_join(group, new_delay, max(remaining_ms - delay_ms, 0))
        else:
            await self._complete_join(group)

    async def _maybe_complete_join_else_schedule(self, group: ClassicGroup) -> None:
        if group.has_all_members_joined():
            await self._complete_join(group)
        else:
            self._schedule_join_completion(group)

    def _schedule_join_completion(self, group: ClassicGroup) -> None:
        self._schedule(
            ("join", group.group_id),
            group.rebalance_timeout_ms(),
            self._timer_callback(group, self._complete_join),
        )

    async def _maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        if group.state is not PREPARING:
            return
        if group.previous_state is EMPTY:
            return  # the initial rebalance waits for its delay
        if group.has_all_members_joined():
            await self._complete_join(group)

    async def _complete_join(self, group: ClassicGroup) -> None:
        if group.state is not PREPARING:
            return
        self.timer.cancel(("join", group.group_id))
        gone = [m for m in group.not_yet_rejoined() if m.group_instance_id is None]
        for member in gone:
            self._cancel_heartbeat(group, member.member_id)
            group.remove(member.member_id)
            group.dirty = True
        if gone:
            log.info(
                "group %r removed members that did not rejoin: %s",
                group.group_id,
                [m.member_id for m in gone],
            )
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait another rebalance timeout; sessions expire meanwhile.
            log.warning(
                "group %r could not complete a rebalance: no member rejoined", group.group_id
            )
            self._schedule_join_completion(group)
            return
        group.init_next_generation(self.clock.now_ms())
        await self._persist(group)
        if group.state is EMPTY:
            log.info("group %r with generation %d is now empty", group.group_id, group.generation)
            return
        log.info(
            "stabilized group %r generation %d (%s) with %d members",
            group.group_id,
            group.generation,
            group.protocol_name,
            len(group.members),
        )
        everyone = group.current_members()
        for member in list(group.members.values()):
            group.complete_join(
                member,
                JoinResult(
                    ErrorCode.none,
                    member_id=member.member_id,
                    generation=group.generation,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=group.leader_id or "",
                    members=everyone if group.is_leader(member.member_id) else (),
                ),
            )
            self.reschedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        generation = group.generation
        self._schedule(
            ("sync", group.group_id),
            group.rebalance_timeout_ms(),
            self._timer_callback(group, lambda g: self._expire_pending_sync(g, generation)),
        )

    async def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        if generation != group.generation or group.state not in (COMPLETING, STABLE):
            return
        if not group.pending_sync:
            return
        late = sorted(group.pending_sync)
        for member_id in late:
            member = group.members.get(member_id)
            if member is not None:
                self._drop_member(group, member)
        log.info("group %r removed members that did not sync in time: %s", group.group_id, late)
        await self._prepare_rebalance(group, "members did not send SyncGroup in time")

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error is ErrorCode.none
        for member in group.members.values():
            result = SyncResult(
                error,
                protocol_type=group.protocol_type if ok else None,
                protocol_name=group.protocol_name if ok else None,
                assignment=member.assignment,
            )
            if group.complete_sync(member, result):
                self.reschedule_heartbeat(group, member)

    async def _add_member_and_rebalance(
        self, group: ClassicGroup, req: JoinRequest, member_id: str, waiter: Promise[JoinResult]
    ) -> None:
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
            is_new=True,
        )
        if group.state is PREPARING and group.previous_state is EMPTY:
            group.new_member_added = True
        group.add(member, waiter)
        # A new member cannot heartbeat while its JoinGroup is parked; bound that wait.
        self.reschedule_heartbeat(group, member, self.settings.new_member_join_timeout_ms)
        await self._maybe_prepare_rebalance_or_complete_join(
            group, f"adding member {member_id} ({req.reason or 'no reason given'})"
        )

    async def _update_member_and_rebalance(
        self,
        group: ClassicGroup,
        member: Member,
        req: JoinRequest,
        waiter: Promise[JoinResult],
        reason: str,
    ) -> None:
        group.update_member(
            member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, waiter
        )
        await self._maybe_prepare_rebalance_or_complete_join(group, reason)

    def _current_generation_answer(
        self,
        group: ClassicGroup,
        member_id: str,
        *,
        with_members: bool,
        leader: str | None = None,
        skip_assignment: bool = False,
    ) -> JoinResult:
        return JoinResult(
            ErrorCode.none,
            member_id=member_id,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=(group.leader_id or "") if leader is None else leader,
            skip_assignment=skip_assignment,
            members=group.current_members() if with_members else (),
        )

    async def _update_static_member(
        self,
        group: ClassicGroup,
        req: JoinRequest,
        old_id: str,
        new_id: str,
        waiter: Promise[JoinResult],
    ) -> None:
        instance_id = req.group_instance_id
        assert instance_id is not None
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_id, new_id)
        self._cancel_heartbeat(group, old_id)
        self.reschedule_heartbeat(group, member)
        group.update_member(
            member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, waiter
        )
        if group.state is STABLE:
            if group.protocol_name == group.select_protocol():
                # Same protocol: the instance gets its old place back without a rebalance.
                log.info(
                    "static member %s of group %r rejoined as %s without a rebalance",
                    instance_id,
                    group.group_id,
                    new_id,
                )
                await self._persist(group)
                if req.supports_skip_assignment:
                    is_leader = group.is_leader(new_id)
                    answer = self._current_generation_answer(
                        group, new_id, with_members=is_leader, skip_assignment=is_leader
                    )
                else:
                    answer = self._current_generation_answer(
                        group, new_id, with_members=False, leader=current_leader
                    )
                group.complete_join(member, answer)
            else:
                await self._maybe_prepare_rebalance_or_complete_join(
                    group, f"static member {instance_id} rejoined with other protocols"
                )
        elif group.state is COMPLETING:
            # The leader may already be assigning to the old member id: start over.
            await self._prepare_rebalance(group, f"static member {instance_id} rejoined")
        else:
            await self._maybe_complete_join_phase(group)

    async def _join_new_member(
        self, group: ClassicGroup, req: JoinRequest, waiter: Promise[JoinResult]
    ) -> None:
        if not group.supports_protocols(req.protocol_type, (n for n, _m in req.protocols)):
            waiter.set(JoinResult(ErrorCode.inconsistent_group_protocol))
            return
        new_id = ClassicGroup.new_member_id(req.client_id, req.group_instance_id)
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                await self._update_static_member(group, req, existing, new_id, waiter)
            else:
                await self._add_member_and_rebalance(group, req, new_id, waiter)
        elif req.require_known_member_id:
            # JoinGroup v4+: hand out the id first; the member joins again with it.
            group.pending_join.add(new_id)
            self._schedule_pending_heartbeat(group, new_id, req.session_timeout_ms)
            waiter.set(JoinResult(ErrorCode.member_id_required, member_id=new_id))
        else:
            await self._add_member_and_rebalance(group, req, new_id, waiter)

    async def _join_existing_member(
        self, group: ClassicGroup, req: JoinRequest, waiter: Promise[JoinResult]
    ) -> None:
        member_id = req.member_id
        if not group.supports_protocols(req.protocol_type, (n for n, _m in req.protocols)):
            waiter.set(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
            return
        if member_id in group.pending_join:
            await self._add_member_and_rebalance(group, req, member_id, waiter)
            return
        error = group.validate_member(member_id, req.group_instance_id)
        if error is not None:
            waiter.set(JoinResult(error, member_id=member_id))
            return
        member = group.members[member_id]
        if group.state is PREPARING:
            await self._update_member_and_rebalance(
                group, member, req, waiter, f"member {member_id} joins during a rebalance"
            )
        elif group.state is COMPLETING:
            if member.matches(req.protocols):
                # It missed the JoinGroup answer: give it again.
                waiter.set(
                    self._current_generation_answer(
                        group, member_id, with_members=group.is_leader(member_id)
                    )
                )
            else:
                await self._update_member_and_rebalance(
                    group, member, req, waiter, f"member {member_id} changed its protocols"
                )
        elif group.state is STABLE:
            if group.is_leader(member_id):
                # The leader rejoins to rebalance for what the group cannot see (e.g. a
                # topic's partition count changed).
                await self._update_member_and_rebalance(
                    group, member, req, waiter, f"leader {member_id} rejoins"
                )
            elif not member.matches(req.protocols):
                await self._update_member_and_rebalance(
                    group, member, req, waiter, f"member {member_id} changed its protocols"
                )
            else:
                waiter.set(self._current_generation_answer(group, member_id, with_members=False))
        else:
            waiter.set(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))

    # -- the APIs ------------------------------------------------------------------------

    def _parked_deadline(self, timeout_ms: int) -> float:
        # A parked request is always answered by the group's own timers; this only guards
        # against a bug leaving it parked forever.
        return 2 * max(timeout_ms, 1) / 1000 + 30

    async def join(self, req: JoinRequest) -> JoinResult:
        if not req.group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id=req.member_id)
        s = self.settings
        if not s.min_session_timeout_ms <= req.session_timeout_ms <= s.max_session_timeout_ms:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=req.member_id)
        waiter: Promise[JoinResult] = Promise()
        try:
            async with self.locked(req.group_id) as slot:
                group = slot.group
                if group is None:
                    if req.member_id:
                        return JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id)
                    group = slot.group = ClassicGroup(req.group_id, self.clock.now_ms())
                if req.member_id:
                    await self._join_existing_member(group, req, waiter)
                else:
                    await self._join_new_member(group, req, waiter)
        except CoordinatorError as exc:
            if waiter.done():
                return await waiter.wait()
            return JoinResult(exc.error, member_id=req.member_id)
        with anyio.move_on_after(self._parked_deadline(req.rebalance_timeout_ms)):
            return await waiter.wait()
        return JoinResult(ErrorCode.rebalance_in_progress, member_id=req.member_id)

    async def sync(self, req: SyncRequest) -> SyncResult:
        if not req.group_id:
            return SyncResult(ErrorCode.invalid_group_id)
        waiter: Promise[SyncResult] = Promise()
        timeout_ms = 0
        try:
            async with self.locked(req.group_id) as slot:
                group = slot.group
                if group is None or group.state is EMPTY:
                    return SyncResult(ErrorCode.unknown_member_id)
                error = group.validate_member(req.member_id, req.group_instance_id)
                if error is None and req.generation != group.generation:
                    error = ErrorCode.illegal_generation
                if error is None and (
                    _inconsistent(req.protocol_type, group.protocol_type)
                    or _inconsistent(req.protocol_name, group.protocol_name)
                ):
                    error = ErrorCode.inconsistent_group_protocol
                if error is not None:
                    return SyncResult(error)
                member = group.members[req.member_id]
                if group.state is PREPARING:
                    return SyncResult(ErrorCode.rebalance_in_progress)
                if group.state is STABLE:
                    group.pending_sync.discard(req.member_id)
                    return SyncResult(
                        ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment
                    )
                # CompletingRebalance: park until the leader's assignment is stored.
                timeout_ms = group.rebalance_timeout_ms()
                member.await_sync(waiter)
                group.pending_sync.discard(req.member_id)
                if not group.pending_sync:
                    self.timer.cancel(("sync", group.group_id))
                if group.is_leader(req.member_id):
                    await self._store_assignment(group, dict(req.assignments))
        except CoordinatorError as exc:
            if waiter.done():
                return await waiter.wait()
            return SyncResult(exc.error)
        with anyio.move_on_after(self._parked_deadline(timeout_ms)):
            return await waiter.wait()
        return SyncResult(ErrorCode.rebalance_in_progress)

    async def _store_assignment(self, group: ClassicGroup, assignments: dict[str, bytes]) -> None:
        full = {m: assignments.get(m, b"") for m in group.members}
        missing = [m for m in group.members if m not in assignments]
        if missing:
            log.warning(
                "group %r generation %d: no assignment for %s, giving them an empty one",
                group.group_id,
                group.generation,
                missing,
            )
        await self._persist(group, state=STABLE, assignments=full)
        for member_id, member in group.members.items():
            member.assignment = full[member_id]
        group.transition_to(STABLE, self.clock.now_ms())
        self._propagate_assignment(group, ErrorCode.none)

    async def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        try:
            async with self.locked(group_id) as slot:
                group = slot.group
                if group is None:
                    return ErrorCode.unknown_member_id
                error = group.validate_member(member_id, instance_id)
                if error is not None:
                    return error
                if generation != group.generation:
                    return ErrorCode.illegal_generation
                if group.state is EMPTY:
                    return ErrorCode.unknown_member_id
                self.reschedule_heartbeat(group, group.members[member_id])
                if group.state is PREPARING:
                    return ErrorCode.rebalance_in_progress
                return ErrorCode.none
        except CoordinatorError as exc:
            return exc.error

    async def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """LeaveGroup: the top-level error and one (member id, instance id, error) each."""
        members = list(members)
        if not group_id:
            return ErrorCode.invalid_group_id, []
        answers: list[tuple[str, str | None, ErrorCode]] = []
        try:
            async with self.locked(group_id) as slot:
                group = slot.group
                if group is None:
                    unknown = ErrorCode.unknown_member_id
                    return ErrorCode.none, [(m, i, unknown) for m, i in members]
                left = False
                for member_id, instance_id in members:
                    error = self._leave_one(group, member_id, instance_id)
                    answers.append((member_id, instance_id, error or ErrorCode.none))
                    left = left or error is None
                if left:
                    if group.state in (STABLE, COMPLETING):
                        await self._maybe_prepare_rebalance_or_complete_join(
                            group, "members left the group"
                        )
                    elif group.state is PREPARING:
                        await self._maybe_complete_join_phase(group)
        except CoordinatorError as exc:
            return exc.error, []
        return ErrorCode.none, answers

    def _leave_one(
        self, group: ClassicGroup, member_id: str, instance_id: str | None
    ) -> ErrorCode | None:
        if not member_id:
            # Removal by group.instance.id alone (an admin removing a static member).
            existing = group.static_members.get(instance_id) if instance_id is not None else None
            if existing is None:
                return ErrorCode.unknown_member_id
            self._drop_member(group, group.members[existing])
            return None
        if member_id in group.pending_join:
            group.remove(member_id)
            self._cancel_heartbeat(group, member_id)
            return None
        error = group.validate_member(member_id, instance_id)
        if error is not None:
            return error
        log.info("member %s left group %r", member_id, group.group_id)
        self._drop_member(group, group.members[member_id])
        return None

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
    ) -> tuple[ErrorCode, dict[tuple[str, int], store.CommittedOffset], set[tuple[str, int]]]:
        return await self.offsets.fetch(group_id, partitions, require_stable=require_stable)

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


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
