"""The coordinator's part for consumer-protocol groups (KIP-848): the shell that runs the
consumer group machine (`consumer_machine`) beside the classic one.

It shares everything with the classic shell (`coordinator`): the group's slot and lock,
the placement that says which agent coordinates a group, the timer, and the unloading of a
group whose write was fenced or whose store failed. A slot holds a classic group or a
consumer group, never both. Rules:

* a group id is either classic or consumer: a ConsumerGroupHeartbeat to a classic group
  with members is GROUP_ID_NOT_FOUND ("Group G is not a consumer group."), a JoinGroup to
  a consumer group with members is INCONSISTENT_GROUP_PROTOCOL; an Empty group of either
  kind is taken over by the other, its committed offsets kept (one transaction for a
  consumer group replacing a classic one);
* every `Persist` is one transaction fenced by the group's revision, written before the
  heartbeat that caused it is answered, so an epoch or an assignment is only handed out
  once stored; a coordinator that takes a group over loads it (`Load`): its members keep
  their epochs and assignments, and their sessions start again;
* the topics given to the machine are every topic that exists, read at most once a
  second: a regex subscription picks up a topic created since, a grown topic gets a new
  target assignment, on the next heartbeat of any member;
* OffsetCommit with a member is accepted at the member's current epoch only
  (STALE_MEMBER_EPOCH otherwise, UNKNOWN_MEMBER_ID for a member the group does not have,
  UNSUPPORTED_VERSION below v9); epoch -1 without a member commits to an Empty group.
  OffsetFetch with a member id checks it the same way. Apache Kafka's rules
  (`ConsumerGroup.validateOffsetCommit`, `validateOffsetFetch`).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kio.schema.errors import ErrorCode

from broker.groups import consumer as values
from broker.groups.actions import (
    CancelTimeout,
    CancelTimeouts,
    Persist,
    Respond,
    ScheduleTimeout,
)
from broker.groups.classic import GroupState
from broker.groups.consumer_machine import (
    ConsumerGroupMachine,
    Heartbeat,
    HeartbeatAnswer,
    HeartbeatRequest,
    Load,
    Timeout,
    Transition,
    check_heartbeat,
)
from broker.groups.loaded import CoordinatorError, GroupSlot
from broker.groups.settings import ConsumerGroupSettings
from broker.sync import Promise
from metadata import consumer_groups as stored_layer
from metadata import topics as topics_layer
from metadata.groups import OffsetToCommit

if TYPE_CHECKING:
    from broker.groups.coordinator import GroupCoordinator

logger = logging.getLogger(__name__)

A = TypeVar("A")
TOPICS_CACHE_SECONDS = 1.0
TopicsSource = Callable[[], Awaitable[values.TopicsByName]]


@dataclass(eq=False, slots=True)
class LoadedConsumerGroup:
    group: values.ConsumerGroup
    revision: int | None = None  # of the group record in the store; None: never written
    written: stored_layer.StoredConsumerGroup | None = None  # the form last written


def new_member_id() -> str:
    """A member id as Apache Kafka makes one (a random UUID in URL-safe base64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _is_consumer_key(group_id: str, key: object) -> bool:
    return (
        isinstance(key, tuple)
        and len(key) == 2
        and key[0] == group_id
        and isinstance(key[1], tuple)
        and str(key[1][0]).startswith("consumer-")
    )


class ConsumerGroups:
    def __init__(
        self,
        shell: GroupCoordinator,
        settings: ConsumerGroupSettings,
        topics: TopicsSource | None = None,
        topics_cache_seconds: float = TOPICS_CACHE_SECONDS,
    ) -> None:
        self.shell = shell
        self.topics_cache_seconds = topics_cache_seconds
        self.settings = settings
        self.machine = ConsumerGroupMachine(settings)
        self._topics_source = topics or self._stored_topics
        self._topics: values.TopicsByName = {}
        self._topics_at = -1.0

    async def _stored_topics(self) -> values.TopicsByName:
        shell = self.shell
        listed = await shell.kv.read(lambda tr: topics_layer.list_topics(tr, shell.sub))
        return {t.name: (t.topic_id, t.partitions) for t in listed}

    async def topics(self) -> values.TopicsByName:
        """Every topic that exists, name -> (topic id, partitions), at most a second old."""
        now = time.monotonic()
        if now - self._topics_at >= self.topics_cache_seconds:
            self._topics = await self._topics_source()
            self._topics_at = now
        return self._topics

    def topic_names(self) -> dict[bytes, str]:
        return {topic_id: name for name, (topic_id, _n) in self._topics.items()}

    # -- loading and unloading -----------------------------------------------------------

    def load(self, slot: GroupSlot, stored: stored_layer.StoredConsumerGroup) -> None:
        transition = self.machine.handle(None, Load(stored), self.shell.clock.now_ms())
        assert transition.group is not None
        slot.consumer = LoadedConsumerGroup(transition.group, stored.revision, stored)
        loaded = slot.consumer
        for action in transition.actions:
            if isinstance(action, ScheduleTimeout):
                self._schedule(loaded, action.timeout, action.delay_ms)

    def unload(self, slot: GroupSlot) -> None:
        loaded = slot.consumer
        if loaded is None:
            return
        slot.consumer = None
        group_id = loaded.group.group_id
        self.shell.timer.cancel_matching(lambda key: _is_consumer_key(group_id, key))

    # -- running transitions -------------------------------------------------------------

    async def apply(
        self,
        slot: GroupSlot,
        transition: Transition[A],
        request: Promise[A] | None = None,
        *,
        replacing_classic: int | None = None,
    ) -> None:
        """Run a transition's actions in order. `replacing_classic`: the revision of the
        Empty classic group the first write replaces."""
        group = transition.group
        loaded = slot.consumer
        group_id = group.group_id if group is not None else loaded.group.group_id if loaded else ""
        if group is None:
            self.unload(slot)
        elif loaded is None:
            loaded = slot.consumer = LoadedConsumerGroup(group)
        else:
            loaded.group = group
        for action in transition.actions:
            if isinstance(action, Respond):
                if request is not None:
                    request.set(action.answer)
            elif isinstance(action, Persist):
                assert loaded is not None
                await self._persist(slot, loaded, action.group, replacing_classic)
                replacing_classic = None
            elif isinstance(action, ScheduleTimeout):
                assert loaded is not None
                self._schedule(loaded, action.timeout, action.delay_ms)
            elif isinstance(action, CancelTimeout):
                self.shell.timer.cancel((group_id, action.key))
            elif isinstance(action, CancelTimeouts):
                self.shell.timer.cancel_matching(lambda key: _is_consumer_key(group_id, key))

    async def _persist(
        self,
        slot: GroupSlot,
        loaded: LoadedConsumerGroup,
        group: stored_layer.StoredConsumerGroup,
        replacing_classic: int | None,
    ) -> None:
        shell = self.shell
        expected, previous = loaded.revision, loaded.written
        if replacing_classic is not None:
            loaded.revision = await shell.kv.transact(
                lambda tr: stored_layer.take_over_classic(
                    tr, shell.sub, group, classic_revision=replacing_classic
                )
            )
            logger.info("consumer group %r takes over the empty classic group", group.group_id)
        else:
            loaded.revision = await shell.kv.transact(
                lambda tr: stored_layer.put_consumer_group(
                    tr, shell.sub, group, expected_revision=expected, previous=previous
                )
            )
        loaded.written = group
        if slot.loaded is not None:
            shell.forget(slot)  # the classic group replaced, in memory too

    def _schedule(self, loaded: LoadedConsumerGroup, timeout: Timeout, delay_ms: int) -> None:
        """Hand `timeout` back to the machine when it is due, if the group is still loaded."""
        shell = self.shell
        group_id = loaded.group.group_id

        async def fire() -> None:
            slot = shell.slot(group_id)
            if slot is None or slot.consumer is not loaded:
                return
            try:
                async with shell.locked(group_id, claim=False) as slot:
                    if slot.consumer is loaded:
                        now = shell.clock.now_ms()
                        await self.apply(slot, self.machine.handle(loaded.group, timeout, now))
            except CoordinatorError:
                pass

        shell.schedule((group_id, timeout.key), delay_ms, fire)

    # -- ConsumerGroupHeartbeat ----------------------------------------------------------

    async def heartbeat(
        self, req: HeartbeatRequest, client_id: str, client_host: str, api_version: int
    ) -> HeartbeatAnswer:
        refused = check_heartbeat(req, api_version, self.settings)
        if refused is not None:
            return HeartbeatAnswer(refused.error, refused.message)
        new_id = new_member_id() if not req.member_id and req.member_epoch == 0 else ""
        answer: Promise[HeartbeatAnswer] = Promise()
        try:
            topics = await self.topics()
            async with self.shell.locked(req.group_id) as slot:
                classic = slot.loaded
                replacing = None
                if classic is not None:
                    if classic.group.state is not GroupState.EMPTY or classic.group.pending_join:
                        return HeartbeatAnswer(
                            ErrorCode.group_id_not_found,
                            f"Group {req.group_id} is not a consumer group.",
                        )
                    replacing = classic.revision
                group = None if slot.consumer is None else slot.consumer.group
                event = Heartbeat(req, topics, client_id, client_host, new_id, api_version)
                transition = self.machine.handle(group, event, self.shell.clock.now_ms())
                if replacing is None and classic is not None and transition.group is not None:
                    self.shell.forget(slot)  # an Empty classic group never written
                await self.apply(slot, transition, answer, replacing_classic=replacing)
        except CoordinatorError as exc:
            if answer.done():
                return await answer.wait()
            return HeartbeatAnswer(exc.error)
        return await answer.wait()

    # -- JoinGroup to this group id ------------------------------------------------------

    async def yield_to_classic(self, slot: GroupSlot) -> ErrorCode:
        """Before a JoinGroup: INCONSISTENT_GROUP_PROTOCOL while a consumer group with
        members has the id; an Empty one is deleted (its offsets kept)."""
        loaded = slot.consumer
        if loaded is None:
            return ErrorCode.none
        if loaded.group.members:
            return ErrorCode.inconsistent_group_protocol
        if loaded.revision is not None:
            shell = self.shell
            revision = loaded.revision
            group_id = loaded.group.group_id
            await shell.kv.transact(
                lambda tr: stored_layer.drop_consumer_group(
                    tr, shell.sub, group_id, expected_revision=revision
                )
            )
            logger.info("classic group takes over the empty consumer group %r", group_id)
        self.unload(slot)
        return ErrorCode.none

    # -- offsets -------------------------------------------------------------------------

    @staticmethod
    def check_commit(
        loaded: LoadedConsumerGroup, member_id: str, member_epoch: int, api_version: int
    ) -> ErrorCode:
        group = loaded.group
        if member_epoch < 0 and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if api_version < 9:
            return ErrorCode.unsupported_version
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    @staticmethod
    def check_fetch(loaded: LoadedConsumerGroup, member_id: str | None, epoch: int) -> ErrorCode:
        if member_id is None and epoch < 0:
            return ErrorCode.none
        member = loaded.group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    async def commit(
        self,
        loaded: LoadedConsumerGroup,
        offsets: list[OffsetToCommit],
        retention_ms: int,
    ) -> None:
        shell = self.shell
        group_id = loaded.group.group_id
        revision = loaded.revision
        if revision is None:
            raise CoordinatorError(ErrorCode.coordinator_not_available)
        now = shell.clock.now_ms()
        expire = now + retention_ms if retention_ms >= 0 else None
        await shell.kv.transact(
            lambda tr: stored_layer.commit_offsets(
                tr,
                shell.sub,
                group_id,
                offsets,
                expected_revision=revision,
                now_ms=now,
                expire_timestamp_ms=expire,
            )
        )

    # -- admin ---------------------------------------------------------------------------

    async def describe(self, group_id: str, version: int) -> values.DescribedGroup:
        """ConsumerGroupDescribe of one group: GROUP_ID_NOT_FOUND for a classic group."""
        await self.topics()
        default = self.settings.assignors[0]
        try:
            async with self.shell.locked(group_id) as slot:
                if slot.loaded is not None and slot.consumer is None:
                    return values.describe_not_consumer(group_id, version)
                group = None if slot.consumer is None else slot.consumer.group
                return values.describe(group, group_id, self.topic_names(), default, version)
        except CoordinatorError as exc:
            return values.describe_error(group_id, exc.error, version)

    async def delete(self, slot: GroupSlot) -> ErrorCode:
        """DeleteGroups of a consumer group: only when Empty, with its offsets."""
        loaded = slot.consumer
        assert loaded is not None
        if loaded.group.members:
            return ErrorCode.non_empty_group
        shell = self.shell
        group_id = loaded.group.group_id
        revision = loaded.revision
        if revision is not None:
            await shell.kv.transact(
                lambda tr: stored_layer.delete_consumer_group_and_offsets(
                    tr, shell.sub, group_id, expected_revision=revision
                )
            )
        logger.info("deleted consumer group %r and its committed offsets", group_id)
        self.unload(slot)
        return ErrorCode.none
