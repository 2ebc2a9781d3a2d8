"""A consumer reading behind the cache gets the next stretch read ahead for it."""

from __future__ import annotations

import json
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
