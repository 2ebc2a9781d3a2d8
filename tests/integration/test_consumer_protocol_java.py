"""The Java consumer with `group.protocol=consumer` (KIP-848) against bucketlog: three
console consumers of one group on a 12-partition topic get four partitions each (as
`kafka-consumer-groups --describe --members` shows them), read every record once between
them, and leave their offsets for `kafka-consumer-groups --describe`."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter

import pytest

from tests.integration.support import TOOLS, create_topic, produce, run_tool, unique_topic

pytestmark = pytest.mark.slow

PARTITIONS = 12
RECORDS = 240
BASE_TS = 1_730_000_000_000


@pytest.fixture(scope="module")
def bootstrap(jars, shared_broker) -> str:
    return shared_broker.bootstrap


def members_table(bootstrap: str, group: str) -> dict[str, int]:
    """kafka-consumer-groups --describe --members: client id -> number of partitions."""
    out = run_tool(
        "kafka-consumer-groups",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--group",
        group,
        "--members",
        check=False,
    ).stdout
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[0] == group and cols[-1].isdigit():
            rows[cols[-2]] = int(cols[-1])
    return rows


def test_java_consumers_share_the_partitions_evenly_and_read_everything_once(bootstrap):
    topic = create_topic(bootstrap, unique_topic("kip848-java"), PARTITIONS)
    group = unique_topic("kip848-java-group")
    consumers = [
        subprocess.Popen(
            [
                str(TOOLS / "kafka-console-consumer"),
                "--bootstrap-server",
                bootstrap,
                "--topic",
                topic,
                "--group",
                group,
                "--from-beginning",
                # Each stops once it has read its share (4 of the 12 partitions, asserted
                # below), or after a minute without a record; the member table is read
                # meanwhile with a JVM tool, slow on a loaded machine.
                "--max-messages",
                str(RECORDS // 3),
                "--timeout-ms",
                "60000",
                "--command-property",
                "group.protocol=consumer",
                "--command-property",
                f"client.id=java-{i}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KAFKA_JVM_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"},
        )  # fmt: skip
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 90
        members: dict[str, int] = {}
        while time.monotonic() < deadline:
            members = members_table(bootstrap, group)
            if sorted(members.values()) == [4, 4, 4]:
                break
            time.sleep(1)
        assert sorted(members.values()) == [4, 4, 4], members
        assert set(members) == {"java-0", "java-1", "java-2"}
        produced = produce(
            bootstrap,
            topic,
            [(i % PARTITIONS, BASE_TS + i, None, f"v{i}".encode(), ()) for i in range(RECORDS)],
        )
        outputs = [c.communicate(timeout=120) for c in consumers]
    finally:
        for c in consumers:
            if c.poll() is None:
                c.kill()
    lines = [line for out, _err in outputs for line in out.splitlines() if line.startswith("v")]
    seen = Counter(lines)
    assert set(seen) == {r.value.decode() for r in produced}
    assert [v for v, n in seen.items() if n > 1] == []
    # Each consumer read its own partitions: four of them, so about a third of the records.
    assert all(
        sum(1 for line in out.splitlines() if line.startswith("v")) == RECORDS // 3
        for out, _err in outputs
    ), [len(out.splitlines()) for out, _e in outputs]
    table = run_tool(
        "kafka-consumer-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group
    ).stdout
    rows = re.findall(
        rf"^{re.escape(group)}\s+{re.escape(topic)}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", table, re.M
    )
    assert len(rows) == PARTITIONS, table
    assert all(
        int(current) == int(end) == RECORDS // PARTITIONS for _p, current, end, _l in rows
    ), table
    listed = run_tool(
        "kafka-consumer-groups", "--bootstrap-server", bootstrap, "--list", "--type", "consumer"
    ).stdout
    assert group in listed.split()
