"""A consumer reading behind the cache gets the next stretch read ahead for it."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tests.e2e.rawclient import fetch_raw, produce_raw

OBJECTS = 24
VALUE = 100_000  # one ~100 KB batch per request: each becomes its own object


def _stats(data_dir: Any, port: int) -> dict[str, Any]:
    time.sleep(1.5)  # the agent writes its counters once a second
    return json.loads((data_dir / f"stats-{port}.json").read_text())


def test_catch_up_reads_come_from_the_cache_after_the_first(start_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir=data_dir)
    for i in range(OBJECTS):
        produce_raw(broker.port, "behind", 0, [(None, b"%03d" % i + b"x" * VALUE)])
    broker.stop()
    # A restarted agent has nothing cached: the consumer is behind the cache.
    restarted = start_broker(data_dir=data_dir, port=broker.port)
    seen: list[int] = []
    offset = 0
    while offset < OBJECTS:
        got = [
            o
            for o, _value in fetch_raw(
                restarted.port, "behind", 0, offset=offset, partition_max_bytes=250_000
            )
        ]
        assert got, f"nothing at offset {offset}"
        seen += got
        offset = got[-1] + 1
        time.sleep(0.2)  # the consumer works on its records; read-ahead runs meanwhile
    assert seen == list(range(OBJECTS))

    stats = _stats(data_dir, restarted.port)
    # Without read-ahead every Fetch reads its three or four objects from the store
    # itself (46 GETs here); with it the first Fetch or two do.
    assert stats["reader"]["gets"] <= 6, stats
    assert stats["read_ahead"]["objects"] >= OBJECTS - 4, stats
    assert stats["reader"]["cache_reads"] >= OBJECTS - 4, stats


LARGE = 128_000  # one record a flush; 96 flushes, 12 MB in one partition
MIB = 1024 * 1024


def test_a_catch_up_of_large_level_two_objects_reads_stretches_of_them(start_broker, tmp_path):
    from tests.e2e.test_compaction import objects_per_partition
    from tests.e2e.test_retention import wait_for

    data_dir = tmp_path / "data"
    writer = start_broker(extra_args=["--compaction", "false"], data_dir=data_dir)
    values = [b"%04d" % i + os.urandom(LARGE) for i in range(96)]
    for value in values:
        produce_raw(writer.port, "deep", 0, [(None, value)])
    writer.stop()
    # 96 ingest files -> 12 level-1 objects of 8 -> one level-2 object of 8 of them (8 MB)
    # and four level-1 objects waiting for more.
    compacting = start_broker(
        extra_args=[
            "--compaction-min-age-ms", "1",
            "--compaction-interval-ms", "200",
            "--compaction-max-inputs", "8",
            "--compaction-l2-max-inputs", "8",
        ],
        data_dir=data_dir,
        port=writer.port,
    )  # fmt: skip
    wait_for("level 2", lambda: objects_per_partition(compacting, "deep", 1) == [5], timeout=60)
    compacting.stop()

    # A 6 MiB cache cannot hold the 8 MB object whole: read-ahead brings 2 MiB stretches
    # of it (a third of the cache, one partition being read).
    reader = start_broker(
        extra_args=["--compaction", "false", "--cache-bytes", str(6 * MIB)],
        data_dir=data_dir,
        port=writer.port,
    )
    seen: list[bytes] = []
    while len(seen) < len(values):
        got = fetch_raw(reader.port, "deep", 0, offset=len(seen), partition_max_bytes=MIB)
        assert got and got[0][0] == len(seen), f"nothing at offset {len(seen)}"
        seen += [value or b"" for _offset, value in got]
        time.sleep(0.2)  # the consumer works on its records; read-ahead runs meanwhile
    assert seen == values

    stats = _stats(data_dir, reader.port)
    ahead = stats["read_ahead"]
    # Whole-object read-ahead could not cache the level-2 object, and every Fetch of it
    # would read from the store itself (about 10 GETs).
    assert ahead["ranges"] >= 3, stats
    assert stats["reader"]["gets"] <= 4, stats
    assert ahead["bytes"] <= 13_000_000, "each byte read ahead about once"
