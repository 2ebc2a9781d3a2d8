"""The fault-injection wrapper of the metadata store (metadata/injected_kv.py): its URL,
its latency model, the switch that makes the store unavailable and the commit delay.
(The KV contract itself runs on the wrapper too: tests/metadata/conftest.py.)"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import anyio
import pytest

from metadata.injected_kv import InjectedFaultsKV, Lognormal, split_url
from metadata.kv import KVError, Transaction, open_kv
from metadata.sqlite_kv import SQLiteKV


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


# -- the latency model ----------------------------------------------------------------


@pytest.mark.parametrize(("median", "p99"), [(5.0, 15.0), (40.0, 200.0), (3.0, 10.0)])
def test_lognormal_draws_have_the_median_and_p99_asked_for(median: float, p99: float) -> None:
    model = Lognormal(median, p99, seed=1234)
    draws = [model.sample_ms() for _ in range(100_000)]
    assert statistics.median(draws) == pytest.approx(median, rel=0.02)
    assert pct(draws, 99) == pytest.approx(p99, rel=0.05)
    # A long tail, not a cut-off: about 1 draw in 1000 is past p99.9's figure.
    assert pct(draws, 99.9) > p99 * 1.1
    assert min(draws) > 0


def test_lognormal_seconds_are_milliseconds_over_1000() -> None:
    a, b = Lognormal(10, 30, seed=7), Lognormal(10, 30, seed=7)
    assert [a() for _ in range(5)] == [b.sample_ms() / 1000 for _ in range(5)]


def test_lognormal_degenerate_figures() -> None:
    assert {Lognormal(8, 8, seed=1).sample_ms() for _ in range(100)} == {8.0}
    none = Lognormal.parse("0,0")
    assert none.none and none.sample_ms() == 0.0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("5", "MEDIAN,P99"),
        ("5,15,20", "MEDIAN,P99"),
        ("five,15", "two numbers"),
        ("15,5", "median <= p99"),
        ("-1,5", "median <= p99"),
        ("0,5", "median of 0"),
        ("nan,5", "finite"),
        ("5,inf", "finite"),
    ],
)
def test_lognormal_refuses_malformed_figures(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Lognormal.parse(text)


# -- the URL --------------------------------------------------------------------------


def test_split_url_takes_its_options_and_leaves_the_rest_to_the_wrapped_store() -> None:
    inner, options = split_url("faulty+sqlite:///d/m.db?unavailable_when=/tmp/down")
    assert inner == "sqlite:///d/m.db"
    assert options.unavailable_when == "/tmp/down" and options.commit_latency is None

    inner, options = split_url(
        "faulty+fdb:///etc/fdb.cluster?prefix=bench&commit_latency_ms=3,10"
        "&unavailable_when=/tmp/a%20b+c&seed=9"
    )
    assert inner == "fdb:///etc/fdb.cluster?prefix=bench"
    assert options.unavailable_when == "/tmp/a b+c"  # %20 decoded, + kept
    assert options.commit_latency is not None
    assert (options.commit_latency.median_ms, options.commit_latency.p99_ms) == (3, 10)

    inner, options = split_url("faulty+fdb://")
    assert inner == "fdb://" and options.unavailable_when is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("faulty+sqlite:///m.db?prefix=x", "unknown option"),
        ("faulty+sqlite:///m.db?unavailable_when=", "needs a path"),
        ("faulty+sqlite:///m.db?unavailable_when=/a&unavailable_when=/b", "twice"),
        ("faulty+sqlite:///m.db?commit_latency_ms=10", "MEDIAN,P99"),
        ("faulty+sqlite:///m.db?commit_latency_ms=1,2&seed=x", "invalid literal"),
        ("sqlite:///m.db", "not a fault-injection"),
    ],
)
def test_split_url_refuses_malformed_urls(url: str, says: str) -> None:
    with pytest.raises(KVError, match=says):
        split_url(url)


def test_open_kv_wraps_the_store_the_url_names(tmp_path: Path) -> None:
    kv = open_kv(f"faulty+sqlite://{tmp_path}/m.db?commit_latency_ms=1,2")
    try:
        assert isinstance(kv, InjectedFaultsKV) and isinstance(kv.inner, SQLiteKV)
        assert kv.inner.path == f"{tmp_path}/m.db"
    finally:
        anyio.run(kv.aclose)


# -- the switch -----------------------------------------------------------------------


def _set(key: bytes, value: bytes):  # type: ignore[no-untyped-def]
    def fn(tr: Transaction) -> None:
        tr.set(key, value)

    return fn


async def test_every_call_fails_while_the_switch_is_on_and_works_again_after(
    tmp_path: Path,
) -> None:
    switch = tmp_path / "down"
    # A commit latency too: a call refused must not wait for it first.
    kv = open_kv(
        f"faulty+sqlite://{tmp_path}/m.db?unavailable_when={switch}&commit_latency_ms=500,500"
    )
    assert isinstance(kv, InjectedFaultsKV)
    try:
        await kv.transact(_set(b"k", b"before"))
        switch.touch()
        started = time.monotonic()
        with pytest.raises(KVError, match="unavailable"):
            await kv.transact(_set(b"k", b"during"))
        with pytest.raises(KVError, match="unavailable"):
            kv.transact_sync(_set(b"k", b"during"))
        with pytest.raises(KVError, match="unavailable"):
            await kv.read(lambda tr: tr.get(b"k"))
        with pytest.raises(KVError, match="unavailable"):
            await kv.read(lambda tr: tr.get(b"k"), quick=True)
        assert time.monotonic() - started < 0.5  # at once: no delay before the refusal
        assert kv.stats["injected_unavailable"] == 4
        assert kv.stats["injected_delays"] == 1  # only the call that went through

        switch.unlink()
        assert await kv.read(lambda tr: tr.get(b"k")) == b"before"  # nothing of "during"
        await kv.transact(_set(b"k", b"after"))
        assert await kv.read(lambda tr: tr.get(b"k"), quick=True) == b"after"
        assert "commits" in kv.stats  # the wrapped store's counters are kept
    finally:
        await kv.aclose()


# -- the commit latency ----------------------------------------------------------------


async def test_transact_waits_its_delay_without_blocking_the_event_loop(tmp_path: Path) -> None:
    kv = open_kv(f"faulty+sqlite://{tmp_path}/m.db?commit_latency_ms=300,300")
    assert isinstance(kv, InjectedFaultsKV)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            started = time.monotonic()
            await kv.transact(_set(b"k", b"v"))
            took = time.monotonic() - started
            tg.cancel_scope.cancel()
        assert took >= 0.3
        assert ticks >= 5  # the loop ran other tasks meanwhile (30 would be expected)
        assert kv.stats["injected_delays"] == 1
        assert kv.stats["injected_delay_us"] == 300_000
        assert kv.stats["transact_us"] >= 300_000  # the delay and the commit
        # Read-only transactions are not delayed.
        assert await kv.read(lambda tr: tr.get(b"k")) == b"v"
        assert kv.stats["injected_delays"] == 1
    finally:
        await kv.aclose()


def test_transact_sync_waits_its_delay(tmp_path: Path) -> None:
    kv = open_kv(f"faulty+sqlite://{tmp_path}/m.db?commit_latency_ms=200,200")
    assert isinstance(kv, InjectedFaultsKV)
    try:
        started = time.monotonic()
        kv.transact_sync(_set(b"k", b"v"))
        assert time.monotonic() - started >= 0.2
        assert kv.stats["injected_delays"] == 1
        assert kv.stats["injected_delay_us"] == 200_000
    finally:
        anyio.run(kv.aclose)


def test_seeded_delays_repeat(tmp_path: Path) -> None:
    def delays(seed: int) -> list[int]:
        kv = open_kv(f"faulty+sqlite://{tmp_path}/m{seed}.db?commit_latency_ms=1,3&seed=42")
        assert isinstance(kv, InjectedFaultsKV)
        try:
            out = []
            for _ in range(5):
                before = kv.stats["injected_delay_us"]
                kv.transact_sync(_set(b"k", b"v"))
                out.append(kv.stats["injected_delay_us"] - before)
            return out
        finally:
            anyio.run(kv.aclose)

    first = delays(1)
    assert first == delays(2)
    assert len(set(first)) > 1  # drawn, not constant
