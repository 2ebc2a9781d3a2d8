"""Producer ids and the idempotent-producer sequence checks.

For every (producer id, partition) the store keeps the producer epoch and the first/last
sequence and base offset of the last five appended batches, like Apache Kafka's producer
state. The rules, checked in this order inside the append transaction:

1. epoch older than the producer's current epoch        -> INVALID_PRODUCER_EPOCH
2. same epoch, (first_seq, last_seq) of a cached batch  -> duplicate: the original offset
3. same epoch, first_seq != last_seq + 1 (mod 2^31)     -> OUT_OF_ORDER_SEQUENCE_NUMBER
4. newer epoch with first_seq != 0                      -> OUT_OF_ORDER_SEQUENCE_NUMBER
5. no state for the partition yet and first_seq != 0     -> OUT_OF_ORDER_SEQUENCE_NUMBER
A producer id this cluster never handed out            -> UNKNOWN_PRODUCER_ID
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from metadata import keys
from metadata.kv import ReadTransaction, Transaction

MAX_CACHED_BATCHES = 5
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    epoch: int
    transactional_id: str | None


@dataclass(slots=True)
class PartitionProducerState:
    """Mutable while one append transaction runs; written back at its end."""

    epoch: int
    batches: list[tuple[int, int, int]] = field(default_factory=list)  # first, last, base

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1] if self.batches else -1


def get_producer(
    tr: ReadTransaction, sub: keys.Subspace, producer_id: int
) -> ProducerIdentity | None:
    return decode_producer(producer_id, tr.get(producer_key(sub, producer_id)))


def producer_key(sub: keys.Subspace, producer_id: int) -> bytes:
    return sub.key(keys.PRODUCER, producer_id)


def decode_producer(producer_id: int, raw: bytes | None) -> ProducerIdentity | None:
    if raw is None:
        return None
    epoch, transactional_id = keys.unpack_value(raw)
    return ProducerIdentity(producer_id, int(epoch), transactional_id)


def put_producer(tr: Transaction, sub: keys.Subspace, producer: ProducerIdentity) -> None:
    tr.set(
        sub.key(keys.PRODUCER, producer.producer_id),
        keys.pack_value((producer.epoch, producer.transactional_id)),
    )


def load_partition_state(
    tr: ReadTransaction, sub: keys.Subspace, producer_id: int, topic_id: bytes, partition: int
) -> PartitionProducerState | None:
    return decode_partition_state(
        tr.get(partition_state_key(sub, producer_id, topic_id, partition))
    )


def partition_state_key(
    sub: keys.Subspace, producer_id: int, topic_id: bytes, partition: int
) -> bytes:
    return sub.key(keys.PRODUCER_STATE, topic_id, partition, producer_id)


def decode_partition_state(raw: bytes | None) -> PartitionProducerState | None:
    if raw is None:
        return None
    epoch, batches = keys.unpack_value(raw)
    return PartitionProducerState(int(epoch), [(int(f), int(la), int(b)) for f, la, b in batches])


def store_partition_state(
    tr: Transaction,
    sub: keys.Subspace,
    producer_id: int,
    topic_id: bytes,
    partition: int,
    state: PartitionProducerState,
) -> None:
    tr.set(*partition_state_row(sub, producer_id, topic_id, partition, state))


def partition_state_row(
    sub: keys.Subspace,
    producer_id: int,
    topic_id: bytes,
    partition: int,
    state: PartitionProducerState,
) -> tuple[bytes, bytes]:
    """The key and value `store_partition_state` writes."""
    return (
        partition_state_key(sub, producer_id, topic_id, partition),
        keys.pack_value((state.epoch, tuple(state.batches[-MAX_CACHED_BATCHES:]))),
    )


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def last_sequence_of(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record; sequences wrap at 2^31."""
    return (base_sequence + last_offset_delta) % (INT32_MAX + 1)


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    """Outcome of checking one batch: an error, a duplicate's offset, or accept."""

    error: ErrorCode = ErrorCode.none
    duplicate_of: int | None = None


def check_batch(
    registered: ProducerIdentity | None,
    state: PartitionProducerState | None,
    epoch: int,
    first_seq: int,
    last_seq: int,
) -> SequenceCheck:
    if registered is None:
        return SequenceCheck(ErrorCode.unknown_producer_id)
    if epoch < registered.epoch:
        return SequenceCheck(ErrorCode.invalid_producer_epoch)
    if state is None:
        # Producer state is never dropped while its topic lives: none means no batch of
        # this producer id was written here, so the first must be sequence 0 (as Kafka
        # asks of transaction-v2 producers with no state). Taking a later one would write
        # it past a gap, and a client seeing it succeed counts the missing one as written.
        if first_seq != 0:
            return SequenceCheck(ErrorCode.out_of_order_sequence_number)
        return SequenceCheck()
    if epoch < state.epoch:
        return SequenceCheck(ErrorCode.invalid_producer_epoch)
    if epoch == state.epoch:
        for cached_first, cached_last, cached_base in state.batches:
            if cached_first == first_seq and cached_last == last_seq:
                return SequenceCheck(duplicate_of=cached_base)
        if not in_sequence(state.last_sequence, first_seq):
            return SequenceCheck(ErrorCode.out_of_order_sequence_number)
        return SequenceCheck()
    if first_seq != 0:
        return SequenceCheck(ErrorCode.out_of_order_sequence_number)
    return SequenceCheck()


def record_append(
    state: PartitionProducerState | None,
    epoch: int,
    first_seq: int,
    last_seq: int,
    base_offset: int,
) -> PartitionProducerState:
    if state is None or state.epoch != epoch:
        state = PartitionProducerState(epoch)
    state.batches.append((first_seq, last_seq, base_offset))
    del state.batches[:-MAX_CACHED_BATCHES]
    return state


def partition_producers(
    tr: ReadTransaction, sub: keys.Subspace, topic_id: bytes, partition: int
) -> list[tuple[int, PartitionProducerState]]:
    """Every producer with sequence state on the partition."""
    begin, end = sub.range(keys.PRODUCER_STATE, topic_id, partition)
    out = []
    for key, value in tr.get_range(begin, end):
        producer_id = int(sub.unpack(key)[3])
        epoch, batches = keys.unpack_value(value)
        out.append(
            (
                producer_id,
                PartitionProducerState(
                    int(epoch), [(int(f), int(la), int(b)) for f, la, b in batches]
                ),
            )
        )
    return out
