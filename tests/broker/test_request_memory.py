"""The bound on request bytes across connections (broker.memory.RequestMemory)."""

from __future__ import annotations

import anyio
import pytest

from broker.memory import RequestMemory


async def test_reservations_wait_in_arrival_order_until_memory_is_released() -> None:
    memory = RequestMemory(100)
    await memory.reserve(60)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        await memory.reserve(size)
        order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, "large", 80)
        await anyio.sleep(0.01)
        tg.start_soon(take, "small", 10)  # would fit now, but the large one came first
        await anyio.sleep(0.01)
        assert order == [] and memory.in_use == 60
        memory.release(60)
    assert order == ["large", "small"]
    assert memory.in_use == 90
    assert memory.stats == {"in_use_peak": 90, "reads_paused": 2}


async def test_a_cancelled_wait_takes_nothing_and_lets_the_next_through() -> None:
    memory = RequestMemory(100)
    await memory.reserve(50)
    got_small = anyio.Event()

    async def small() -> None:
        await memory.reserve(40)
        got_small.set()

    async with anyio.create_task_group() as tg:
        with anyio.move_on_after(0.05):
            tg.start_soon(small)
            await memory.reserve(90)  # waits ahead of small, then is cancelled
        with anyio.fail_after(1):
            await got_small.wait()
    assert memory.in_use == 90


def test_a_size_that_can_never_fit_is_refused() -> None:
    memory = RequestMemory(100)
    with pytest.raises(ValueError):
        anyio.run(memory.reserve, 101)
