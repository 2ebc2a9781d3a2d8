"""The agent's server: its listeners, its background loops and its lifetime.

Each accepted connection is served by `broker.connection.handle_connection`. Every
background loop belongs to the agent's root task group and stops with it, on
cancellation or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import errno
import logging
import signal
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio
import anyio.abc

from broker import metrics, ripcord, stats
from broker.agent import Agent
from broker.config import BrokerConfig
from broker.connection import handle_connection
from broker.handlers import load_all
from broker.listeners import format_listeners
from metadata.kv import KVError

logger = logging.getLogger(__name__)

LISTEN_RETRY_SECONDS = 3.0


async def run_agent(config: BrokerConfig, *, ready: Any = None) -> None:
    """Serve one agent until cancelled (or SIGTERM/SIGINT)."""
    # Signals are received until the agent has deregistered and closed: a Ctrl-C or a
    # systemd stop reaches the agent and its supervisor, which forwards SIGTERM, and that
    # second signal would otherwise meet the default action and kill it halfway.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        await _serve(config, signals, ready)


async def _serve(config: BrokerConfig, signals: AsyncIterator[int], ready: Any) -> None:
    load_all()
    agent = Agent.open(config)
    try:
        try:
            await agent.register()
        except KVError as exc:
            if not config.ripcord:
                raise
            snapshot = await ripcord.read_snapshot(agent)
            if snapshot is None:
                raise SystemExit(
                    f"the metadata store is unreachable ({exc}) and the object store holds"
                    " no Ripcord snapshot: the agent cannot start"
                ) from None
            agent.start_from_snapshot(snapshot)
        # The metrics port first: one in use stops the start before any Kafka port
        # listens, so an agent whose Kafka port answers has its /healthz too.
        http = (
            await _listen(config.host, config.metrics_port, "the metrics port")
            if config.metrics_port
            else None
        )
        sockets = [
            await _listen(listener.host or None, listener.port, str(listener))
            for listener in config.bound_listeners
        ]
        logger.info(
            "bucketlog agent %d listening on %s (cluster %s, metadata %s, storage %s)",
            agent.node_id,
            format_listeners(config.bound_listeners),
            agent.cluster_id,
            config.resolved_metadata_url,
            config.resolved_storage_url,
        )
        if agent.authorizer is not None:  # loaded before any request is served
            try:
                await agent.reload_acls(if_changed=False)
            except KVError as exc:  # a Ripcord start: the ACL loop loads them later
                logger.warning(
                    "ACLs unreadable (%s): every resource is treated as one without ACLs"
                    " until the metadata store answers",
                    exc,
                )
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.pipeline.run)
            tg.start_soon(agent.journal.run)
            tg.start_soon(agent.journal_sweep.run, agent.store_failure)
            tg.start_soon(agent.read_ahead.run)
            tg.start_soon(agent.lease_loop)
            tg.start_soon(agent.peer_probe_loop)
            tg.start_soon(agent.watermark_loop)
            tg.start_soon(agent.transaction_timeout_loop)
            if agent.authorizer is not None:
                tg.start_soon(agent.acl_loop)
            tg.start_soon(agent.groups.run)
            tg.start_soon(agent.lifecycle.run)
            if agent.compaction_process is not None:
                tg.start_soon(agent.compaction_process.run)
            else:
                tg.start_soon(agent.compaction.run)
            tg.start_soon(agent.cleaning.run)
            tg.start_soon(stats.stats_loop, agent, stats.stats_path(config.data_dir, config.port))
            if config.ripcord:
                tg.start_soon(ripcord.snapshot_loop, agent)
            if http is not None:
                tg.start_soon(metrics.serve_http, agent, http)
            tg.start_soon(_stop_on_signals, signals, tg.cancel_scope)

            for listener, sock in zip(config.bound_listeners, sockets, strict=True):
                tg.start_soon(sock.serve, partial(handle_connection, agent, listener=listener))
            if ready is not None:
                ready()
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await agent.deregister()
            except KVError as exc:  # the store is unreachable: the lease runs out instead
                logger.warning("deregistration failed: %s", exc)
            except Exception:
                logger.exception("deregistration failed")
            await agent.aclose()


async def _listen(
    host: str | None, port: int, name: str = ""
) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    """Listen on host:port (host None: every interface). A port that is in use is tried
    again for a while: an outgoing connection may hold it for a moment (a peer's probe
    of this agent's address, registered just before, may have connected a socket to
    itself there)."""
    give_up = time.monotonic() + LISTEN_RETRY_SECONDS
    while True:
        try:
            return await anyio.create_tcp_listener(local_host=host, local_port=port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > give_up:
                where = name or f"{host}:{port}"
                raise SystemExit(f"cannot listen on {where}: {exc.strerror}") from None
        await anyio.sleep(0.1)


async def _stop_on_signals(signals: AsyncIterator[int], scope: anyio.CancelScope) -> None:
    async for signum in signals:
        logger.info("received signal %d, stopping", signum)
        scope.cancel()
        return


async def serve(config: BrokerConfig, *, ready: Any = None) -> None:
    """Serve one agent until cancelled, without signal handling: for an agent run in a
    thread of another program (broker.testing)."""
    await _serve(config, _no_signals(), ready)


async def _no_signals() -> AsyncIterator[int]:
    await anyio.sleep_forever()
    yield 0  # never reached: the iterator only ends with its task
