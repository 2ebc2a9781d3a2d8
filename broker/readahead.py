"""Read-ahead for consumers that read behind the head of a partition.

A tailing consumer is served from the cache of recently written objects. A consumer
catching up is not: each of its Fetches would read chunks from the object store, and a
client with one Fetch in flight (the Java consumer) would wait for that read every time,
one GET per partition and Fetch. So when a Fetch of a partition behind its head had to go
to the store, the handler asks for a *stretch* of the partition after it to be brought
into the cache in the background; once the consumer's Fetches have reached the middle of
that stretch, the next one is asked for, so the cache stays ahead of the consumer until
it reaches the head of the partition.

The stretch is the cache's share per partition being read ahead: a third of the cache
divided among the partitions read ahead in the last `ACTIVE_SECONDS` (two stretches of
each may be held at a time: the one being read and the next), between `STRETCH_MIN` and
`STRETCH_MAX`. One partition catching up alone reads up to 64 MiB per GET; a consumer of
64 partitions at once reads 1.3 MiB of each per GET with the default 256 MiB cache.

What one GET reads of an object: the whole object when it is no larger than the stretch;
of a larger one, the partition's bytes of the stretch, as one range. That holds for
objects of many partitions too (ingest files, level-1 objects): reading one whole for
all of its partitions pays only if they all read it while it is cached, and a
consumer's partitions are seldom at the same point of their logs (each left level 2 at
its own offset). A 64-partition catch-up on S3 that read such objects whole while they
fit in a third of the cache pushed them out of it before most partitions had read
their part: read-ahead read twice the bytes consumed, and most Fetches read again for
themselves.

A larger level-2 object is read in ranges through one open GET (an object store's
`open_range_stream`, where it has one): the stretch after a range starts where the range
ended, so the next stretch is read on from the same stream, and a partition caught up
costs one GET per level-2 object however small its stretches are (64 partitions caught
up at once: 1.3 MiB stretches, 64 MiB objects, 16 GETs per GB rather than 770). At most
`STREAMS` are open, the least recently read closed first; one unread for
`STREAM_IDLE_SECONDS` is closed; a stream asked for bytes before its position, or more
than `STREAM_SKIP` past it, is closed and another opened where wanted. An open stream
holds no memory of the agent's: the bytes not yet read wait in the socket (the kernel's
receive buffer, and TCP's flow control stops the sender there).

Best effort and bounded: requests wait in a queue of `QUEUE` (a request that does not
fit is dropped and counted), `WORKERS` tasks serve them, a partition has at most one
request queued or being read, a range already cached or being read is not read again,
and a failure is logged and forgotten (the Fetch that needs the bytes then reads them
itself).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from broker.costs import charge
from metadata import keys
from metadata.chunk_cache import ChunkCache, read_chunks_cached
from metadata.compaction import L2
from metadata.kv import KV, ReadTransaction
from metadata.lifecycle import ObjectRecord, get_object
from metadata.log import ChunkEntry
from storage.cache import ObjectCache
from storage.objectstore import ObjectStore, ObjectStoreError, RangeStream

logger = logging.getLogger(__name__)

QUEUE = 64
WORKERS = 16  # stretches read at once (each waits on the store: a thread and a GET)
STRETCH_MIN = 1024 * 1024
STRETCH_MAX = 64 * 1024 * 1024
ENTRIES_PER_READ = 1024  # entries of one stretch (level-2 entries are 256 KiB)
ACTIVE_SECONDS = 10.0
FRONTS = 4096  # partitions whose read-ahead front is remembered
STREAMS = 128
STREAM_IDLE_SECONDS = 20.0
STREAM_SKIP = 1024 * 1024  # bytes read and dropped to reach a range further on

_Partition = tuple[bytes, int]  # topic id, partition


@dataclass(slots=True)
class _Front:
    """How far a partition was read ahead, and where a Fetch asks for the next stretch."""

    next_offset: int = -1  # the first offset after the last stretch (-1: none read yet)
    refill_at: int = -1  # a Fetch reaching this offset asks for the next stretch
    busy: bool = False  # a request is queued or being read
    seen: float = 0.0  # time.monotonic() of the last Fetch that noted the partition


@dataclass(slots=True)
class _Stream:
    """An open GET of an object, read up to `position`."""

    object_key: str
    stream: RangeStream
    position: int
    used: float


@dataclass(frozen=True, slots=True)
class _Piece:
    """One GET of a stretch: bytes [start, end) of an object (the whole object: None)."""

    object_key: str
    start: int | None
    end: int | None


class ReadAhead:
    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        store: ObjectStore,
        cache: ObjectCache,
        chunks: ChunkCache,
        *,
        topic_name: Callable[[bytes], str] = bytes.hex,
    ) -> None:
        self._kv = kv
        self._topic_name = topic_name
        self._chunks = chunks
        self._sub = sub
        self._store = store
        self._cache = cache
        self._send, self._receive = anyio.create_memory_object_stream[tuple[_Partition, int]](QUEUE)
        self._reading: dict[_Piece, anyio.Event] = {}  # set once its bytes are cached
        self._fronts: OrderedDict[_Partition, _Front] = OrderedDict()
        self._active = 1
        self._active_counted_at = 0.0
        self._open_stream: Callable[[str, int], RangeStream] | None = getattr(
            store, "open_range_stream", None
        )
        self._streams: OrderedDict[str, _Stream] = OrderedDict()  # by object key
        self.stats: dict[str, int] = {
            "requests": 0,
            "dropped": 0,
            "objects": 0,
            "ranges": 0,
            "bytes": 0,
            "failures": 0,
            "streams_opened": 0,
            "streamed_ranges": 0,
        }

    def note_fetch(
        self,
        topic_id: bytes,
        partition: int,
        entries: Sequence[ChunkEntry],
        high_watermark: int,
    ) -> None:
        """A Fetch read `entries` of a partition whose head is further on: ask for the
        next stretch when the Fetch had to go to the store for them, or when it reached
        the middle of the stretch read ahead last."""
        if not entries or entries[-1].last_offset + 1 >= high_watermark:
            return
        key = (topic_id, partition)
        front = self._fronts.get(key)
        if front is None:
            front = self._fronts[key] = _Front()
            if len(self._fronts) > FRONTS:
                self._fronts.popitem(last=False)
        else:
            self._fronts.move_to_end(key)
        front.seen = time.monotonic()
        if front.busy:
            return
        last = entries[-1]
        if last.last_offset >= front.next_offset and not all(
            self._cache.covers(e.object_key, e.start, e.start + e.length) for e in entries
        ):
            # Past what was read ahead, and behind the cache: from the last entry read
            # (the next Fetch may start in it).
            self._request(key, front, last.base_offset)
        elif 0 <= front.refill_at <= last.last_offset and front.next_offset < high_watermark:
            self._request(key, front, front.next_offset)

    def _request(self, key: _Partition, front: _Front, from_offset: int) -> None:
        try:
            self._send.send_nowait((key, from_offset))
        except anyio.WouldBlock:
            self.stats["dropped"] += 1
            return
        front.busy = True
        self.stats["requests"] += 1

    def _weights(self, topic_id: bytes) -> dict[str, float]:
        """A stretch's GETs are its partition's topic's (broker.costs)."""
        return {self._topic_name(topic_id): 1.0}

    def stretch_bytes(self) -> int:
        """The bytes of one stretch: a third of the cache shared among the partitions
        read ahead lately (counted at most once a second)."""
        now = time.monotonic()
        if now - self._active_counted_at >= 1.0:
            self._active = max(
                1, sum(1 for f in self._fronts.values() if now - f.seen <= ACTIVE_SECONDS)
            )
            self._active_counted_at = now
        share = self._cache.max_bytes // (3 * self._active)
        return max(STRETCH_MIN, min(STRETCH_MAX, share))

    async def run(self) -> None:
        """The workers; run for the life of the agent in its root task group."""
        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(self._worker, self._receive.clone())

    async def _worker(self, receive: MemoryObjectReceiveStream[tuple[_Partition, int]]) -> None:
        async with receive:
            async for key, from_offset in receive:
                front = self._fronts.get(key)
                try:
                    with charge(partial(self._weights, key[0])):
                        await self._read_stretch(key, from_offset, front)
                except Exception as exc:  # best effort: the Fetch reads it itself
                    self.stats["failures"] += 1
                    logger.debug("read-ahead of partition %d failed: %s", key[1], exc)
                finally:
                    if front is not None:
                        front.busy = False

    async def _read_stretch(self, key: _Partition, from_offset: int, front: _Front | None) -> None:
        topic_id, partition = key
        stretch = self.stretch_bytes()

        def plan(tr: ReadTransaction) -> tuple[list[ChunkEntry], dict[str, ObjectRecord]]:
            entries = read_chunks_cached(
                tr,
                self._chunks,
                self._sub,
                topic_id,
                partition,
                from_offset,
                ENTRIES_PER_READ,
                stretch,
            )
            records = {}
            for object_key in dict.fromkeys(e.object_key for e in entries):
                record = get_object(tr, self._sub, object_key)
                if record is not None:
                    records[object_key] = record
            return entries, records

        entries, records = await self._kv.read(plan, quick=True)
        if not entries:
            return
        if front is not None:
            front.next_offset = entries[-1].last_offset + 1
            front.refill_at = _middle(entries)
        for piece in _pieces(entries, records, stretch):
            if piece in self._reading or (
                self._cache.covers(piece.object_key, piece.start, piece.end)
                if piece.start is not None and piece.end is not None
                else piece.object_key in self._cache
            ):
                continue
            self._reading[piece] = anyio.Event()
            try:
                record = records.get(piece.object_key)
                if piece.start is None or piece.end is None:
                    data = await self._store.get(piece.object_key, 0, None)
                elif record is not None and record.level == L2:
                    data = await self._read_range(
                        piece.object_key, piece.start, piece.end, record.size
                    )
                else:
                    # One partition's bytes of an object of many: what follows them is
                    # another partition's, so no stream to read on from.
                    data = await self._store.get(piece.object_key, piece.start, piece.end)
                if piece.start is None:
                    self._cache.put(piece.object_key, data)
                    self.stats["objects"] += 1
                else:
                    self._cache.put_range(piece.object_key, piece.start, data)
                    self.stats["ranges"] += 1
                self.stats["bytes"] += len(data)
            finally:
                self._reading.pop(piece).set()

    def in_flight(self, object_key: str, start: int, end: int) -> anyio.Event | None:
        """The event of a read-ahead GET under way that brings bytes [start, end) of the
        object into the cache (set once they are there, or the GET failed); None if no
        GET under way holds them."""
        for piece, done in self._reading.items():
            if piece.object_key == object_key and (
                piece.start is None
                or (piece.end is not None and piece.start <= start and end <= piece.end)
            ):
                return done
        return None

    async def _read_range(self, object_key: str, start: int, end: int, size: int) -> bytes:
        """Bytes [start, end) of an object of `size` bytes: read on from its open stream
        when one is at (or a little before) start, else from a new one; a plain ranged
        GET from a store without streams."""
        if self._open_stream is None:
            return await self._store.get(object_key, start, end)
        await self._close_idle()
        held = self._streams.pop(object_key, None)
        if held is not None and not 0 <= start - held.position <= STREAM_SKIP:
            await _close(held)
            held = None
        if held is not None:
            try:
                data = await self._read_on(held, start, end)
            except Exception as exc:  # an idle connection closed: open another
                logger.debug("stream of %s broke off: %s", object_key, exc)
                await _close(held)
                held = None
        if held is None:
            opened = await anyio.to_thread.run_sync(self._open_stream, object_key, start)
            held = _Stream(object_key, opened, start, 0.0)
            self.stats["streams_opened"] += 1
            try:
                data = await self._read_on(held, start, end)
            except BaseException:
                await _close(held)
                raise
        self.stats["streamed_ranges"] += 1
        if held.position >= size:
            await _close(held)  # the object is read to its end
        else:
            held.used = time.monotonic()
            self._streams[object_key] = held
            while len(self._streams) > STREAMS:
                await _close(self._streams.popitem(last=False)[1])
        return data

    async def _read_on(self, held: _Stream, start: int, end: int) -> bytes:
        """Read [start, end) from the stream, dropping what comes before start."""
        skip = start - held.position
        data = await anyio.to_thread.run_sync(held.stream.read, end - held.position)
        held.position += len(data)
        if held.position != end:
            raise ObjectStoreError(f"{held.object_key}: ended at {held.position}, before {end}")
        return data[skip:] if skip else data

    async def _close_idle(self) -> None:
        now = time.monotonic()
        while self._streams:
            oldest = next(iter(self._streams.values()))
            if now - oldest.used < STREAM_IDLE_SECONDS:
                break
            await _close(self._streams.popitem(last=False)[1])

    async def aclose(self) -> None:
        """Close every open stream."""
        while self._streams:
            await _close(self._streams.popitem()[1])


async def _close(held: _Stream) -> None:
    try:
        await anyio.to_thread.run_sync(held.stream.close)
    except Exception as exc:  # a connection already gone: nothing to close
        logger.debug("closing the stream of %s: %s", held.object_key, exc)


def _middle(entries: Sequence[ChunkEntry]) -> int:
    """The first offset of the entry where half of the entries' bytes are reached."""
    half = sum(e.length for e in entries) // 2
    seen = 0
    for entry in entries:
        seen += entry.length
        if seen >= half:
            return entry.base_offset
    return entries[-1].base_offset


def _pieces(
    entries: Sequence[ChunkEntry], records: dict[str, ObjectRecord], stretch: int
) -> list[_Piece]:
    """The GETs of a stretch, in offset order (see the module's rules)."""
    spans: dict[str, list[int]] = {}
    for e in entries:
        span = spans.setdefault(e.object_key, [e.start, e.start + e.length])
        span[0] = min(span[0], e.start)
        span[1] = max(span[1], e.start + e.length)
    pieces = []
    for object_key, (start, end) in spans.items():
        record = records.get(object_key)
        # An object not known is read whole, as before objects had records.
        whole = record is None or record.size <= stretch
        pieces.append(_Piece(object_key, None, None) if whole else _Piece(object_key, start, end))
    return pieces
