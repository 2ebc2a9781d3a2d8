"""The agent's allocator settings: large buffers are reused instead of faulted in anew."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Large short-lived buffers as the data path makes them: four 256 KiB chunks read, each
# copied, joined, then framed. Prints the minor page faults per round.
PATTERN = """
import resource, sys
sys.path.insert(0, {root!r})
if {tune}:
    from broker.memory import tune_allocator
    print(",".join(tune_allocator()))
else:
    print("")
src = memoryview(bytes(range(256)) * 5000)
def answer():
    chunks = [bytes(src[i * 1000 : i * 1000 + 262144]) for i in range(4)]
    rebased = [b"".join([b"12345678", c[8:]]) for c in chunks]
    records = b"".join(rebased)
    return b"".join([b"head", records, b"tail"])
for _ in range(20):
    answer()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    answer()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the allocator settings apply to glibc on Linux only",
)


def _faults(tune: bool) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PATTERN.format(root=str(ROOT), tune=tune)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.split("\n")
    return out[0], float(out[1])


@glibc
def test_tuned_allocator_reuses_large_buffers() -> None:
    applied, tuned = _faults(tune=True)
    assert applied == "malloc_mmap_threshold,malloc_trim_threshold,malloc_arena_max"
    # 4 MiB allocated per answer; faulting it all in would be ~1000 faults.
    assert tuned < 10, f"{tuned} page faults per answer with the tuned allocator"


@glibc
def test_default_allocator_faults_on_the_same_pattern() -> None:
    # The reason for the setting: without it the same work faults its pages in anew.
    _applied, untuned = _faults(tune=False)
    assert untuned > 100


@glibc
def test_operator_settings_take_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import memory

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "524288")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.tune_allocator() == []


def test_full_collections_are_counted_and_timed() -> None:
    import gc

    from broker.memory import GarbageCollections

    collections = GarbageCollections()
    collections.install()
    try:
        gc.collect(2)
        gc.collect(1)  # not a full collection
        gc.collect(2)
    finally:
        collections.uninstall()
    gc.collect(2)  # no longer counted
    stats = collections.stats()
    assert stats["full_collections"] == 2
    assert stats["full_collection_us"] >= stats["longest_full_collection_us"] > 0


def test_the_frozen_objects_are_counted_once_when_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stats report the count taken at freeze_startup_heap; they do not walk the
    frozen objects again each time they are read."""
    import gc

    from broker import memory

    # No other thread runs between the freeze and the count: one that runs there can
    # free frozen objects (an idle worker thread of an earlier test, ending, or a
    # metadata store's checkpoint thread, waking). A thread that already waits for the
    # GIL asks for it after the interval it began waiting with: the sleep lets those
    # run first, and any that wait later do so for 1,000 s.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    time.sleep(0.05)
    try:
        frozen = memory.freeze_startup_heap()
        counted = gc.get_freeze_count()
    finally:
        sys.setswitchinterval(switch_interval)
    try:
        assert frozen == counted > 0

        def walked() -> int:
            raise AssertionError("the stats walked the frozen objects")

        monkeypatch.setattr(gc, "get_freeze_count", walked)
        assert memory.COLLECTIONS.stats()["frozen_objects"] == frozen
    finally:
        monkeypatch.undo()
        gc.unfreeze()
