"""Key layout of the metadata store: the single source of truth.

Every key is an FDB tuple inside the cluster's subspace ("bucketlog", <cluster name>), with
a small integer tag first so that the keys of one kind sort together. Values are FDB tuples
too unless noted.

  (CLUSTER, "id")                                  cluster id (utf-8 bytes)
  (CLUSTER, "next_producer_id")                    next producer id to hand out (tuple (n,))
  (CLUSTER, "next_node_id")                        next broker node id to hand out (tuple (n,))
  (CLUSTER, "acl_version")                        ACL version (little-endian int64, atomic add):
                                                    changes with every ACL write
  (CLUSTER, "tally", name)                         a count kept by atomic adds (little-endian
                                                    int64): objects, object_bytes, chunk_entries
  (NODE, "host:port")                              (node_id,) -- an address keeps its id
  (AGENT, node_id)                                 (host, port, rack, lease_expires_ms,
                                                    ((listener, host, port), ...)); the
                                                    last is missing in older records
  (TOPIC_NAME, name)                               topic id (16 raw bytes)
  (TOPIC, topic_id)                                (name, partition count, created_ms)
  (TOPIC_CONFIG, topic_id, name)                   config value (utf-8 bytes)
  (PARTITION, topic_id, partition)                 (high_watermark, log_start_offset,
                                                    bytes of its chunk entries or None)
  (CHUNK, topic_id, partition, last_offset)        (object key, start, length, base_offset,
                                                    batch count, max_timestamp)
  (PRODUCER, producer_id)                          (epoch, transactional id or None)
  (PRODUCER_STATE, topic_id, partition, prod. id) (epoch, ((first_seq, last_seq,
                                                    base_offset), ...)) last five batches
  (OBJECT, key)                                    (size, live chunk count, created_ms,
                                                    dead_since_ms or None, level or None)
                                                    -- created_ms of an ingest file
                                                    promoted to level 1: when promoted
  (OBJECT_CHUNK, key, topic_id, partition, last)   (start, length, base_offset, batch count,
                                                    max_timestamp) -- a chunk entry naming the
                                                    object, found by object (the reverse of
                                                    CHUNK, written and cleared with it)
  (L0_OBJECT, created_ms, key)                     (node_id, claim_expires_ms) or () -- a
                                                    level-0 object with live entries, waiting
                                                    for compaction; a claim while a job has it
  (L1_PARTITION, topic_id, partition)              (bytes, objects, first_offset, node_id,
                                                    claim_expires_ms, oldest_ms) -- a
                                                    partition with entries in level-1
                                                    objects, waiting for L2; oldest_ms (when
                                                    the oldest arrived) is missing in older
                                                    records
  (CLEANER, topic_id, partition)                   (first_dirty_offset,) of a compacted
                                                    partition cleaned before
  (DEAD_OBJECT, due_ms, key)                       (size,) -- the deletion queue
  (DELETED_TOPIC, topic_id)                        (partition count, deleted_ms): its chunk
                                                    entries are still being dropped
  (LEASE, job name)                                (node_id, expires_ms) of the agent that
                                                    runs the job
  (GROUP, group_id)                                (protocol_type or None, protocol_name or
                                                    None, generation, leader or None, state,
                                                    state_timestamp_ms, revision)
  (GROUP_MEMBER, group_id, member_id)              (group_instance_id, client_id, client_host,
                                                    rebalance_timeout_ms, session_timeout_ms,
                                                    ((protocol name, metadata), ...), assignment)
  (GROUP_OFFSET, group_id, topic name, partition)  (offset, leader_epoch, metadata,
                                                    commit_timestamp_ms, expire_timestamp_ms or
                                                    None, topic_id)
  (CONSUMER_GROUP, group_id)                       (group_epoch, assignment_epoch,
                                                    ((topic name, topic_id, partitions), ...),
                                                    revision) -- a consumer-protocol group
                                                    (KIP-848); a group id is never both this
                                                    and a GROUP
  (CONSUMER_GROUP_MEMBER, group_id, member_id)     (instance_id, rack_id, client_id,
                                                    client_host, (topic name, ...), regex,
                                                    server assignor, rebalance_timeout_ms,
                                                    member epoch, previous member epoch,
                                                    state, assigned, pending revocation,
                                                    target) -- the last three as
                                                    ((topic_id, partition), ...)
  (TXN, transactional_id)                          (producer_id, epoch, state, timeout_ms,
                                                    started_ms, updated_ms,
                                                    ((topic_id, partition), ...), (group, ...))
  (TXN_OPEN, topic_id, partition, producer_id)     (first_offset,) of an open transaction
  (ABORTED, topic_id, partition, marker_offset)    (producer_id, first_offset)
  (TXN_OFFSET, transactional_id, group, topic, p)  (offset, leader_epoch, metadata) pending
                                                    until the transaction commits
  (TXN_OFFSET_GROUP, group, topic, p, txn id)      b"" -- the same, found by group
  (JOURNAL, sequence)                              (next n to sequence, node_id, updated_ms)
                                                    of a lightning topics' journal sequence
                                                    (metadata/journal.py)
  (ACL, resource type, pattern type, resource     b"" -- one ACL binding, Kafka's codes
       name, principal, host, operation,           (metadata/acls.py)
       permission)
  (SCRAM_CREDENTIAL, user, mechanism)              (salt, stored_key, server_key, iterations)
                                                    of a user's SCRAM credential; mechanism
                                                    1 SCRAM-SHA-256, 2 SCRAM-SHA-512
                                                    (metadata/scram.py)
  (HOME_ZONE, kind, key)                           (zone,) -- the home zone of a group id
                                                    (kind 0) or transactional id (kind 1):
                                                    set once, never changed
                                                    (metadata/homes.py)

A chunk entry is keyed by its *last* offset so that "the entry holding offset X" is the
first key >= (CHUNK, topic, partition, X).

An object's level (metadata.compaction) is 0 for an ingest file, 1 or 2 for the output of
a compaction; an OBJECT record written before levels existed has none (4 fields): its
object has no OBJECT_CHUNK rows and is never compacted.

Consumer groups (tags 20-29, see metadata/groups.py): a group's `revision` grows by one with
every write of the group, so a coordinator that read revision r can tell that another
agent wrote the group since. A committed offset remembers the id of the topic it was
committed for: once the topic is deleted (and perhaps created again) the offset is ignored.
"""

from __future__ import annotations

from typing import Any

from metadata.tuple_layer import pack, unpack

CLUSTER = 1
NODE = 2
AGENT = 3
TOPIC_NAME = 4
TOPIC = 5
TOPIC_CONFIG = 6
PARTITION = 7
CHUNK = 8
PRODUCER = 9
PRODUCER_STATE = 10
OBJECT = 11
DEAD_OBJECT = 12
DELETED_TOPIC = 13
LEASE = 14
OBJECT_CHUNK = 15
L0_OBJECT = 16
L1_PARTITION = 17
CLEANER = 18
# 20-29: consumer groups
GROUP = 20
GROUP_MEMBER = 21
GROUP_OFFSET = 22
CONSUMER_GROUP = 23
CONSUMER_GROUP_MEMBER = 24
TXN = 30
TXN_OPEN = 31
ABORTED = 32
TXN_OFFSET = 33
TXN_OFFSET_GROUP = 34
JOURNAL = 40
# 50-59: security
ACL = 50
# 60-69: authentication
SCRAM_CREDENTIAL = 60
# 70-79: placement
HOME_ZONE = 70


def pack_value(value: tuple[Any, ...]) -> bytes:
    return pack(value)


def unpack_value(raw: bytes) -> tuple[Any, ...]:
    return unpack(raw)


def pack_tail(*parts: Any) -> bytes:
    """What extends a key by `parts`: the tuple encoding concatenates, so
    `sub.key(a, b) + pack_tail(c) == sub.key(a, b, c)`."""
    return pack(parts)


class Subspace:
    """A key prefix; keys inside it are tuples packed after the prefix."""

    __slots__ = ("raw",)

    def __init__(self, prefix: tuple[Any, ...]) -> None:
        self.raw = pack(prefix)

    def key(self, *parts: Any) -> bytes:
        return self.raw + pack(parts)

    def unpack(self, key: bytes) -> tuple[Any, ...]:
        return unpack(key[len(self.raw) :])

    def range(self, *parts: Any) -> tuple[bytes, bytes]:
        """[begin, end) of every key that extends the tuple `parts`."""
        base = self.key(*parts)
        return base + b"\x00", base + b"\xff"


def cluster_subspace(cluster_name: str) -> Subspace:
    return Subspace(("bucketlog", cluster_name))
