"""Topics, their partitions and their configs.

A topic is known by name and by a 16-byte id; the id changes when a topic is deleted and
created again, so stale chunk entries of the old topic can never be read as the new one's.
Topic configs hold only what was set explicitly; defaults live with the broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from metadata import keys
from metadata.errors import MetadataError
from metadata.kv import ReadTransaction, Transaction


@dataclass(frozen=True, slots=True)
class Topic:
    topic_id: bytes
    name: str
    partitions: int
    configs: dict[str, str]


def _read_topic(tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes) -> Topic | None:
    raw = tr.get(sub.key(keys.TOPIC, topic_id))
    if raw is None:
        return None
    name, partitions, _created = keys.unpack_value(raw)
    begin, end = sub.range(keys.TOPIC_CONFIG, topic_id)
    configs = {sub.unpack(k)[2]: v.decode() for k, v in tr.get_range(begin, end)}
    return Topic(topic_id, name, int(partitions), configs)


def get_topic(tr: ReadTransaction, sub: keys.Subspace, name: str) -> Topic | None:
    topic_id = tr.get(sub.key(keys.TOPIC_NAME, name))
    return None if topic_id is None else _read_topic(tr, sub, topic_id)


def get_topic_by_id(tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes) -> Topic | None:
    return _read_topic(tr, sub, topic_id)


def list_topics(tr: ReadTransaction, sub: keys.Subspace) -> list[Topic]:
    begin, end = sub.range(keys.TOPIC_NAME)
    topics = []
    for _key, topic_id in tr.get_range(begin, end):
        topic = _read_topic(tr, sub, topic_id)
        if topic is not None:
            topics.append(topic)
    return topics


def list_topic_names(tr: ReadTransaction, sub: keys.Subspace) -> list[str]:
    """Every topic's name, in name order, without reading the topics themselves."""
    begin, end = sub.range(keys.TOPIC_NAME)
    return [sub.unpack(key)[1] for key, _topic_id in tr.get_range(begin, end)]


def colliding_name(tr: ReadTransaction, sub: keys.Subspace, name: str) -> str | None:
    """An existing topic whose name differs from `name` only by '.' versus '_' (Kafka
    refuses those: metric names cannot tell them apart)."""
    if "." not in name and "_" not in name:
        return None
    unified = name.replace(".", "_")
    for other in list_topic_names(tr, sub):
        if other != name and other.replace(".", "_") == unified:
            return other
    return None


def create_topic(
    tr: Transaction,
    sub: keys.Subspace,
    name: str,
    topic_id: bytes,
    partitions: int,
    configs: dict[str, str],
    now_ms: int,
    *,
    validate_only: bool = False,
) -> Topic:
    if tr.get(sub.key(keys.TOPIC_NAME, name)) is not None:
        raise MetadataError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    other = colliding_name(tr, sub, name)
    if other is not None:
        raise MetadataError(
            ErrorCode.invalid_topic_exception,
            f"Topic '{name}' collides with existing topic: {other}",
        )
    topic = Topic(topic_id, name, partitions, dict(configs))
    if validate_only:
        return topic
    tr.set(sub.key(keys.TOPIC_NAME, name), topic_id)
    tr.set(sub.key(keys.TOPIC, topic_id), keys.pack_value((name, partitions, now_ms)))
    for config_name, value in configs.items():
        tr.set(sub.key(keys.TOPIC_CONFIG, topic_id, config_name), value.encode())
    for p in range(partitions):
        tr.set(sub.key(keys.PARTITION, topic_id, p), keys.pack_value((0, 0, 0)))
    return topic


def delete_topic(tr: Transaction, sub: keys.Subspace, name: str, now_ms: int = 0) -> bytes:
    """Remove the topic; returns its id. Its chunk entries stay until
    `metadata.lifecycle.reap_deleted_topic` drops them (and frees their objects) in
    bounded steps: one transaction could not hold a large topic's index."""
    topic_id = tr.get(sub.key(keys.TOPIC_NAME, name))
    if topic_id is None:
        raise MetadataError(
            ErrorCode.unknown_topic_or_partition, "This server does not host this topic."
        )
    raw = tr.get(sub.key(keys.TOPIC, topic_id))
    partitions = int(keys.unpack_value(raw)[1]) if raw is not None else 0
    tr.clear(sub.key(keys.TOPIC_NAME, name))
    tr.clear(sub.key(keys.TOPIC, topic_id))
    for tag in (
        keys.TOPIC_CONFIG,
        keys.PARTITION,
        keys.PRODUCER_STATE,
        keys.TXN_OPEN,
        keys.ABORTED,
        keys.L1_PARTITION,
    ):
        tr.clear_range(*sub.range(tag, topic_id))
    tr.set(sub.key(keys.DELETED_TOPIC, topic_id), keys.pack_value((partitions, now_ms)))
    return topic_id


def add_partitions(
    tr: Transaction, sub: keys.Subspace, name: str, count: int, *, validate_only: bool = False
) -> None:
    topic = get_topic(tr, sub, name)
    if topic is None:
        raise MetadataError(
            ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
        )
    if count <= topic.partitions:
        raise MetadataError(
            ErrorCode.invalid_partitions,
            f"Topic currently has {topic.partitions} partitions, which is higher than "
            f"the requested {count}.",
        )
    if validate_only:
        return
    raw = tr.get(sub.key(keys.TOPIC, topic.topic_id))
    assert raw is not None
    _name, _old, created = keys.unpack_value(raw)
    tr.set(sub.key(keys.TOPIC, topic.topic_id), keys.pack_value((name, count, created)))
    for p in range(topic.partitions, count):
        tr.set(sub.key(keys.PARTITION, topic.topic_id, p), keys.pack_value((0, 0, 0)))


def set_configs(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, changes: dict[str, str | None]
) -> None:
    """Set (value) or remove (None) explicit topic configs."""
    for config_name, value in changes.items():
        key = sub.key(keys.TOPIC_CONFIG, topic_id, config_name)
        if value is None:
            tr.clear(key)
        else:
            tr.set(key, value.encode())


def replace_configs(
    tr: Transaction, sub: keys.Subspace, topic_id: bytes, configs: dict[str, str]
) -> None:
    """AlterConfigs semantics: the given set replaces every explicit config."""
    tr.clear_range(*sub.range(keys.TOPIC_CONFIG, topic_id))
    set_configs(tr, sub, topic_id, dict(configs))
