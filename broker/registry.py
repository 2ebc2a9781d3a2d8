"""The supervisor's word to the metadata store: an agent it saw die is gone.

An agent deregisters itself when it stops; one killed (SIGKILL, the OOM killer, a crash)
cannot, and the others would go on naming it leader of its partitions, sending clients to
a closed port, until its lease ran out. Its supervisor learns of the death at once
(SIGCHLD) and deregisters it then.

Rules:
- Only a process that has ended and been reaped is deregistered: it can write no more
  (with FoundationDB, a renewal of its still in flight conflicts with the clear, since a
  renewal reads every lease).
- The supervisor deregisters before it schedules the restart, so the clear never lands
  after the restarted agent has registered anew. The restarted agent keeps the node id
  of its address.
- The store is opened when the supervisor starts and kept until it stops, so that a
  death costs one small transaction: clients refresh their Metadata the moment their
  connection breaks, and a clear that lands within milliseconds is what they see. A
  store that cannot be opened then is tried again at the next death.
"""

from __future__ import annotations

import logging

import anyio

from metadata import cluster, keys
from metadata.kv import KV, open_kv

logger = logging.getLogger(__name__)


class AgentRegistry:
    """Deregisters the agents of one host by port; `addresses` maps each agent's port to
    its primary advertised address (host, port), which it registers under."""

    def __init__(
        self, metadata_url: str, cluster_name: str, addresses: dict[int, tuple[str, int]]
    ) -> None:
        self.metadata_url = metadata_url
        self.sub = keys.cluster_subspace(cluster_name)
        self.addresses = addresses
        self._kv: KV | None = None
        try:
            self._store()
        except Exception as exc:
            logger.warning("metadata store not opened yet (%s); it will be at the next death", exc)

    def _store(self) -> KV:
        if self._kv is None:
            self._kv = open_kv(self.metadata_url)
        return self._kv

    def forget(self, port: int) -> None:
        """Deregister the agent on `port`, which has died."""
        host, advertised_port = self.addresses[port]
        node_id = self._store().transact_sync(
            lambda tr: cluster.deregister_address(tr, self.sub, host, advertised_port)
        )
        if node_id is not None:
            logger.info("deregistered agent %d (%s:%d)", node_id, host, advertised_port)

    def close(self) -> None:
        if self._kv is not None:
            anyio.run(self._kv.aclose)
            self._kv = None
