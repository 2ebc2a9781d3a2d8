"""A consume-1p Fetch's metadata read, timed on its own.

    .venv/bin/python integration/bench/results/2026-12-03-metadata-read.py METADATA_DB

METADATA_DB: the SQLite metadata file of a running agent that holds the topic c1p-0 (one
partition, 300,000 records), e.g. one started by 2026-12-03-consume-1p-perf.py. The
read is the Fetch's: the partition's state, its last stable offset and up to 16 chunk
entries for a 1 MiB budget through a chunk cache (read 4 budgets ahead on a miss), as a
quick read on this thread; "hit" keeps the cache, "miss" empties it before each read.
"""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from metadata import keys, txns  # noqa: E402
from metadata import log as L  # noqa: E402
from metadata import topics as T  # noqa: E402
from metadata.chunk_cache import ChunkCache, read_chunks_cached  # noqa: E402
from metadata.kv import open_kv  # noqa: E402

kv = open_kv(f"sqlite:///{sys.argv[1]}")
sub = keys.cluster_subspace("default")
tid = kv.read_sync(lambda tr: T.get_topic(tr, sub, "c1p-0")).topic_id


async def main() -> None:
    for label, hit in (("hit", True), ("miss", False)):
        cache = ChunkCache()
        at = [0]

        def txn(tr, cache=cache, at=at, hit=hit):  # type: ignore[no-untyped-def]
            s = L.get_partition(tr, sub, tid, 0)
            lso = txns.last_stable_offset(tr, sub, tid, 0, s.high_watermark)
            if not hit:
                cache._runs.clear()
            entries = read_chunks_cached(
                tr, cache, sub, tid, 0, at[0], 16, 1048576, s.high_watermark, wider=4
            )
            return s, lso, entries

        await kv.read(txn, quick=True)
        for _ in range(3):
            n = 2000
            began = time.thread_time()
            for i in range(n):
                at[0] = (i * 1000) % 290000
                await kv.read(txn, quick=True)
            print(label, round((time.thread_time() - began) / n * 1e6, 1), "us")


asyncio.run(main())
