"""Read-ahead for consumers that read behind the head of a partition.

A tailing consumer is served from the cache of recently written objects. A consumer
catching up is not: each of its Fetches reads chunks from the object store, and a client
with one Fetch in flight (the Java consumer) waits for that read every time. When a
Fetch had to go to the store for a partition, the handler asks for the objects holding
the partition's *next* `max_bytes` to be brought into the cache in the background, so
the consumer's next Fetch finds them there. A Fetch that reaches an object brought in
this way asks for the stretch after it, so the cache stays ahead of the consumer until it
reaches the head of the partition.

Best effort and bounded: requests wait in a queue of `QUEUE` (a request that does not
fit is dropped and counted), `WORKERS` tasks serve them, an object already cached or
being read is not read again, and a failure is logged and forgotten (the Fetch that
needs the object then reads it itself). Objects are read whole, so an object holding
many partitions serves a consumer of all of them with one GET.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from metadata import keys
from metadata.chunk_cache import ChunkCache, read_chunks_cached
from metadata.kv import KV
from storage.cache import ObjectCache
from storage.objectstore import ObjectStore

logger = logging.getLogger(__name__)

QUEUE = 64
WORKERS = 2
ENTRIES_PER_READ = 16
REMEMBERED = 1024  # objects read ahead that a Fetch may still reach

_Request = tuple[bytes, int, int, int]  # topic id, partition, from offset, max bytes


class ReadAhead:
    def __init__(
        self,
        kv: KV,
        sub: keys.Subspace,
        store: ObjectStore,
        cache: ObjectCache,
        chunks: ChunkCache,
    ) -> None:
        self._kv = kv
        self._chunks = chunks
        self._sub = sub
        self._store = store
        self._cache = cache
        self._send, self._receive = anyio.create_memory_object_stream[_Request](QUEUE)
        self._reading: set[str] = set()
        self._queued: set[tuple[bytes, int, int]] = set()
        self._read_ahead_objects: OrderedDict[str, None] = OrderedDict()
        self.stats: dict[str, int] = {"requests": 0, "dropped": 0, "objects": 0, "failures": 0}

    def was_read_ahead(self, object_key: str) -> bool:
        """Whether this object came into the cache by read-ahead (recently): a Fetch that
        reaches it is still catching up, so the next stretch should follow."""
        return object_key in self._read_ahead_objects

    def request(self, topic_id: bytes, partition: int, from_offset: int, max_bytes: int) -> None:
        """Bring the objects of the partition's max_bytes from from_offset into the cache."""
        key = (topic_id, partition, from_offset)
        if key in self._queued:
            return
        try:
            self._send.send_nowait((topic_id, partition, from_offset, max_bytes))
        except anyio.WouldBlock:
            self.stats["dropped"] += 1
            return
        self._queued.add(key)
        self.stats["requests"] += 1

    async def run(self) -> None:
        """The workers; run for the life of the agent in its root task group."""
        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(self._worker, self._receive.clone())

    async def _worker(self, receive: MemoryObjectReceiveStream[_Request]) -> None:
        async with receive:
            async for topic_id, partition, from_offset, max_bytes in receive:
                self._queued.discard((topic_id, partition, from_offset))
                try:
                    await self._read_ahead(topic_id, partition, from_offset, max_bytes)
                except Exception as exc:  # best effort: the Fetch reads it itself
                    self.stats["failures"] += 1
                    logger.debug("read-ahead of partition %d failed: %s", partition, exc)

    async def _read_ahead(
        self, topic_id: bytes, partition: int, from_offset: int, max_bytes: int
    ) -> None:
        entries = await self._kv.read(
            lambda tr: read_chunks_cached(
                tr,
                self._chunks,
                self._sub,
                topic_id,
                partition,
                from_offset,
                ENTRIES_PER_READ,
                max_bytes,
            ),
            quick=True,
        )
        for object_key in dict.fromkeys(e.object_key for e in entries):
            if object_key in self._cache or object_key in self._reading:
                continue
            self._reading.add(object_key)
            try:
                data = await self._store.get(object_key)
            finally:
                self._reading.discard(object_key)
            self._cache.put(object_key, data)
            self.stats["objects"] += 1
            self._read_ahead_objects[object_key] = None
            if len(self._read_ahead_objects) > REMEMBERED:
                self._read_ahead_objects.popitem(last=False)
