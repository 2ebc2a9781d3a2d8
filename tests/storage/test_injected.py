"""The latency-injecting object store (storage/injected.py): each PUT (and GET, if asked)
waits its drawn delay first, without blocking the event loop, and counts it."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from metadata.injected_kv import Lognormal
from storage.injected import InjectedLatencyStore, put_ms_bucket
from storage.local import LocalObjectStore


def constant(seconds: float):  # type: ignore[no-untyped-def]
    return lambda: seconds


async def test_put_waits_its_delay_before_the_object_exists(tmp_path: Path) -> None:
    inner = LocalObjectStore(str(tmp_path / "objects"))
    store = InjectedLatencyStore(inner, put_delay=constant(0.3))
    ticks = 0
    seen_during: list[bool] = []

    async def watch() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1
            if ticks == 5:  # about 50 ms into the put's 300 ms delay
                seen_during.append(bool(await inner.list("k")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        started = time.monotonic()
        await store.put("k", b"data", if_absent=True)
        took = time.monotonic() - started
        tg.cancel_scope.cancel()
    assert took >= 0.3
    assert ticks >= 5 and seen_during == [False]  # the loop ran; the object was not there yet
    assert await inner.get("k") == b"data"
    stats = store.injected_stats
    assert stats["put_delays"] == 1 and stats["put_delay_us"] == 300_000
    assert stats["put_us"] >= 300_000
    assert stats["put_ms_le"] == {put_ms_bucket(stats["put_us"] / 1000): 1}
    assert store.stats["puts"] == 1  # the wrapped store's counters, as they are
    await store.aclose()


def test_put_sync_and_get_sync_wait_in_the_calling_thread(tmp_path: Path) -> None:
    store = InjectedLatencyStore(
        LocalObjectStore(str(tmp_path / "objects")),
        put_delay=constant(0.2),
        get_delay=constant(0.1),
    )
    started = time.monotonic()
    store.put_sync("k", b"data")
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    assert store.get_sync("k", 1, 3) == b"at"
    assert time.monotonic() - started >= 0.1
    stats = store.injected_stats
    assert (stats["put_delays"], stats["get_delays"]) == (1, 1)
    assert stats["get_delay_us"] == 100_000


async def test_without_a_get_delay_gets_delete_and_list_are_not_delayed(tmp_path: Path) -> None:
    store = InjectedLatencyStore(
        LocalObjectStore(str(tmp_path / "objects")), put_delay=constant(0.01)
    )
    await store.put("a", b"1")
    assert await store.get("a") == b"1"
    assert [info.key for info in await store.list()] == ["a"]
    await store.delete("a")
    stats = store.injected_stats
    assert stats["get_delays"] == 0 and stats["put_delays"] == 1
    await store.aclose()


def test_delays_are_drawn_from_the_model(tmp_path: Path) -> None:
    # The model's own distribution is tested in tests/metadata/test_injected_kv.py; here
    # each put draws one delay from it and the counters add up what was drawn.
    model, twin = Lognormal(2, 6, seed=5), Lognormal(2, 6, seed=5)
    store = InjectedLatencyStore(LocalObjectStore(str(tmp_path / "objects")), put_delay=model)
    for i in range(20):
        store.put_sync(f"k{i}", b"x")
    expected = sum(round(twin() * 1_000_000) for _ in range(20))
    assert store.injected_stats["put_delay_us"] == expected
    assert store.injected_stats["put_us"] >= expected


async def test_a_failed_put_still_counts_its_time(tmp_path: Path) -> None:
    from storage.objectstore import ObjectExistsError

    store = InjectedLatencyStore(
        LocalObjectStore(str(tmp_path / "objects")), put_delay=constant(0.05)
    )
    await store.put("k", b"1", if_absent=True)
    with pytest.raises(ObjectExistsError):
        await store.put("k", b"2", if_absent=True)
    assert store.injected_stats["put_us"] >= 100_000
    assert await store.get("k") == b"1"
    await store.aclose()


def test_put_time_buckets() -> None:
    assert [put_ms_bucket(ms) for ms in (0, 0.2, 1, 1.01, 99.5, 100)] == [
        "1", "1", "1", "2", "100", "100",
    ]  # fmt: skip
    assert [put_ms_bucket(ms) for ms in (100.1, 104.9, 499, 501, 4999, 5001)] == [
        "105", "105", "500", "550", "5000", "inf",
    ]  # fmt: skip


def test_the_histogram_counts_every_put(tmp_path: Path) -> None:
    store = InjectedLatencyStore(
        LocalObjectStore(str(tmp_path / "objects")), put_delay=Lognormal(3, 9, seed=2)
    )
    for i in range(30):
        store.put_sync(f"k{i}", b"x")
    histogram = store.injected_stats["put_ms_le"]
    assert sum(histogram.values()) == 30 and len(histogram) > 1
    histogram["1"] = -1  # a copy: the store's own counts stay
    assert sum(store.injected_stats["put_ms_le"].values()) == 30
