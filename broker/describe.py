"""How the cluster is described to clients: its brokers, and each partition's leader.

There is no replication: every partition's only replica is its leader, always in sync,
with one leader epoch forever. Shared by Metadata, DescribeCluster and
DescribeTopicPartitions.
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from broker.context import AgentServices
from metadata import topics as topics_layer

NO_AUTHORIZED_OPERATIONS = -(2**31)
ZERO_UUID = uuid.UUID(int=0)


def partition_entries(agent: AgentServices, topic: topics_layer.Topic) -> list[dict[str, Any]]:
    entries = []
    for p in range(topic.partitions):
        leader = agent.leader_for(topic.topic_id, p)
        entries.append(
            {
                "error_code": ErrorCode.none,
                "partition_index": p,
                "leader_id": leader,
                "leader_epoch": 0,
                "replica_nodes": [leader],
                "isr_nodes": [leader],
                "offline_replicas": [],
                # Kafka answers empty lists here, never null: the Java AdminClient (3.8+)
                # streams them in describeTopics and fails on null.
                "eligible_leader_replicas": [],
                "last_known_elr": [],
            }
        )
    return entries


def broker_entries(agent: AgentServices, listener: str) -> list[dict[str, Any]]:
    """The live agents, each at its address on `listener` (the one the request came in
    on); an agent without that listener is left out, as Kafka leaves out brokers."""
    entries = []
    for a in agent.live_agents():
        endpoint = a.endpoint(listener)
        if endpoint is not None:
            host, port = endpoint
            entries.append({"node_id": a.node_id, "host": host, "port": port, "rack": a.rack})
    return entries
