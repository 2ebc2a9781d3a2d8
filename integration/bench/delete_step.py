"""What deleting packed objects costs the agent: one by one, as the garbage collector did
(store.delete, 16 at once), against delete_many (a batch of 100 per call, as it does now).

    .venv/bin/python integration/bench/delete_step.py [--objects 400] [--kib 320]
        [--rounds 3] [--dir DIR]

Each round writes OBJECTS packed objects of KIB KiB into a fresh local folder store (with
segment files, as an agent's ingest files), fsyncs them, and deletes them both ways in
turn (the order alternating between rounds): the process's CPU and the wall time per
object are printed for each. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import anyio

from storage.local import LocalObjectStore

BATCH = 100  # broker.lifecycle: the dead objects one garbage-collection step reads
AT_ONCE = 16  # how many deletes the collector had in flight, one by one


async def _fill(store: LocalObjectStore, objects: int, size: int) -> list[str]:
    data = os.urandom(size)
    keys = []
    for _ in range(objects):
        key = store.new_key("ingest/", size)
        await store.put(key, data, if_absent=True)
        keys.append(key)
    return keys


async def _one_by_one(store: LocalObjectStore, keys: list[str]) -> None:
    limiter = anyio.Semaphore(AT_ONCE)

    async def delete(key: str) -> None:
        async with limiter:
            await store.delete(key)

    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(delete, key)


async def _batched(store: LocalObjectStore, keys: list[str]) -> None:
    for at in range(0, len(keys), BATCH):
        failed = await store.delete_many(keys[at : at + BATCH])
        assert not failed, failed


async def _round(root: str, how: str, objects: int, size: int) -> tuple[float, float]:
    store = LocalObjectStore(os.path.join(root, how), segments=True)
    keys = await _fill(store, objects, size)
    os.sync()
    cpu, wall = time.process_time(), time.perf_counter()
    await (_one_by_one if how == "one by one" else _batched)(store, keys)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await store.aclose()
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=400)
    parser.add_argument("--kib", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="delete-step-", dir=args.dir)
    try:
        for r in range(args.rounds):
            ways = ["one by one", "delete_many"]
            for how in ways if r % 2 == 0 else ways[::-1]:
                cpu, wall = anyio.run(_round, os.path.join(root, str(r)), how, args.objects,
                                      args.kib * 1024)  # fmt: skip
                print(
                    f"round {r + 1} {how}: {cpu / args.objects * 1e6:.0f} us CPU, "
                    f"{wall / args.objects * 1e6:.0f} us wall per object"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
