"""The broker's small synchronisation values (broker.sync)."""

from __future__ import annotations

import time

import anyio
import pytest

from broker.sync import Channel, Flag, Notifier, Promise, Turn


async def test_waiters_wake_when_set_and_later_waits_return_at_once() -> None:
    flag = Flag()
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await flag.wait()
        woken.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(waiter, i)
        await anyio.wait_all_tasks_blocked()
        assert woken == []
        flag.set()
    assert sorted(woken) == [0, 1, 2]
    await flag.wait()  # set: returns
    assert flag.is_set()


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    flag = Flag()
    for _ in range(100):
        with anyio.move_on_after(0.001):
            await flag.wait()
    assert not flag._waiters  # every cancelled wait took its future back
    flag.set()
    await flag.wait()


async def test_wait_until_times_out_then_sees_a_later_set() -> None:
    promise: Promise[int] = Promise()
    started = time.monotonic()
    assert not await promise.wait_until(started + 0.05)
    assert time.monotonic() - started >= 0.04
    assert not promise._flag._waiters
    assert not await promise.wait_until(time.monotonic() - 1)  # past deadline: at once

    async def later() -> None:
        await anyio.sleep(0.01)
        promise.set(7)

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        assert await promise.wait_until(time.monotonic() + 5)
    assert await promise.wait() == 7


async def test_a_watch_waits_until_notified_or_its_deadline() -> None:
    notifier = Notifier()
    with notifier.watch([("t", 0)]) as watch:
        watch.arm()
        started = time.monotonic()
        assert not await watch.wait_until(started + 0.05)  # nothing came: the deadline
        assert time.monotonic() - started >= 0.04
        notifier.notify(("t", 1))  # another key: not this watch's
        notifier.notify(("t", 0))  # between an arm and the wait: not lost
        assert await watch.wait_until(time.monotonic() + 5)
        watch.arm()

        async def later() -> None:
            await anyio.sleep(0.01)
            notifier.notify(("t", 0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            started = time.monotonic()
            assert await watch.wait_until(started + 5)
        assert time.monotonic() - started < 4  # woken, not timed out
    assert not notifier.has_waiters()


async def test_a_failed_promise_raises_to_every_waiter() -> None:
    promise: Promise[int] = Promise()
    promise.fail(ValueError("no"))
    with pytest.raises(ValueError):
        await promise.wait()
    with pytest.raises(ValueError):
        await promise.wait()


def test_made_and_set_without_an_event_loop() -> None:
    promise: Promise[str] = Promise()
    promise.set("x")
    assert promise.done()
    turn = Turn()
    turn.end()
    assert turn.ended


async def test_a_channel_hands_items_over_in_order_and_ends_once_closed_and_empty() -> None:
    channel: Channel[int] = Channel(4)
    taken: list[int] = []

    async def taker() -> None:
        while (item := await channel.take()) is not None:
            taken.append(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(taker)
        await anyio.wait_all_tasks_blocked()  # the taker waits on an empty channel
        for i in range(100):
            await channel.put(i)
        channel.close()
    assert taken == list(range(100))
    assert await channel.take() is None
    with pytest.raises(RuntimeError):
        await channel.put(100)


async def test_a_full_channel_holds_its_putter_until_an_item_is_taken() -> None:
    channel: Channel[int] = Channel(2)
    put: list[int] = []

    async def putter() -> None:
        for i in range(5):
            await channel.put(i)
            put.append(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(putter)
        await anyio.wait_all_tasks_blocked()
        assert put == [0, 1] and len(channel) == 2  # the third waits for room
        assert channel.take_nowait() == 0
        await anyio.wait_all_tasks_blocked()
        assert put == [0, 1, 2]
        assert [channel.take_nowait() for _ in range(2)] == [1, 2]
        await anyio.wait_all_tasks_blocked()
        assert put == [0, 1, 2, 3, 4]
    assert [channel.take_nowait() for _ in range(3)] == [3, 4, None]


async def test_a_task_cancelled_while_it_waits_on_a_channel_leaves_nothing_behind() -> None:
    channel: Channel[int] = Channel(1)
    with anyio.move_on_after(0.01):
        await channel.take()
    assert channel._taker is None
    await channel.put(1)
    with anyio.move_on_after(0.01):
        await channel.put(2)  # full
    assert channel._putter is None
    assert channel.take_nowait() == 1 and channel.take_nowait() is None
