"""Groups for the admin client: DescribeGroups, ListGroups, DeleteGroups, OffsetDelete.

Each agent describes and lists only the groups it coordinates (a client asks every agent
and merges). A group is deleted only when Empty, with its committed offsets; a consumer
group with members keeps the offsets of topics it subscribes to.

Consumer-protocol groups (KIP-848) are listed with type "consumer", protocol type
"consumer" and their own states (Empty, Assigning, Reconciling, Stable). DescribeGroups
(v0-v5) describes one as Apache Kafka 4.x does at those versions: Dead, without error
(ConsumerGroupDescribe is the API that describes it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from broker.groups import consumer as consumer_values
from broker.groups.classic import CONSUMER_PROTOCOL_TYPE, GroupState
from broker.groups.loaded import CoordinatorError, CoordinatorShell, TopicResolver
from metadata import consumer_groups as consumer_layer
from metadata import groups as groups_layer

logger = logging.getLogger(__name__)

EMPTY, PREPARING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)
GROUP_TYPE = "classic"


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    state: str = str(DEAD)
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = GROUP_TYPE


def _stored_state_as_loaded(state: str, has_members: bool) -> str:
    if not has_members:
        return str(EMPTY)
    return str(STABLE) if state == str(STABLE) else str(PREPARING)


class GroupAdmin:
    def __init__(self, shell: CoordinatorShell) -> None:
        self.shell = shell

    async def describe(self, group_id: str) -> DescribedGroup:
        try:
            async with self.shell.locked(group_id) as slot:
                if slot.loaded is None:
                    return DescribedGroup(group_id, ErrorCode.none)
                group = slot.loaded.group
                stable = group.state is STABLE
                return DescribedGroup(
                    group_id,
                    ErrorCode.none,
                    str(group.state),
                    group.protocol_type or "",
                    (group.protocol_name or "") if stable else "",
                    tuple(
                        DescribedMember(
                            m.member_id,
                            m.group_instance_id,
                            m.client_id,
                            m.client_host,
                            m.metadata(group.protocol_name) if stable else b"",
                            m.assignment,
                        )
                        for m in group.members.values()
                    ),
                )
        except CoordinatorError as exc:
            return DescribedGroup(group_id, exc.error, state="", protocol_type="")

    async def list_groups(self) -> list[ListedGroup]:
        """The groups this agent coordinates (a client asks every agent and merges)."""
        shell = self.shell
        stored, consumers = await shell.kv.read(
            lambda tr: (
                groups_layer.list_groups(tr, shell.sub),
                consumer_layer.list_consumer_groups(tr, shell.sub),
            )
        )
        await shell.placement.refresh(
            *(r.group_id for r in consumers),
            *(h.group_id for h in stored),
            *(group_id for group_id, _slot in shell.slots()),
        )
        listed: dict[str, ListedGroup] = {}
        loaded = {group_id for group_id, slot in shell.slots() if slot.consumer is not None}
        for record in consumers:
            if shell.placement.is_local(record.group_id) and record.group_id not in loaded:
                # Its state needs its members: the group is loaded (as on any request).
                try:
                    async with shell.locked(record.group_id):
                        pass
                except CoordinatorError:
                    continue
        for header in stored:
            if shell.placement.is_local(header.group_id):
                listed[header.group_id] = ListedGroup(
                    header.group_id,
                    header.protocol_type or "",
                    _stored_state_as_loaded(header.state, header.state != groups_layer.EMPTY),
                )
        for group_id, slot in shell.slots():
            if slot.consumer is not None and shell.placement.is_local(group_id):
                listed[group_id] = ListedGroup(
                    group_id,
                    consumer_values.PROTOCOL_TYPE,
                    consumer_values.listed_state(slot.consumer.group),
                    consumer_values.GROUP_TYPE,
                )
                continue
            group = None if slot.loaded is None else slot.loaded.group
            if group is not None and group.state is not DEAD:
                if shell.placement.is_local(group_id):
                    listed[group_id] = ListedGroup(
                        group_id, group.protocol_type or "", str(group.state)
                    )
        return sorted(listed.values(), key=lambda g: g.group_id)

    async def delete_group(self, group_id: str) -> ErrorCode:
        shell = self.shell
        try:
            async with shell.locked(group_id) as slot:
                if slot.consumer is not None:
                    return await shell.consumers.delete(slot)
                if slot.loaded is None:
                    return ErrorCode.group_id_not_found
                if slot.loaded.group.state is not EMPTY:
                    return ErrorCode.non_empty_group
                revision = slot.loaded.revision
                count = await shell.kv.transact(
                    lambda tr: groups_layer.delete_group(
                        tr, shell.sub, group_id, expected_revision=revision
                    )
                )
                logger.info("deleted group %r and %d committed offsets", group_id, count)
                shell.forget(slot)
                return ErrorCode.none
        except CoordinatorError as exc:
            return exc.error

    async def delete_offsets(
        self,
        group_id: str,
        partitions: list[tuple[str, int]],
        *,
        resolve_topic: TopicResolver,
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete: a group error, or an error for every partition."""
        if not group_id:
            return ErrorCode.invalid_group_id, {}
        shell = self.shell
        try:
            async with shell.locked(group_id) as slot:
                group = None if slot.loaded is None else slot.loaded.group
                answers: dict[tuple[str, int], ErrorCode] = {}
                known = []
                for topic_name, partition in partitions:
                    topic = await resolve_topic(topic_name)
                    if topic is None or not 0 <= partition < topic.partitions:
                        answers[(topic_name, partition)] = ErrorCode.unknown_topic_or_partition
                    else:
                        known.append((topic_name, partition))
                consumer = None if slot.consumer is None else slot.consumer.group
                if group is None and consumer is None:
                    return ErrorCode.group_id_not_found, {}
                if (
                    group is not None
                    and group.state is not EMPTY
                    and group.protocol_type != CONSUMER_PROTOCOL_TYPE
                ):
                    return ErrorCode.non_empty_group, {}
                doomed = []
                for topic_name, partition in known:
                    subscribed = (
                        topic_name in consumer.subscription_metadata
                        if consumer is not None
                        else group is not None and group.is_subscribed_to_topic(topic_name)
                    )
                    if subscribed:
                        answers[(topic_name, partition)] = ErrorCode.group_subscribed_to_topic
                    else:
                        answers[(topic_name, partition)] = ErrorCode.none
                        doomed.append((topic_name, partition))
                if doomed:
                    await shell.kv.transact(
                        lambda tr: groups_layer.delete_offsets(tr, shell.sub, group_id, doomed)
                    )
                return ErrorCode.none, answers
        except CoordinatorError as exc:
            return exc.error, {}
