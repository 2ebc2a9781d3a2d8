"""Committed offsets of groups: OffsetCommit, OffsetFetch and offsets retention.

An OffsetCommit is checked against the loaded group (a member of the current generation,
or a simple commit with generation -1 to a group without members) and written in one
transaction that checks the stored generation again, so a coordinator that lost the group
cannot commit for a generation that is gone. Retention deletes expired offsets of the
groups this agent coordinates, and an Empty group with them (Apache Kafka's rules, in
`ClassicGroup.expiry_rule`; for consumer-protocol groups by commit time, except the
offsets of topics a member subscribes to).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from kio.schema.errors import ErrorCode

from broker.groups.classic import ClassicGroup, GroupState
from broker.groups.classic_machine import OffsetCommit
from broker.groups.loaded import (
    CoordinatorError,
    CoordinatorShell,
    GroupSlot,
    LoadedGroup,
    TopicResolver,
)
from broker.sync import Promise

if TYPE_CHECKING:
    from broker.groups.consumer_coordinator import LoadedConsumerGroup
from metadata import consumer_groups as consumer_layer
from metadata import groups as groups_layer
from metadata.kv import ReadTransaction

logger = logging.getLogger(__name__)

EMPTY, PREPARING, STABLE = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.STABLE,
)


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


class GroupOffsets:
    def __init__(self, shell: CoordinatorShell) -> None:
        self.shell = shell

    async def commit(
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
        """OffsetCommit: an error for every partition, placed as Apache Kafka places them.

        Partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION; if any partition is
        left, a group error (NOT_COORDINATOR included) goes to every partition; otherwise
        metadata over offset.metadata.max.bytes is OFFSET_METADATA_TOO_LARGE.
        """
        shell = self.shell
        answers: dict[tuple[str, int], ErrorCode] = {}
        try:
            async with shell.locked(group_id, claim=False) as slot:
                valid: list[groups_layer.OffsetToCommit] = []
                too_large: list[tuple[str, int]] = []
                max_bytes = shell.settings.offset_metadata_max_bytes
                for p in partitions:
                    topic = await resolve_topic(p.topic)
                    if topic is None or not 0 <= p.partition < topic.partitions:
                        answers[(p.topic, p.partition)] = ErrorCode.unknown_topic_or_partition
                    elif p.metadata is not None and len(p.metadata) > max_bytes:
                        too_large.append((p.topic, p.partition))
                    else:
                        valid.append(
                            groups_layer.OffsetToCommit(
                                p.topic,
                                topic.topic_id,
                                p.partition,
                                p.offset,
                                p.leader_epoch,
                                p.metadata or "",
                            )
                        )
                if not valid and not too_large:
                    return answers
                await shell.claim(slot, group_id)
                error = await self._commit(
                    slot, group_id, generation, member_id, instance_id, valid, retention_ms,
                    api_version,
                )  # fmt: skip
        except CoordinatorError as exc:
            error = exc.error
        if error is not ErrorCode.none:
            return {(p.topic, p.partition): error for p in partitions}
        answers.update({(o.topic, o.partition): ErrorCode.none for o in valid})
        answers.update({key: ErrorCode.offset_metadata_too_large for key in too_large})
        return answers

    async def _commit(
        self,
        slot: GroupSlot,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        offsets: list[groups_layer.OffsetToCommit],
        retention_ms: int,
        api_version: int,
    ) -> ErrorCode:
        shell = self.shell
        if slot.consumer is not None:
            consumer = slot.consumer
            error = shell.consumers.check_commit(consumer, member_id, generation, api_version)
            if error is ErrorCode.none and offsets:
                await shell.consumers.commit(consumer, offsets, retention_ms)
            return error
        loaded = slot.loaded
        if loaded is None:
            if generation >= 0:
                # v9+ says so plainly; older clients expect ILLEGAL_GENERATION.
                return (
                    ErrorCode.group_id_not_found
                    if api_version >= 9
                    else ErrorCode.illegal_generation
                )
            group = ClassicGroup(group_id, state_timestamp_ms=shell.clock.now_ms())
            loaded = slot.loaded = LoadedGroup(group)
        group = loaded.group
        checked: Promise[ErrorCode] = Promise()
        event = OffsetCommit(generation, member_id, instance_id)
        await shell.apply(slot, shell.machine.handle(group, event, shell.clock.now_ms()), checked)
        error = await checked.wait()
        if error is not ErrorCode.none or not offsets:
            return error
        simple = generation < 0 and group.state is EMPTY
        fence = None if simple else group.generation
        now = shell.clock.now_ms()
        expire = now + retention_ms if retention_ms >= 0 else None
        revision = await shell.kv.transact(
            lambda tr: groups_layer.commit_offsets(
                tr,
                shell.sub,
                group_id,
                offsets,
                generation=fence,
                now_ms=now,
                expire_timestamp_ms=expire,
            )
        )
        if loaded.revision is None:
            loaded.revision = revision
        return ErrorCode.none

    async def fetch(
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
        """OffsetFetch of some partitions (or all, None): the group error, the committed
        offsets, and -- when stable offsets are required -- the partitions an open
        transaction holds an offset for (of those asked for, or of those committed).
        A member id or epoch (v9) is checked against a consumer-protocol group's member."""
        shell = self.shell

        def read(
            tr: ReadTransaction,
        ) -> tuple[dict[tuple[str, int], groups_layer.CommittedOffset], set[tuple[str, int]]]:
            offsets = groups_layer.fetch_offsets(
                tr, shell.sub, group_id, None if partitions is None else list(partitions)
            )
            if not require_stable:
                return offsets, set()
            asked = (
                offsets.keys()
                if partitions is None
                else [(t, p) for t, ps in partitions.items() for p in ps]
            )
            return offsets, groups_layer.unstable_partitions(tr, shell.sub, group_id, asked)

        try:
            async with shell.locked(group_id, claim=False) as slot:
                member_given = member_id is not None or member_epoch >= 0
                await shell.claim(slot, group_id, load=member_given)
                if member_given and slot.consumer is not None:
                    error = shell.consumers.check_fetch(slot.consumer, member_id, member_epoch)
                    if error is not ErrorCode.none:
                        return error, {}, set()
                offsets, unstable = await shell.kv.read(read)
        except CoordinatorError as exc:
            return exc.error, {}, set()
        return ErrorCode.none, offsets, unstable

    async def run_retention(self) -> None:
        while True:
            await anyio.sleep(self.shell.settings.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire()
            except Exception:
                logger.exception("offsets retention failed")

    async def expire(self) -> int:
        """One pass of offsets retention over the groups this agent coordinates."""
        shell = self.shell
        stored, consumers = await shell.kv.read(
            lambda tr: (
                groups_layer.list_groups(tr, shell.sub),
                consumer_layer.list_consumer_groups(tr, shell.sub),
            )
        )
        await shell.placement.refresh(
            *(r.group_id for r in consumers), *(h.group_id for h in stored)
        )
        expired = 0
        for record in consumers:
            if not shell.placement.is_local(record.group_id):
                continue
            try:
                async with shell.locked(record.group_id) as slot:
                    if slot.consumer is not None:
                        expired += await self._expire_consumer_offsets(slot, slot.consumer)
            except CoordinatorError:
                continue
        for header in stored:
            if not shell.placement.is_local(header.group_id):
                continue
            try:
                async with shell.locked(header.group_id) as slot:
                    if slot.loaded is None:
                        continue
                    expired += await self._expire_group_offsets(slot, slot.loaded)
            except CoordinatorError:
                continue
        for _group_id, slot in list(shell.slots()):
            loaded = slot.loaded
            if loaded is not None and loaded.revision is None and loaded.group.state is EMPTY:
                if not loaded.group.pending_join and not slot.lock.locked():
                    slot.loaded = None  # created by a failed join and never written
        return expired

    async def _expire_consumer_offsets(self, slot: GroupSlot, loaded: LoadedConsumerGroup) -> int:
        """Apache Kafka's rule for consumer-protocol groups: an offset expires by its
        commit time, unless a member subscribes to its topic; an Empty group whose offsets
        are all gone is deleted."""
        shell = self.shell
        group = loaded.group
        rule = groups_layer.ExpiryRule(
            shell.settings.offsets_retention_ms,
            keep_topics=frozenset(group.subscription_metadata),
        )
        now = shell.clock.now_ms()
        revision = loaded.revision
        result = await shell.kv.transact(
            lambda tr: consumer_layer.expire_offsets(
                tr,
                shell.sub,
                group.group_id,
                rule,
                now_ms=now,
                expected_revision=revision,
                delete_group_when_empty=not group.members and revision is not None,
            )
        )
        if result.expired:
            logger.info("expired %d offsets of consumer group %r", result.expired, group.group_id)
        if result.group_deleted:
            logger.info("deleted empty consumer group %r: no offsets left", group.group_id)
            shell.consumers.unload(slot)
        return result.expired

    async def _expire_group_offsets(self, slot: GroupSlot, loaded: LoadedGroup) -> int:
        shell = self.shell
        group = loaded.group
        rule = group.expiry_rule(shell.settings.offsets_retention_ms)
        if rule is None:
            return 0
        now = shell.clock.now_ms()
        revision = loaded.revision
        delete_group = group.state is EMPTY
        result = await shell.kv.transact(
            lambda tr: groups_layer.expire_offsets(
                tr,
                shell.sub,
                group.group_id,
                rule,
                now_ms=now,
                expected_revision=revision,
                delete_group_when_empty=delete_group,
            )
        )
        if result.expired:
            logger.info("expired %d offsets of group %r", result.expired, group.group_id)
        if result.group_deleted:
            logger.info("deleted empty group %r: no offsets left", group.group_id)
            shell.forget(slot)
        return result.expired
