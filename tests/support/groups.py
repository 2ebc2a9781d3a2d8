"""Raw consumer-group requests for end-to-end tests: one request, one answer, exact codes."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema

from broker.entities import build
from tests.e2e.rawclient import roundtrip

FIND_COORDINATOR, JOIN, HEARTBEAT, LEAVE, SYNC = 10, 11, 12, 13, 14
OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE, LIST, DELETE, OFFSET_DELETE = 8, 9, 15, 16, 42, 47


def request(api_key: int, version: int, **fields: Any) -> Any:
    return build(load_request_schema(api_key, version), fields)


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 (topics, no user data)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment(topic: str, partitions: list[int]) -> bytes:
    """A ConsumerProtocolAssignment v0."""
    out = struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", -1)


def join(
    port: int,
    group: str,
    member_id: str = "",
    *,
    version: int = 9,
    session_ms: int = 10_000,
    rebalance_ms: int = 10_000,
    instance: str | None = None,
    protocol_type: str = "consumer",
    protocols: list[tuple[str, bytes]] | None = None,
    topics: tuple[str, ...] = ("t",),
) -> Any:
    if protocols is None:
        protocols = [("range", subscription(*topics))]
    return roundtrip(
        port,
        request(
            JOIN,
            version,
            group_id=group,
            session_timeout=session_ms,
            rebalance_timeout=rebalance_ms,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type=protocol_type,
            protocols=[{"name": n, "metadata": m} for n, m in protocols],
            reason=None,
        ),
    )


def join_member(port: int, group: str, **kw: Any) -> Any:
    """JoinGroup v4+ twice: first for the member id, then for real."""
    first = join(port, group, **kw)
    if first.error_code != 79:
        return first
    return join(port, group, first.member_id, **kw)


def sync(
    port: int,
    group: str,
    generation: int,
    member_id: str,
    assignments: dict[str, bytes] | None = None,
    *,
    version: int = 5,
    instance: str | None = None,
    protocol_type: str | None = "consumer",
    protocol_name: str | None = "range",
) -> Any:
    return roundtrip(
        port,
        request(
            SYNC,
            version,
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignments=[{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
        ),
    )


def heartbeat(port: int, group: str, generation: int, member_id: str, *, version: int = 4) -> int:
    answer = roundtrip(
        port,
        request(
            HEARTBEAT,
            version,
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=None,
        ),
    )
    return int(answer.error_code)


def commit(
    port: int,
    group: str,
    generation: int,
    member_id: str,
    offsets: dict[tuple[str, int], int],
    *,
    version: int = 9,
    metadata: str | None = "",
    leader_epoch: int = -1,
    retention_ms: int = -1,
) -> dict[tuple[str, int], int]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": leader_epoch,
                "committed_metadata": metadata,
            }
        )
    answer = roundtrip(
        port,
        request(
            OFFSET_COMMIT,
            version,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member_id,
            group_instance_id=None,
            retention_time=retention_ms,
            topics=[{"name": t, "partitions": p} for t, p in by_topic.items()],
        ),
    )
    return {
        (t.name, p.partition_index): int(p.error_code) for t in answer.topics for p in t.partitions
    }


def fetch_offsets(
    port: int,
    group: str,
    partitions: dict[str, list[int]] | None,
    *,
    version: int = 9,
    require_stable: bool = False,
) -> tuple[int, dict[tuple[str, int], tuple[int, int, str | None, int]]]:
    """(group error, {(topic, partition): (offset, leader epoch, metadata, error)})."""
    topics = (
        None
        if partitions is None
        else [{"name": t, "partition_indexes": ps} for t, ps in partitions.items()]
    )
    if version >= 8:
        answer = roundtrip(
            port,
            request(
                OFFSET_FETCH,
                version,
                groups=[
                    {"group_id": group, "member_id": None, "member_epoch": -1, "topics": topics}
                ],
                require_stable=require_stable,
            ),
        )
        (group_answer,) = answer.groups
        error, topics_answer = group_answer.error_code, group_answer.topics
    else:
        answer = roundtrip(
            port,
            request(
                OFFSET_FETCH, version, group_id=group, topics=topics, require_stable=require_stable
            ),
        )
        error, topics_answer = getattr(answer, "error_code", 0), answer.topics
    return int(error), {
        (t.name, p.partition_index): (
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", -1)),
            p.metadata,
            int(p.error_code),
        )
        for t in topics_answer
        for p in t.partitions
    }


def find_coordinator(port: int, key: str, *, version: int = 3, key_type: int = 0) -> Any:
    return roundtrip(
        port,
        request(FIND_COORDINATOR, version, key=key, key_type=key_type, coordinator_keys=[key]),
    )


def wait_for_agents(ports: list[int], timeout: float = 20) -> None:
    """Until every agent lists them all (a Metadata request also renews an agent's view)."""

    def everyone_sees_everyone() -> bool:
        for port in ports:
            answer = roundtrip(
                port,
                request(
                    3,
                    9,
                    topics=[],
                    allow_auto_topic_creation=False,
                    include_cluster_authorized_operations=False,
                    include_topic_authorized_operations=False,
                ),
            )
            if sorted(b.port for b in answer.brokers) != sorted(ports):
                return False
        return True

    wait_until(everyone_sees_everyone, timeout)


def coordinator_port(port: int, group: str) -> int:
    return int(find_coordinator(port, group).port)


def group_coordinated_by(ports: list[int], wanted_port: int, prefix: str) -> str:
    """A group id whose coordinator is the agent listening on `wanted_port`."""
    for i in range(1000):
        group = f"{prefix}-{i}"
        if coordinator_port(ports[0], group) == wanted_port:
            return group
    raise AssertionError("no group id hashes to that agent")


class Background:
    """Run a blocking call (a parked JoinGroup, say) in a thread; get its result later."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported by get()
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self, timeout: float = 30) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not return in time"
        if self.error is not None:
            raise self.error
        return self.result


def wait_until(condition: Callable[[], bool], timeout: float = 20, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")
