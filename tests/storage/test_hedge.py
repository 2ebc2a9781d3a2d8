"""Hedged PUTs (storage.hedge) on the local store and on S3 (moto): a slow PUT is sent a
second time and the first answer wins; a key taken by another object is still refused."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest

from storage.hedge import HedgedPuts
from storage.injected import InjectedLatencyStore
from storage.objectstore import ObjectExistsError, ObjectStore
from tests.storage.conftest import make_store

FAST = 0.002
SLOW = 3.0
SAMPLES = 16


class Script:
    """Delays for the PUTs, in call order: FAST unless a slow one is asked for next."""

    def __init__(self) -> None:
        self.slow_next: Iterator[float] = iter(())

    def slow(self, *delays: float) -> None:
        self.slow_next = iter(delays)

    def __call__(self) -> float:
        return next(self.slow_next, FAST)


@pytest.fixture(params=["local", "s3"])
async def inner(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    made = make_store(request.param, request, tmp_path)
    yield made
    await made.aclose()


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
async def hedged(inner: ObjectStore, script: Script) -> tuple[HedgedPuts, ObjectStore]:
    store = InjectedLatencyStore(inner, put_delay=script)
    hedge = HedgedPuts(store, percentile=90, min_samples=SAMPLES, floor_s=0.001)
    limiter = anyio.CapacityLimiter(4)
    for i in range(SAMPLES):  # the PUT times it learns from
        await hedge.put(f"warm/{i}", [b"w"], limiter)
    return hedge, store


async def _timed(put: Callable[[], object]) -> float:
    began = time.monotonic()
    await put()  # type: ignore[misc]
    return time.monotonic() - began


async def test_a_slow_put_is_answered_by_its_second_request(
    hedged: tuple[HedgedPuts, ObjectStore], script: Script
) -> None:
    hedge, store = hedged
    assert hedge.threshold() is not None
    script.slow(SLOW)  # the first request of the next PUT; its second one is fast
    took = await _timed(lambda: hedge.put("obj/1", [b"payload"], anyio.CapacityLimiter(4)))
    assert took < SLOW / 2
    assert await store.get("obj/1") == b"payload"
    assert (hedge.stats.hedged, hedge.stats.hedge_won) == (1, 1)


async def test_no_second_request_before_the_times_are_known(
    inner: ObjectStore, script: Script
) -> None:
    hedge = HedgedPuts(
        InjectedLatencyStore(inner, put_delay=script), percentile=90, min_samples=SAMPLES
    )
    assert hedge.threshold() is None
    script.slow(0.5)
    took = await _timed(lambda: hedge.put("obj/2", [b"x"], anyio.CapacityLimiter(4)))
    assert took >= 0.5
    assert hedge.stats.hedged == 0


async def test_a_key_holding_another_object_is_refused(
    hedged: tuple[HedgedPuts, ObjectStore], script: Script
) -> None:
    hedge, store = hedged
    await store.put("taken", b"someone else's")
    script.slow(0.5)  # hedged: both requests find the key taken
    with pytest.raises(ObjectExistsError):
        await hedge.put("taken", [b"mine"], anyio.CapacityLimiter(4))
    assert hedge.stats.hedged == 1
    assert await store.get("taken") == b"someone else's"


async def test_both_requests_slow_the_first_answer_wins(
    hedged: tuple[HedgedPuts, ObjectStore], script: Script
) -> None:
    hedge, store = hedged
    script.slow(0.6, 0.3)
    took = await _timed(lambda: hedge.put("obj/3", [b"both"], anyio.CapacityLimiter(4)))
    assert took < 0.6
    assert await store.get("obj/3") == b"both"
    # Later PUTs are unaffected by the abandoned request still running in its thread.
    for i in itertools.islice(itertools.count(), 5):
        await hedge.put(f"after/{i}", [b"a"], anyio.CapacityLimiter(4))
    await anyio.sleep(0.7)
    assert await store.get("obj/3") == b"both"
