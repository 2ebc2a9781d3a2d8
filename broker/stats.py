"""The agent's counters, written once a second to `<data-dir>/stats-<port>.json`.

For benchmarks and operators: objects PUT and GET, cache hits, flushes, metadata
transactions, the object lifecycle and compaction, the connections' expected events
(bad input, clients gone, refused authentications), and authentication successes and
failures by mechanism. The file is replaced atomically (write, then rename), only
when a counter changed, so a reader never sees half of it; writing it costs one small
file per second.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import anyio

from broker import memory
from broker.agent import Agent

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 1.0


def snapshot(agent: Agent) -> dict[str, Any]:
    """Every counter of the agent, as plain JSON values."""
    body: dict[str, Any] = {
        "pipeline": dataclasses.asdict(agent.pipeline.stats),
        "journal": {
            **dataclasses.asdict(agent.journal.stats),
            **dataclasses.asdict(agent.journal.journal_stats),
        },
        "store": dict(getattr(agent.store, "stats", {})),
        "cache": dict(agent.cache.stats),
        "reader": dict(agent.reader.stats),
        "read_ahead": dict(agent.read_ahead.stats),
        "disk_cache": (
            {**agent.disk_cache.stats, "held_bytes": agent.disk_cache.held_bytes}
            if agent.disk_cache is not None
            else {}
        ),
        "chunk_cache": dict(agent.chunks.stats),
        "metadata": dict(getattr(agent.kv, "stats", {})),
        # The store's reachability as the lease loop last found it (broker.ripcord).
        "ripcord": {
            "enabled": agent.config.ripcord,
            "metadata_reachable": agent.metadata_reachable,
        },
        "connections": dict(agent.events.counts),
        # Authentication successes and failures by mechanism (SSL: client certificates).
        "authentication": agent.auth.stats.snapshot(),
        "lifecycle": dict(agent.lifecycle.stats),
        "compaction": dataclasses.asdict(agent.compaction.stats),
        "cleaning": dataclasses.asdict(agent.cleaning.stats),
        "request_memory": {
            "in_use": agent.request_memory.in_use,
            **agent.request_memory.stats,
        },
        # The process's garbage collector (broker.memory): zero until the agent installs it.
        "gc": memory.COLLECTIONS.stats(),
    }
    if agent.compaction_process is not None:  # --compaction-process
        body["compaction_process"] = dataclasses.asdict(agent.compaction_process.stats)
    if agent.hedge is not None:
        body["put_hedge"] = dataclasses.asdict(agent.hedge.stats)
    if agent.authorizer is not None:  # --authorizer: the ACLs loaded, denials by resource
        body["authorization"] = {
            **dataclasses.asdict(agent.authorizer.stats),
            "super_users": len(agent.authorizer.super_users),
        }
    injected = getattr(agent.store, "injected_stats", None)
    if injected is not None:  # --inject-put-latency-ms (benchmarks): storage.injected
        body["store_injected"] = dict(injected)
    return body


def stats_path(data_dir: str, port: int) -> str:
    return os.path.join(data_dir, f"stats-{port}.json")


def _write(path: str, text: str) -> None:
    """In a worker thread: the file's open, write and rename each give up the GIL,
    and on the event loop each would wait to take it back behind the flushes' commits
    (1-4 ms at half load, up to 12)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


async def stats_loop(agent: Agent, path: str, interval: float = INTERVAL_SECONDS) -> None:
    """Write the counters to `path` every `interval` seconds while they change."""
    last: dict[str, Any] | None = None
    warned = False
    while True:
        counters = snapshot(agent)
        if counters != last:
            body = {"pid": os.getpid(), "node_id": agent.node_id, "time": time.time(), **counters}
            try:
                # dumps, not dump: dump to a file takes the pure-Python encoder
                await anyio.to_thread.run_sync(_write, path, json.dumps(body))
                last = counters
            except OSError as exc:  # a full or read-only disk must not stop the agent
                if not warned:
                    logger.warning("cannot write %s: %s", path, exc)
                    warned = True
        await anyio.sleep(interval)
