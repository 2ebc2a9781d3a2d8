"""Journal sequences of lightning topics: which journal objects have their offsets.

A lightning topic's flush is answered once its object is durable, before it has offsets.
The object goes into a *journal sequence*: consecutive objects written by one agent
process, `journal/<sequence>/<n>` (n from 0, ten digits). Objects are given offsets
(sequenced) in n order, each at most once, by `sequence_object`, whoever calls it: the
agent that wrote the object, right after, or the journal sweep of any agent, later.

    (JOURNAL, sequence)    (next n to sequence, node_id of the last to sequence, updated_ms)

An object whose n is below `next` is done: sequenced, or skipped (a hole left by an upload
that failed, whose batches were never answered with success). A sequence never seen has
next 0. A sequence's record is retired (`retire`) once none of its objects is left in the
store, long after its last sequencing: no object of it can then appear that is not new.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from metadata import keys
from metadata import log as log_layer
from metadata.kv import ReadTransaction, Transaction
from metadata.log import AppendResult, PendingBatch

PREFIX = "journal/"
_DIGITS = 10


def object_key(sequence: str, n: int) -> str:
    return f"{PREFIX}{sequence}/{n:0{_DIGITS}d}"


def parse_key(key: str) -> tuple[str, int] | None:
    """(sequence, n) of a journal object's key; None for any other key."""
    if not key.startswith(PREFIX):
        return None
    sequence, _slash, number = key[len(PREFIX) :].partition("/")
    if not sequence or len(number) != _DIGITS or not number.isdigit():
        return None
    return sequence, int(number)


def next_to_sequence(tr: ReadTransaction, sub: keys.Subspace, sequence: str) -> int:
    raw = tr.get(sub.key(keys.JOURNAL, sequence))
    return 0 if raw is None else int(keys.unpack_value(raw)[0])


def next_of_each(
    tr: ReadTransaction, sub: keys.Subspace, sequences: Iterable[str]
) -> dict[str, int]:
    return {s: next_to_sequence(tr, sub, s) for s in sequences}


def sequence_object(
    tr: Transaction,
    sub: keys.Subspace,
    sequence: str,
    n: int,
    node_id: int,
    object_size: int,
    now_ms: int,
    batches: Sequence[PendingBatch],
) -> list[AppendResult] | None:
    """Give journal object n of `sequence` its offsets (log.commit_ingest) and skip any
    object between the sequence's next and n; None, and nothing written, when object n
    is done already. The caller vouches that the objects skipped were never answered
    with success."""
    if n < next_to_sequence(tr, sub, sequence):
        return None
    results = log_layer.commit_ingest(
        tr, sub, object_key(sequence, n), object_size, now_ms, batches
    )
    tr.set(sub.key(keys.JOURNAL, sequence), keys.pack_value((n + 1, node_id, now_ms)))
    return results


def records_of(
    tr: ReadTransaction, sub: keys.Subspace, sequences: Iterable[str]
) -> dict[str, tuple[int, int | None]]:
    """Sequence -> (next n, updated_ms of its last sequencing; None if never sequenced)."""
    out: dict[str, tuple[int, int | None]] = {}
    for sequence in sequences:
        raw = tr.get(sub.key(keys.JOURNAL, sequence))
        if raw is None:
            out[sequence] = (0, None)
        else:
            next_n, _node_id, updated_ms = keys.unpack_value(raw)
            out[sequence] = (int(next_n), int(updated_ms))
    return out


def list_sequences(tr: ReadTransaction, sub: keys.Subspace) -> list[tuple[str, int, int]]:
    """(sequence, next n, updated_ms) of every sequence on record."""
    begin, end = sub.range(keys.JOURNAL)
    out = []
    for key, value in tr.get_range(begin, end):
        next_n, _node_id, updated_ms = keys.unpack_value(value)
        out.append((str(sub.unpack(key)[1]), int(next_n), int(updated_ms)))
    return out


def retire(tr: Transaction, sub: keys.Subspace, sequence: str, updated_ms: int) -> bool:
    """Drop a sequence's record, unless it was sequenced again since `updated_ms`."""
    key = sub.key(keys.JOURNAL, sequence)
    raw = tr.get(key)
    if raw is None or int(keys.unpack_value(raw)[2]) != updated_ms:
        return False
    tr.clear(key)
    return True
