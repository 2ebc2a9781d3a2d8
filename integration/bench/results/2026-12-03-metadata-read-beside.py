"""A consume-1p Fetch's metadata read, timed beside what else an agent does.

    .venv/bin/python integration/bench/results/2026-12-03-metadata-read-beside.py \
        METADATA_DB {none,write,copy,both}

METADATA_DB as for 2026-12-03-metadata-read.py (a running agent's, holding c1p-0). The
read is the same (the chunk cache kept; reading forward 1,000 offsets at a time, it
reads the entries in about a quarter of the reads); only the read's own CPU is timed.
`write`: another thread commits a key every 5 ms meanwhile (as produce commits do);
`copy`: 4 MiB are copied between reads (as an answer's copy into the socket goes
through the CPU's caches); `both`: the two.
"""

import asyncio
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from metadata import keys, txns  # noqa: E402
from metadata import log as L  # noqa: E402
from metadata import topics as T  # noqa: E402
from metadata.chunk_cache import ChunkCache, read_chunks_cached  # noqa: E402
from metadata.kv import open_kv  # noqa: E402

kv = open_kv(f"sqlite:///{sys.argv[1]}")
mode = sys.argv[2]
sub = keys.cluster_subspace("default")
tid = kv.read_sync(lambda tr: T.get_topic(tr, sub, "c1p-0")).topic_id
done = threading.Event()
junk = bytearray(4 << 20)


def writer() -> None:
    i = 0
    while not done.is_set():
        kv.transact_sync(lambda tr, i=i: tr.set(b"\xfeprobe", str(i).encode()))
        i += 1
        time.sleep(0.005)


async def main() -> None:
    if mode in ("write", "both"):
        threading.Thread(target=writer, daemon=True).start()
    cache = ChunkCache()
    at = [0]

    def txn(tr):  # type: ignore[no-untyped-def]
        s = L.get_partition(tr, sub, tid, 0)
        txns.last_stable_offset(tr, sub, tid, 0, s.high_watermark)
        return read_chunks_cached(
            tr, cache, sub, tid, 0, at[0], 16, 1048576, s.high_watermark, wider=4
        )

    await kv.read(txn, quick=True)
    for _ in range(3):
        n, spent = 2000, 0.0
        for i in range(n):
            at[0] = (i * 1000) % 290000
            if mode in ("copy", "both"):
                bytes(junk)
            began = time.thread_time()
            await kv.read(txn, quick=True)
            spent += time.thread_time() - began
        print(mode, round(spent / n * 1e6, 1), "us", dict(cache.stats), flush=True)
    done.set()


asyncio.run(main())
