"""The object lifecycle survives kill -9 at any of its steps.

The agent is killed (SIGKILL, by a fault point: `broker/faults.py`) in the middle of a
retention pass, a garbage collection pass or a compaction job; started again on the same stores, it
finishes the work: every object nothing names is deleted, and every record at or above
the log start offset reads back exactly.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.clients_support import set_topic_configs
from tests.e2e.test_retention import (
    DELETE_DELAY_MS,
    FAST,
    consume_from_start,
    create,
    offsets,
    produce_each,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.mark.parametrize(
    ("fault", "objects_left"),
    [
        ("retention.after_step", 8),  # entries dropped, nothing deleted yet
        ("gc.before_delete", 8),
        ("gc.after_delete", 3),  # deleted from the store, still queued in metadata
    ],
)
def test_a_pass_killed_midway_is_finished_after_a_restart(
    start_broker, tmp_path, fault, objects_left
):
    data_dir = tmp_path / "data"
    broker = start_broker(extra_args=FAST, data_dir=data_dir, env={"BUCKETLOG_FAULT_POINTS": fault})
    # Retention set once every record is in: a pass coming sooner would kill the agent
    # while the test still produces.
    create(broker, "f")
    now = int(time.time() * 1000)
    produce_each(broker, "f", [b"old-%d" % i for i in range(5)], now - 60_000)
    produce_each(broker, "f", [b"new-%d" % i for i in range(3)], now + 60_000)
    set_topic_configs(broker.bootstrap, "f", {"retention.ms": "5000"})
    assert broker.proc is not None
    assert broker.proc.wait(30) == -signal.SIGKILL, "the fault point was not reached"
    assert len(broker.object_keys("ingest/")) == objects_left

    again = start_broker(extra_args=FAST, data_dir=data_dir, port=broker.port)
    assert offsets(again, "f") == (5, 8)
    wait_for("the dropped records' objects deleted", lambda: len(again.object_keys("ingest/")) == 3)
    # The metadata forgot the deleted objects too; passes go on and delete nothing more.
    wait_for(
        "deleted objects forgotten",
        lambda: again.stats().get("lifecycle", {}).get("cluster_objects") == 3,
    )
    time.sleep(DELETE_DELAY_MS / 1000)
    assert len(again.object_keys("ingest/")) == 3
    got = consume_from_start(again, "f", 3)
    assert got == [(5 + i, b"new-%d" % i) for i in range(3)]


@pytest.mark.parametrize(
    ("fault", "outputs_left"),
    [
        ("compaction.after_plan", 0),  # inputs claimed, nothing written
        ("compaction.after_upload", 1),  # an output no metadata names
        ("compaction.after_commit", 1),  # committed, its inputs not yet deleted
    ],
)
def test_a_compaction_killed_midway_is_finished_after_a_restart(
    start_broker, tmp_path, fault, outputs_left
):
    from tests.e2e.test_compaction import (
        COMPACT,
        OFF,
        produce_flushes,
        read_records,
        referenced_objects,
    )

    data_dir = tmp_path / "data"
    sweep = ["--orphan-sweep-interval-ms", "300", "--orphan-min-age-ms", "3000"]
    broker = start_broker(extra_args=OFF, data_dir=data_dir)
    create(broker, "f", 2)
    expected = produce_flushes(broker, {"f": 2}, flushes=8)
    broker.stop()

    killed = start_broker(
        extra_args=[*COMPACT, *sweep],
        data_dir=data_dir,
        port=broker.port,
        env={"BUCKETLOG_FAULT_POINTS": fault},
    )
    assert killed.proc is not None
    assert killed.proc.wait(30) == -signal.SIGKILL, "the fault point was not reached"
    assert len(killed.object_keys("compacted/")) == outputs_left
    assert len(killed.object_keys("ingest/")) == 8

    # Started again: the claims of the killed agent expire, the jobs run again, the
    # replaced ingest files are deleted after the delay and an orphan output is swept.
    again = start_broker(extra_args=[*COMPACT, *sweep], data_dir=data_dir, port=broker.port)
    wait_for("ingest files deleted", lambda: again.object_keys("ingest/") == [], timeout=60)
    # 8 ingest files, 4 a job: two level-1 objects, and nothing else in the store.
    wait_for(
        "no object left over",
        lambda: (
            set(again.object_keys("compacted/")) == referenced_objects(again)
            and len(referenced_objects(again)) == 2
        ),
        timeout=30,
    )
    assert offsets(again, "f", 0) == offsets(again, "f", 1) == (0, 24)
    assert read_records(again, "f", 2, 48) == {p: expected["f", p] for p in range(2)}
