"""A broker inside the calling process, for other projects' tests.

    from broker.testing import running_broker

    with running_broker() as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
        ...

One agent on a free port of 127.0.0.1, its stores (SQLite, a local folder) in a fresh
temporary folder (or `data_dir`), served by its own event loop in a thread; gone, with
its folder, when the block ends. Options are BrokerConfig's fields
(`running_broker(default_partitions=3, auto_create_topics=False)`). Two defaults differ
from `bucketlog serve`'s, for tests: the flush interval is 1 ms, so that a produce is
answered at once, and a new group's first rebalance does not wait for more members
(group_initial_rebalance_delay_ms 0, as Kafka's own test setups have it).

pytest users get the fixture `kafka_broker` (broker.pytest_plugin, registered when this
package is installed): a running broker per test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from broker.config import BrokerConfig

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class RunningBroker:
    bootstrap: str  # "127.0.0.1:PORT", for bootstrap.servers
    host: str
    port: int
    data_dir: Path
    config: BrokerConfig


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running_broker(data_dir: str | Path | None = None, **options: Any) -> Iterator[RunningBroker]:
    """A broker serving until the block ends (see the module)."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bucketlog-"))
        fields = {f.name for f in dataclasses.fields(BrokerConfig)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise TypeError(f"not options of the broker: {', '.join(unknown)}")
        options.setdefault("flush_interval_ms", 1)
        options.setdefault("group_initial_rebalance_delay_ms", 0)
        host = options.pop("host", "127.0.0.1")
        port = options.pop("port", None) or _free_port(host)
        config = BrokerConfig(host=host, port=port, data_dir=str(data_dir), **options)
        agent = _AgentThread(config)
        agent.start()
        try:
            yield RunningBroker(f"{host}:{port}", host, port, Path(data_dir), config)
        finally:
            agent.stop()


class _AgentThread:
    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._scope: anyio.CancelScope | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"bucketlog-agent-{config.port}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the broker did not start within {START_TIMEOUT_S:g} s")
        if self._failure is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise RuntimeError(f"the broker did not start: {self._failure}") from self._failure

    def stop(self) -> None:
        if self._thread.is_alive() and self._scope is not None and self._token is not None:
            try:
                anyio.from_thread.run_sync(self._scope.cancel, token=self._token)
            except RuntimeError:  # its loop has ended already
                pass
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("the broker on port %d did not stop in time", self._config.port)

    def _main(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 -- handed to the starting thread
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        from broker.handlers import load_all
        from broker.server import serve

        load_all()
        with anyio.CancelScope() as scope:
            self._scope = scope
            self._token = anyio.lowlevel.current_token()
            await serve(self._config, ready=self._ready.set)
