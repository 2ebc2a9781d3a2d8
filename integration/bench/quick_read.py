"""What one quick read of the SQLite metadata store costs the calling thread.

    .venv/bin/python integration/bench/quick_read.py [--label L] [--reads 20000]
        [--rounds 5] [--out FILE.jsonl]

A Fetch's metadata read is a quick read (`SQLiteKV.read(fn, quick=True)`): one point
read and one short range on the event loop's thread. This times that shape of read on
a store of 2,000 keys, `--rounds` rounds of `--reads` reads each after 2,000 to warm
up, and prints the microseconds per read of each round and the best. To compare two
trees, run it with each tree first on PYTHONPATH, in turns. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.append(str(Path(__file__).resolve().parents[2]))  # after PYTHONPATH
from metadata.sqlite_kv import SQLiteKV  # noqa: E402


async def measure(reads: int, rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        kv = SQLiteKV(Path(folder) / "kv.db")
        await kv.transact(lambda tr: [tr.set(b"k%05d" % i, b"x" * 40) for i in range(2000)])

        def fn(tr):  # type: ignore[no-untyped-def]
            return tr.get(b"k00010"), tr.get_range(b"k00100", b"k00104")

        for _ in range(2000):
            await kv.read(fn, quick=True)
        per_read = []
        for _ in range(rounds):
            began = time.perf_counter()
            for _ in range(reads):
                await kv.read(fn, quick=True)
            per_read.append((time.perf_counter() - began) / reads * 1e6)
        assert kv.stats["quick_reads"] == 2000 + reads * rounds, kv.stats
        await kv.aclose()
    return per_read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="")
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    per_read = anyio.run(measure, args.reads, args.rounds)
    line = {
        "label": args.label,
        "us_per_read": [round(x, 1) for x in per_read],
        "best_us": round(min(per_read), 1),
    }
    print(json.dumps(line))
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
