"""Topic operations shared by the handlers that need them (Metadata auto-creation, CreateTopics)."""

from __future__ import annotations

import re
import uuid

from kio.schema.errors import ErrorCode

from broker.agent import now_ms
from broker.context import AgentServices
from metadata import topics
from metadata.errors import MetadataError

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def topic_name_error(name: str) -> str | None:
    """Why a topic name is illegal (Apache Kafka's rules), or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
            f"topic name: {name}"
        )
    if not _LEGAL_NAME.match(name):
        return (
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'"
        )
    return None


async def create_topic(
    agent: AgentServices,
    name: str,
    partitions: int,
    configs: dict[str, str] | None = None,
    *,
    validate_only: bool = False,
) -> topics.Topic:
    """Create a topic; raises MetadataError with Kafka's error code."""
    reason = topic_name_error(name)
    if reason is not None:
        raise MetadataError(ErrorCode.invalid_topic_exception, reason)
    if partitions <= 0:
        raise MetadataError(
            ErrorCode.invalid_partitions, "Number of partitions must be larger than 0."
        )
    topic_id = uuid.uuid4().bytes
    created = now_ms()
    topic = await agent.kv.transact(
        lambda tr: topics.create_topic(
            tr,
            agent.sub,
            name,
            topic_id,
            partitions,
            dict(configs or {}),
            created,
            validate_only=validate_only,
        )
    )
    if not validate_only:
        agent.remember_topic(topic)
    return topic
