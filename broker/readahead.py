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
of a larger one, the partition's bytes of the stretch, as one range. An object of
several partitions (an ingest file, a level-1 object, a level-2 object holding a few
partitions' runs) is read once for all of them where the agent has a disk cache
(storage.disk_cache) and the partitions read ahead lately, and not yet past the object,
hold at least SHARE_MIN of its bytes (from its reverse index, up to SHARE_ROWS entries,
remembered for SHARES_KNOWN objects): the first stretch that wants it reads it whole
into the disk with one GET, a piece at a time (storage.disk_cache.write_whole), and
every partition's range of it after comes from there (a Fetch's own read too),
whatever the object's size; the memory cache holds the partition's range, not the
object. In memory this did not pay: a
consumer's partitions are seldom at the same point of their logs (they spread over up to
16 stretches), and a 64-partition catch-up on S3 that read such objects whole into a
third of the cache pushed them out before most partitions had read their part. A disk
the fill cannot write to (full, say) leaves the stretch reading the range as before.
Once every partition read ahead lately has been read ahead past its part of such an
object, the object is released: the disk makes room with released objects first, so
that an object some partition still wants outlasts them (a consumer's partitions spread
over up to 16 stretches: the objects between its first and its last partitions must all
be kept for one GET each).

A larger level-2 object is read in ranges through one open GET (an object store's
`open_range_stream`, where it has one) that ends where the partition's run in the object
ends (a level-2 object may hold the runs of a few partitions, one after the other): the
stretch after a range starts where the range ended, so the next stretch is read on from
the same stream, and a partition caught up costs one GET per run of a level-2 object
however small its stretches are (64 partitions caught up at once: 1.3 MiB stretches,
64 MiB runs, 16 GETs per GB rather than 770). At most
`STREAMS` are open, the least recently read closed first; one unread for
`STREAM_IDLE_SECONDS` is closed; a stream asked for bytes before its position, or more
than `STREAM_SKIP` past it, is closed and another opened where wanted. An open stream
holds no memory of the agent's: the bytes not yet read wait in the socket (the kernel's
receive buffer, and TCP's flow control stops the sender there).

The whole objects and plain ranges of a stretch are read by one worker thread in a row,
up to `BATCH_PIECES` or `BATCH_BYTES` at a time, for one hand-off to the thread rather
than one each: a consumer of one partition written by a producer alone reads its
stretches in objects of a few hundred KB (3,500 of them for 1.5 GB in consume-1p, whose
profile had the loop's part of those hand-offs at 7% of its samples). Pieces that
Fetches wait for are read one by one until they are cached, as are the ranges read
through streams.

A Fetch that overtook its read-ahead (its bytes neither cached nor being read) does not
read them itself with a GET of its own, beside the stretch it asks for: the stretch
starts at its first missing entry, is served before the stretches asked for ahead of
the consumers, and the Fetch waits for its bytes to be read (the ranges it waits for are
*promised*: `in_flight` names them, and each is released once the cache holds it or
the stretch ended). So does a Fetch whose partition has a stretch queued that starts at
or before its bytes. A consumer faster than the store then waits for read-ahead rather
than adding a GET per partition and Fetch.

Best effort and bounded: requests wait in a queue of `QUEUE` (a request that does not
fit is dropped and counted), `WORKERS` tasks serve them (and `URGENT_WORKERS` more serve
only stretches Fetches wait for, so that these never wait for a stretch read ahead to
end), a partition has at most one
request queued or being read, a range already cached or being read is not read again,
and a failure is logged and forgotten (the Fetch that needs the bytes then reads them
itself, after its wait).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import anyio

from broker.costs import charge
from broker.sync import Flag
from metadata import keys
from metadata.chunk_cache import ChunkCache, read_chunks_cached
from metadata.compaction import L1, L2
from metadata.kv import KV, ReadTransaction
from metadata.lifecycle import ObjectRecord, get_object
from metadata.log import INGEST_LEVEL, ChunkEntry, object_entries, partition_end_in_object
from storage.cache import ObjectCache
from storage.disk_cache import DiskCache
from storage.objectstore import ObjectStore, ObjectStoreError, RangeStream
from storage.threads import ThreadPool

logger = logging.getLogger(__name__)

QUEUE = 64
WORKERS = 16  # stretches read at once (each waits on the store: a thread and a GET)
URGENT_WORKERS = 4  # more, for stretches that Fetches wait for only
STRETCH_MIN = 1024 * 1024
STRETCH_MAX = 64 * 1024 * 1024
ENTRIES_PER_READ = 1024  # entries of one stretch (level-2 entries are 256 KiB)
ACTIVE_SECONDS = 10.0
FRONTS = 4096  # partitions whose read-ahead front is remembered
STREAMS = 128
STREAM_IDLE_SECONDS = 20.0
STREAM_SKIP = 1024 * 1024  # bytes read and dropped to reach a range further on
# Pieces read by one worker thread in a row (whole objects and plain ranges), at most.
BATCH_PIECES = 8
BATCH_BYTES = 4 * 1024 * 1024
# An object of many partitions is read whole into the disk cache when the partitions
# read ahead lately, and not yet past it, have at least this share of its bytes; its
# reverse index is read for that, up to SHARE_ROWS entries.
SHARE_MIN = 0.25
SHARE_ROWS = 4096
SHARES_KNOWN = 1024  # objects whose shares are remembered

_Partition = tuple[bytes, int]  # topic id, partition


@dataclass(slots=True)
class _Front:
    """How far a partition was read ahead, and where a Fetch asks for the next stretch."""

    next_offset: int = -1  # the first offset after the last stretch (-1: none read yet)
    refill_at: int = -1  # a Fetch reaching this offset asks for the next stretch
    busy: bool = False  # a request is queued or being read
    seen: float = 0.0  # time.monotonic() of the last Fetch that noted the partition
    request: _Request | None = None  # the request queued or being read
    # The ranges ((object key, start)) the last two stretches put into the cache: once a
    # third is read on from `next_offset`, the consumer is past the first of them (the
    # third is asked for half way through the second).
    previous_ranges: list[tuple[str, int]] = field(default_factory=list)
    last_ranges: list[tuple[str, int]] = field(default_factory=list)


_Range = tuple[str, int, int]  # object key, start, end


@dataclass(slots=True)
class _Request:
    """A stretch of a partition to read, from an offset on."""

    partition: _Partition
    from_offset: int
    urgent: bool = False  # a Fetch waits for it: served before the others
    promised: list[_Range] | None = None  # ranges Fetches wait for (ReadAhead._promised)
    until_offset: int = -1  # once planned: the first offset after its stretch

    def may_bring(self, offset: int) -> bool:
        return self.from_offset <= offset and (self.until_offset < 0 or offset < self.until_offset)


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
    # Of a range of a level-2 object read through a stream: where the partition's run in
    # the object ends (the stream's end).
    stream_end: int | None = None
    # Of a range of an object of many partitions: read the whole object (of `size`
    # bytes) into the disk cache (unless it is there already), and the range from there.
    to_disk: bool = False
    size: int = 0


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
        disk: DiskCache | None = None,
    ) -> None:
        self._kv = kv
        self._disk = disk
        # Objects being read whole into the disk cache: set once there (or failed).
        self._filling: dict[str, Flag] = {}
        # The partitions' shares of objects lately looked at for it (from their reverse
        # indexes, which only compaction and retention change: a guide, not a promise).
        self._shares: OrderedDict[str, _Shares] = OrderedDict()
        self._topic_name = topic_name
        self._chunks = chunks
        self._sub = sub
        self._store = store
        self._cache = cache
        self._urgent: deque[_Request] = deque()
        self._ahead: deque[_Request] = deque()
        self._wake = Flag()  # set when a request is queued
        self._reading: dict[_Piece, Flag] = {}  # set once its bytes are cached
        self._promised: dict[_Range, Flag] = {}  # set once cached or given up
        self._fronts: OrderedDict[_Partition, _Front] = OrderedDict()
        self._active = 1
        self._active_counted_at = 0.0
        self._open_stream: Callable[[str, int, int], RangeStream] | None = getattr(
            store, "open_range_stream", None
        )
        # By object key and where the stream ends: the runs of the partitions of one
        # level-2 object are read through streams of their own.
        self._streams: OrderedDict[tuple[str, int], _Stream] = OrderedDict()
        self._threads = ThreadPool(WORKERS + URGENT_WORKERS, "read-ahead")  # streams' reads
        self.stats: dict[str, int] = {
            "requests": 0,
            "urgent_requests": 0,  # of Fetches that overtook their read-ahead
            "promised_ranges": 0,  # that such Fetches waited for instead of a GET
            "dropped": 0,
            "objects": 0,
            "ranges": 0,
            "bytes": 0,
            "failures": 0,
            "streams_opened": 0,
            "streamed_ranges": 0,
            # Of the ranges and objects read: those of ingest files, of level-1 objects and
            # (each a GET of its own, not read on from a stream) of level-2 objects; the
            # rest are of objects without a level, or read through streams.
            "level0_reads": 0,
            "level1_reads": 0,
            "level2_reads": 0,
            # The bytes read ahead from each level (streamed ranges included).
            "level0_bytes": 0,
            "level1_bytes": 0,
            "level2_bytes": 0,
            # Fetches behind the head that read some of their bytes themselves, by why:
            # read ahead before but no longer cached (or their stretch failed: see
            # "failures"); a stretch under way that does not bring them. And ranges a
            # Fetch waited for that its stretch ended without.
            "fetches_evicted": 0,
            "fetches_beside_stretch": 0,
            "promises_unkept": 0,
            # Objects of many partitions read whole into the disk cache (one GET each,
            # their bytes), and ranges read from there rather than from the store.
            "disk_fills": 0,
            "disk_fill_bytes": 0,
            "level0_fills": 0,  # of them, by the level of the object
            "level1_fills": 0,
            "level2_fills": 0,
            "disk_reads": 0,
        }

    def note_fetch(
        self,
        topic_id: bytes,
        partition: int,
        entries: Sequence[ChunkEntry],
        high_watermark: int,
    ) -> None:
        """A Fetch reads `entries` of a partition whose head is further on: ask for the
        next stretch when the Fetch has to go to the store for them (from the first one
        missing, and the Fetch waits for it), or when it reached the middle of the
        stretch read ahead last."""
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
        missing = [
            e
            for e in entries
            if not self._cache.covers(e.object_key, e.start, e.start + e.length)
            and self.in_flight(e.object_key, e.start, e.start + e.length) is None
        ]
        if front.busy:
            queued = front.request
            if missing and queued is not None and queued.may_bring(missing[0].base_offset):
                self._promise(queued, missing)  # the stretch under way may bring them
            elif missing:
                self.stats["fetches_beside_stretch"] += 1
            return
        last = entries[-1]
        if missing and last.last_offset >= front.next_offset:
            # Past what was read ahead, and behind the cache: from the first entry
            # missing, and the Fetch waits for it.
            self._request(key, front, _Request(key, missing[0].base_offset, urgent=True), missing)
            return
        if missing:
            self.stats["fetches_evicted"] += 1
        if 0 <= front.refill_at <= last.last_offset and front.next_offset < high_watermark:
            self._request(key, front, _Request(key, front.next_offset))

    def _request(
        self,
        key: _Partition,
        front: _Front,
        request: _Request,
        missing: Sequence[ChunkEntry] = (),
    ) -> None:
        if len(self._urgent) + len(self._ahead) >= QUEUE:
            self.stats["dropped"] += 1
            return
        (self._urgent if request.urgent else self._ahead).append(request)
        self._wake.set()
        front.busy = True
        front.request = request
        self.stats["requests"] += 1
        if request.urgent:
            self.stats["urgent_requests"] += 1
        self._promise(request, missing)

    def _promise(self, request: _Request, missing: Sequence[ChunkEntry]) -> None:
        """Fetches wait for these entries' bytes from the request's stretch."""
        for e in missing:
            wanted = (e.object_key, e.start, e.start + e.length)
            if wanted not in self._promised:
                self._promised[wanted] = Flag()
                if request.promised is None:
                    request.promised = []
                request.promised.append(wanted)
                self.stats["promised_ranges"] += 1

    def _keep_promises(self, request: _Request, *, ended: bool) -> None:
        """Release the Fetches waiting for ranges the cache now holds (all of them once
        the stretch ended: what it did not bring, they read themselves)."""
        if not request.promised:
            return
        kept = []
        for wanted in request.promised:
            cached = self._cache.covers(*wanted)
            if ended or cached:
                done = self._promised.pop(wanted, None)
                if done is not None:
                    done.set()
                    if not cached:
                        self.stats["promises_unkept"] += 1
            else:
                kept.append(wanted)
        request.promised = kept

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
                tg.start_soon(self._worker, False)
            for _ in range(URGENT_WORKERS):
                tg.start_soon(self._worker, True)

    def _next_request(self, urgent_only: bool = False) -> _Request | None:
        if self._urgent:
            return self._urgent.popleft()
        if self._ahead and not urgent_only:
            return self._ahead.popleft()
        return None

    async def _worker(self, urgent_only: bool) -> None:
        while True:
            request = self._next_request(urgent_only)
            if request is None:
                if self._wake.is_set():
                    self._wake = Flag()
                await self._wake.wait()
                continue
            key = request.partition
            front = self._fronts.get(key)
            try:
                with charge(partial(self._weights, key[0])):
                    await self._read_stretch(key, request.from_offset, front, request)
            except Exception as exc:  # best effort: the Fetch reads it itself
                self.stats["failures"] += 1
                logger.debug("read-ahead of partition %d failed: %s", key[1], exc)
            finally:
                self._keep_promises(request, ended=True)
                if front is not None and front.request is request:
                    front.busy = False
                    front.request = None

    async def _read_stretch(
        self,
        key: _Partition,
        from_offset: int,
        front: _Front | None,
        request: _Request | None = None,
    ) -> None:
        topic_id, partition = key
        stretch = self.stretch_bytes()

        disk = self._disk

        def plan(
            tr: ReadTransaction,
        ) -> tuple[list[ChunkEntry], dict[str, ObjectRecord], dict[str, int], dict[str, _Shares]]:
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
            run_ends = {}
            shares: dict[str, _Shares] = {}
            for object_key in dict.fromkeys(e.object_key for e in entries):
                record = get_object(tr, self._sub, object_key)
                if record is not None:
                    records[object_key] = record
                    if record.level == L2 and self._open_stream is not None:
                        run_end = partition_end_in_object(
                            tr, self._sub, object_key, topic_id, partition
                        )
                        if run_end is not None:
                            run_ends[object_key] = run_end
                    if (
                        disk is not None
                        and record.level in (INGEST_LEVEL, L1, L2)
                        and disk.fits(record.size)
                        and object_key not in disk
                    ):
                        known = self._shares.get(object_key)
                        shares[object_key] = (
                            known
                            if known is not None
                            else _shares(object_entries(tr, self._sub, object_key, SHARE_ROWS))
                        )
            return entries, records, run_ends, shares

        entries, records, run_ends, shares = await self._kv.read(plan, quick=True)
        if not entries:
            return
        for object_key, by_partition in shares.items():
            self._shares[object_key] = by_partition
            self._shares.move_to_end(object_key)
        while len(self._shares) > SHARES_KNOWN:
            self._shares.popitem(last=False)
        to_disk = {
            object_key
            for object_key, by_partition in shares.items()
            if len(by_partition) > 1
            and self._wanted(by_partition) >= SHARE_MIN * records[object_key].size
        }
        if request is not None:
            request.until_offset = entries[-1].last_offset + 1
        # (An object without a record is never read into the disk.)
        on_disk: set[str] = set() if disk is None else {k for k in records if k in disk}
        pieces = _pieces(entries, records, stretch, run_ends, to_disk, on_disk)
        if front is not None:
            self._let_go(front, from_offset, pieces)
            front.next_offset = entries[-1].last_offset + 1
            front.refill_at = _middle(entries)
        batch: list[_Piece] = []  # marked as being read, not read yet
        batch_bytes = 0
        try:
            for piece in pieces:
                filling = self._filling.get(piece.object_key)
                if filling is not None:  # another stretch reads the object into the disk
                    if batch:
                        taken, batch, batch_bytes = batch, [], 0
                        await self._read_batch(taken, records, request)
                    await filling.wait()
                if (
                    (piece.to_disk or piece.stream_end is not None)
                    and disk is not None
                    and piece.object_key in disk
                ):  # on the disk since the plan: read from there, not filled nor streamed
                    piece = _Piece(piece.object_key, piece.start, piece.end)
                if piece in self._reading or (
                    self._cache.covers(piece.object_key, piece.start, piece.end)
                    if piece.start is not None and piece.end is not None
                    else piece.object_key in self._cache
                ):
                    continue
                self._reading[piece] = Flag()
                if piece.to_disk:
                    self._filling[piece.object_key] = self._reading[piece]
                if piece.stream_end is None or self._open_stream is None:
                    # A whole object, or one partition's bytes of an object of many
                    # (what follows them is another partition's: no stream to read on).
                    batch.append(piece)
                    batch_bytes += _piece_bytes(piece, records)
                    if (
                        len(batch) >= BATCH_PIECES
                        or batch_bytes >= BATCH_BYTES
                        or (request is not None and request.promised)
                    ):
                        # (A Fetch waits for bytes of this stretch: one at a time until
                        # it has them, as without batches.)
                        taken, batch, batch_bytes = batch, [], 0
                        await self._read_batch(taken, records, request)
                    continue
                if batch:  # the pieces before it first: in offset order
                    taken, batch, batch_bytes = batch, [], 0
                    await self._read_batch(taken, records, request)
                try:
                    assert piece.start is not None and piece.end is not None
                    data = await self._read_range(
                        piece.object_key, piece.start, piece.end, piece.stream_end
                    )
                    self._keep(piece, data, records)
                finally:
                    self._reading.pop(piece).set()
                if request is not None:
                    self._keep_promises(request, ended=False)
            if batch:
                taken, batch = batch, []
                await self._read_batch(taken, records, request)
            if disk is not None:
                self._release_passed(disk, records)
        finally:
            self._release(batch)  # given up unread (a failure, or cancelled)

    def _let_go(self, front: _Front, from_offset: int, pieces: Sequence[_Piece]) -> None:
        """A partition's next stretch is read (before `front` moves on to its end): the
        ranges of the stretch before the last go first from the memory cache, if this
        one goes on from the last (the consumer
        read them; what it has not read yet of other partitions outlasts them: a
        consumer's partitions spread over many stretches of their logs, and an LRU cache
        kept what they read last and let go of what the slowest had still to read)."""
        if from_offset >= front.next_offset >= 0:
            for object_key, start in front.previous_ranges:
                self._cache.demote(object_key, start)
        front.previous_ranges = front.last_ranges
        front.last_ranges = [(p.object_key, p.start) for p in pieces if p.start is not None]

    def _release_passed(self, disk: DiskCache, object_keys: Iterable[str]) -> None:
        """The objects of a stretch kept on the disk that no partition read ahead lately
        wants any more (each was read ahead past its part of it, this stretch's partition
        too): released, to make room before any object that some partition still wants
        (a consumer's partitions spread over many stretches of their logs, and an object
        read for the first of them must last until the last comes)."""
        for object_key in object_keys:
            by_partition = self._shares.get(object_key)
            if by_partition is not None and not self._wanted(by_partition):
                disk.release(object_key)  # (a no-op for an object not kept there)

    async def _read_batch(
        self, batch: list[_Piece], records: Mapping[str, ObjectRecord], request: _Request | None
    ) -> None:
        """Read the pieces one after the other in one worker thread (one hand-off for
        them all rather than one each) and cache what was read; a failure ends the batch
        there and is raised once what came before it is cached."""
        try:
            got, error = await self._threads.run(self._get_all, batch)
            for piece, (data, source) in zip(batch, got, strict=False):
                self._keep(piece, data, records, source)
        finally:
            self._release(batch)
        if request is not None:
            self._keep_promises(request, ended=False)
        if error is not None:
            raise error

    def _release(self, pieces: list[_Piece]) -> None:
        """These pieces are no longer being read: what waits for them goes on."""
        for piece in pieces:
            self._reading.pop(piece).set()
            if piece.to_disk:
                self._filling.pop(piece.object_key, None)

    def _get_all(
        self, batch: list[_Piece]
    ) -> tuple[list[tuple[bytes | memoryview, str]], Exception | None]:
        """In a worker thread: each piece's bytes and where they came from ("store",
        "disk", or "fill": the whole object read into the disk cache), up to the first
        that fails."""
        got: list[tuple[bytes | memoryview, str]] = []
        for piece in batch:
            try:
                got.append(self._get(piece))
            except Exception as exc:  # raised on the loop, after the others are cached
                return got, exc
        return got, None

    def _get(self, piece: _Piece) -> tuple[bytes | memoryview, str]:
        disk = self._disk
        key, start, end = piece.object_key, piece.start, piece.end
        if disk is not None and start is not None and end is not None:
            data = disk.read(key, start, end)
            if data is not None:
                return data, "disk"
            if piece.to_disk:
                # (A disk that cannot keep it, full say, leaves the range read as before.)
                disk.fill_from(self._store, key, piece.size)
                data = disk.read(key, start, end)
                if data is not None:
                    return data, "fill"
        return self._store.get_view_sync(key, start or 0, end), "store"

    def _wanted(self, by_partition: _Shares) -> int:
        """The bytes of an object that partitions read ahead lately and not yet past it
        will read."""
        now = time.monotonic()
        wanted = 0
        for key, (size, last_offset) in by_partition.items():
            front = self._fronts.get(key)
            if (
                front is not None
                and now - front.seen <= ACTIVE_SECONDS
                and front.next_offset <= last_offset
            ):
                wanted += size
        return wanted

    def _keep(
        self,
        piece: _Piece,
        data: bytes | memoryview,
        records: Mapping[str, ObjectRecord],
        source: str = "store",
    ) -> None:
        """Into the cache, counted."""
        if source == "disk":
            self.stats["disk_reads"] += 1
        elif source == "fill":
            self.stats["disk_fills"] += 1
            self.stats["disk_fill_bytes"] += piece.size
        if piece.start is None:
            self._cache.put(piece.object_key, data)
            self.stats["objects"] += 1
        else:
            self._cache.put_range(piece.object_key, piece.start, data)
            self.stats["ranges"] += 1
        self.stats["bytes"] += len(data)
        record = records.get(piece.object_key)
        level = None if record is None else record.level
        if level in (INGEST_LEVEL, L1, L2):
            self.stats[f"level{level}_bytes"] += len(data)
            if piece.stream_end is None and source != "disk":  # a GET of the store
                self.stats[f"level{level}_reads"] += 1
            if source == "fill":
                self.stats[f"level{level}_fills"] += 1

    def in_flight(self, object_key: str, start: int, end: int) -> Flag | None:
        """The event of a read-ahead GET under way that brings bytes [start, end) of the
        object into the cache (set once they are there, or the GET failed), or of a
        stretch a Fetch waits for (promised); None if no GET under way holds them."""
        promised = self._promised.get((object_key, start, end))
        if promised is not None:
            return promised
        for piece, done in self._reading.items():
            if piece.object_key == object_key and (
                piece.start is None
                or (piece.end is not None and piece.start <= start and end <= piece.end)
            ):
                return done
        return None

    async def _read_range(
        self, object_key: str, start: int, end: int, stream_end: int
    ) -> bytes | memoryview:
        """Bytes [start, end) of an object: read on from its open stream when one is at
        (or a little before) start, else from a new one that ends at `stream_end` (the
        partition's run in the object ends there); a plain ranged GET from a store
        without streams."""
        if self._open_stream is None:
            return await self._store.get_view(object_key, start, end)
        await self._close_idle()
        held = self._streams.pop((object_key, stream_end), None)
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
            opened = await self._threads.run(
                self._open_stream, object_key, start, max(end, stream_end)
            )
            held = _Stream(object_key, opened, start, 0.0)
            self.stats["streams_opened"] += 1
            try:
                data = await self._read_on(held, start, end)
            except BaseException:
                await _close(held)
                raise
        self.stats["streamed_ranges"] += 1
        if held.position >= stream_end:
            await _close(held)  # the run is read to its end
        else:
            held.used = time.monotonic()
            self._streams[(object_key, stream_end)] = held
            while len(self._streams) > STREAMS:
                await _close(self._streams.popitem(last=False)[1])
        return data

    async def _read_on(self, held: _Stream, start: int, end: int) -> bytes | memoryview:
        """Read [start, end) from the stream, dropping what comes before start."""
        skip = start - held.position
        data = await self._threads.run(held.stream.read, end - held.position)
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


def _piece_bytes(piece: _Piece, records: Mapping[str, ObjectRecord]) -> int:
    """What a piece reads, for a batch's bound (an object without a record: a guess)."""
    if piece.start is not None and piece.end is not None:
        return piece.end - piece.start
    record = records.get(piece.object_key)
    return STRETCH_MIN if record is None else record.size


def _middle(entries: Sequence[ChunkEntry]) -> int:
    """The first offset of the entry where half of the entries' bytes are reached."""
    half = sum(e.length for e in entries) // 2
    seen = 0
    for entry in entries:
        seen += entry.length
        if seen >= half:
            return entry.base_offset
    return entries[-1].base_offset


_Shares = dict[_Partition, tuple[int, int]]  # of an object: bytes, last offset in it


def _shares(found: Sequence[tuple[bytes, int, ChunkEntry]]) -> _Shares:
    """An object's bytes and last offset in it, by partition, from its reverse index."""
    shares: _Shares = {}
    for topic_id, partition, entry in found:
        size, _last = shares.get((topic_id, partition), (0, -1))
        shares[(topic_id, partition)] = (size + entry.length, entry.last_offset)
    return shares


def _pieces(
    entries: Sequence[ChunkEntry],
    records: dict[str, ObjectRecord],
    stretch: int,
    run_ends: Mapping[str, int] | None = None,
    to_disk: set[str] | frozenset[str] = frozenset(),
    on_disk: set[str] | frozenset[str] = frozenset(),
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
        if object_key in to_disk and record is not None:
            pieces.append(_Piece(object_key, start, end, to_disk=True, size=record.size))
        elif object_key in on_disk:  # the partition's range, from the disk cache
            pieces.append(_Piece(object_key, start, end))
        # An object not known is read whole, as before objects had records.
        elif record is None or record.size <= stretch:
            pieces.append(_Piece(object_key, None, None))
        else:
            pieces.append(_Piece(object_key, start, end, (run_ends or {}).get(object_key)))
    return pieces
