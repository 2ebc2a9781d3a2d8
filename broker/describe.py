"""How the cluster is described to clients: its brokers, and each partition's leader.

There is no replication: every partition's only replica is its leader, always in sync,
with one leader epoch forever. Shared by Metadata, DescribeCluster and
DescribeTopicPartitions.

A client that names its zone (broker.zones) is given leaders among its zone's live
agents, and only those agents as brokers, when its zone has any. A lightning topic's
partitions keep the one leader every client is given, the agent that alone answers their
produces (broker.journal), as does every topic while the metadata store is unreachable
in Ripcord mode (every produce then takes the lightning path); an agent named leader of
such a partition is listed as a broker too, in or out of the client's zone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from broker import placement
from broker.context import AgentServices
from broker.topic_configs import LIGHTNING, TOPIC_TYPE
from metadata import topics as topics_layer

NO_AUTHORIZED_OPERATIONS = -(2**31)
ZERO_UUID = uuid.UUID(int=0)


def partition_entries(
    agent: AgentServices, topic: topics_layer.Topic, zone: str | None = None
) -> list[dict[str, Any]]:
    """The topic's partitions as a client of `zone` is told of them."""
    if zone is not None and (
        agent.in_outage() or agent.topic_config(topic, TOPIC_TYPE) == LIGHTNING
    ):
        zone = None  # one leader for every client (see module)
    agents = agent.serving_agents(zone)  # read once for all the topic's partitions
    entries = []
    for p in range(topic.partitions):
        leader = placement.leader_for(topic.topic_id, p, agents).node_id
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


def broker_entries(
    agent: AgentServices,
    listener: str,
    zone: str | None = None,
    leaders: Iterable[int] = (),
) -> list[dict[str, Any]]:
    """The live agents a client of `zone` is sent to, and those of `leaders` (partition
    leaders named to it), each at its address on `listener` (the one the request came in
    on); an agent without that listener is left out, as Kafka leaves out brokers."""
    if zone is None:
        agents = agent.live_agents()
    else:
        agents = agent.serving_agents(zone)
        named = {a.node_id for a in agents}
        wanted = set(leaders) - named
        if wanted:
            agents = [a for a in agent.live_agents() if a.node_id in named or a.node_id in wanted]
    entries = []
    for a in agents:
        endpoint = a.endpoint(listener)
        if endpoint is not None:
            host, port = endpoint
            entries.append({"node_id": a.node_id, "host": host, "port": port, "rack": a.rack})
    return entries
