"""Injected faults for the metadata store, for tests and benchmarks: a KV that wraps
another and makes it unavailable on demand, or slow. Never used unless its URL is given.

URL: `faulty+<the wrapped store's URL>` with options of its own in the query, e.g.

    faulty+sqlite:///data/metadata.db?unavailable_when=/tmp/metadata-down
    faulty+fdb:///etc/foundationdb/fdb.cluster?prefix=bench&commit_latency_ms=3,10

* `unavailable_when=PATH`: while a file (or anything) exists at PATH, every `transact`,
  `read` and `transact_sync` raises `KVError` at once, as a store that cannot be reached
  does once its retries are spent; remove it and the next call goes through again, in
  the same process. A call already inside the wrapped store when the file appears ends
  normally. The switch is looked up (one stat) at the start of each call.
* `commit_latency_ms=MEDIAN,P99`: each read-write transaction (`transact`,
  `transact_sync`) first waits a delay drawn from `Lognormal(MEDIAN, P99)`, then runs:
  `transact` with anyio.sleep (the event loop goes on meanwhile), `transact_sync` with
  time.sleep (it runs in a thread of its own). Read-only transactions are not delayed.
* `seed=N`: the delays' random generator's seed (default: a fresh one per store).

Percent-escapes in option values are decoded (a "+" stays a "+"). The other options of
the query are left to the wrapped store's URL: `fdb://` has `prefix`; `sqlite://` takes
none, so any other option there is refused.

`Lognormal` is also the object store's latency model (storage.injected; the broker hands
it the sampler, since storage and metadata do not import each other).
"""

from __future__ import annotations

import math
import os
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, TypeVar

import anyio

from metadata.kv import KVError

if TYPE_CHECKING:
    from metadata.kv import KV, OptimisticCounts, ReadTransaction, Transaction

T = TypeVar("T")

SCHEME = "faulty+"
UNAVAILABLE_WHEN = "unavailable_when"
COMMIT_LATENCY_MS = "commit_latency_ms"
SEED = "seed"
_OWN_OPTIONS = (UNAVAILABLE_WHEN, COMMIT_LATENCY_MS, SEED)

# The 99th percentile of the standard normal distribution, Phi^-1(0.99) = 2.3263...
Z99 = NormalDist().inv_cdf(0.99)


class Lognormal:
    """Latencies whose median and 99th percentile are given, in milliseconds.

    The delay X is lognormal: ln X ~ Normal(mu, sigma^2), fitted to the two figures by

        mu = ln(median)        sigma = (ln(p99) - ln(median)) / z99,   z99 = Phi^-1(0.99)

    so that P(X <= median) = 0.5 and P(X <= p99) = 0.99. A draw is exp(mu + sigma * Z)
    with Z ~ Normal(0, 1), i.e. median * (p99 / median) ** (Z / z99). The tail beyond p99
    is unbounded, as a lognormal's is (p99.9 = median * (p99/median) ** 1.33).
    median == p99 gives that one value every time; "0,0" gives no delay at all.
    """

    def __init__(self, median_ms: float, p99_ms: float, *, seed: int | None = None) -> None:
        if not (math.isfinite(median_ms) and math.isfinite(p99_ms)):
            raise ValueError(f"latency figures must be finite, got {median_ms}, {p99_ms}")
        if median_ms < 0 or p99_ms < median_ms:
            raise ValueError(
                f"need 0 <= median <= p99 (milliseconds), got median {median_ms:g}, p99 {p99_ms:g}"
            )
        if median_ms == 0 and p99_ms > 0:
            raise ValueError("a median of 0 ms fits no lognormal with a positive p99")
        self.median_ms = float(median_ms)
        self.p99_ms = float(p99_ms)
        self._mu = math.log(median_ms) if median_ms > 0 else 0.0
        self._sigma = (math.log(p99_ms) - self._mu) / Z99 if median_ms > 0 else 0.0
        self._rng = random.Random(seed)

    @classmethod
    def parse(cls, text: str, *, seed: int | None = None) -> Lognormal:
        """ "MEDIAN,P99" in milliseconds, e.g. "5,15"; ValueError saying what is wrong."""
        parts = text.split(",")
        if len(parts) != 2:
            raise ValueError(f"expected MEDIAN,P99 in milliseconds (e.g. 5,15), got {text!r}")
        try:
            median, p99 = (float(part) for part in parts)
        except ValueError:
            raise ValueError(
                f"expected two numbers MEDIAN,P99 in milliseconds (e.g. 5,15), got {text!r}"
            ) from None
        return cls(median, p99, seed=seed)

    def __repr__(self) -> str:
        return f"Lognormal(median {self.median_ms:g} ms, p99 {self.p99_ms:g} ms)"

    @property
    def none(self) -> bool:
        return self.p99_ms == 0

    def sample_ms(self) -> float:
        """One delay, in milliseconds."""
        if self.median_ms == self.p99_ms:
            return self.median_ms
        # normalvariate, not gauss: gauss keeps a second draw that threads could share.
        return math.exp(self._mu + self._sigma * self._rng.normalvariate(0.0, 1.0))

    def __call__(self) -> float:
        """One delay, in seconds (what a sleep takes)."""
        return self.sample_ms() / 1000


@dataclass(frozen=True)
class FaultOptions:
    unavailable_when: str | None = None
    commit_latency: Lognormal | None = None


def split_url(url: str) -> tuple[str, FaultOptions]:
    """(the wrapped store's URL, the fault options) of a faulty+ URL; KVError if malformed."""
    if not url.startswith(SCHEME):
        raise KVError(f"not a fault-injection metadata URL: {url!r}")
    inner, mark, query = url[len(SCHEME) :].partition("?")
    own: dict[str, str] = {}
    kept: list[str] = []
    for item in query.split("&") if mark else []:
        name, _, value = item.partition("=")
        if name in _OWN_OPTIONS:
            if name in own:
                raise KVError(f"metadata URL {url!r}: {name} given twice")
            own[name] = urllib.parse.unquote(value)
        elif item:
            kept.append(item)
    if kept and inner.startswith("sqlite://"):
        raise KVError(
            f"metadata URL {url!r}: unknown option(s) {kept} (expected {', '.join(_OWN_OPTIONS)})"
        )
    if kept:
        inner += "?" + "&".join(kept)
    if UNAVAILABLE_WHEN in own and not own[UNAVAILABLE_WHEN]:
        raise KVError(f"metadata URL {url!r}: {UNAVAILABLE_WHEN} needs a path")
    try:
        seed = int(own[SEED]) if SEED in own else None
        latency = (
            Lognormal.parse(own[COMMIT_LATENCY_MS], seed=seed) if COMMIT_LATENCY_MS in own else None
        )
    except ValueError as exc:
        raise KVError(f"metadata URL {url!r}: {exc}") from None
    return inner, FaultOptions(own.get(UNAVAILABLE_WHEN), latency)


class InjectedFaultsKV:
    """A `KV` that runs every call on `inner`, unless the switch says the store is
    down, and delays read-write transactions by `options.commit_latency`."""

    def __init__(self, inner: KV, options: FaultOptions) -> None:
        self.inner = inner
        self.options = options
        latency = options.commit_latency
        self._delay = None if latency is None or latency.none else latency
        self._counters = {
            "injected_unavailable": 0,
            "injected_delays": 0,
            "injected_delay_us": 0,
            "transact_us": 0,  # the whole time of the read-write transactions, delays included
        }

    def __repr__(self) -> str:
        return f"InjectedFaultsKV({self.inner!r}, {self.options})"

    @property
    def stats(self) -> dict[str, int]:
        """The wrapped store's counters, and the faults injected so far."""
        return {**getattr(self.inner, "stats", {}), **self._counters}

    def _check_available(self) -> None:
        switch = self.options.unavailable_when
        if switch is not None and os.path.lexists(switch):
            self._counters["injected_unavailable"] += 1
            raise KVError(f"the metadata store is unavailable ({switch} exists: injected fault)")

    def _next_delay(self) -> float:
        if self._delay is None:
            return 0.0
        seconds = self._delay()
        self._counters["injected_delays"] += 1
        self._counters["injected_delay_us"] += round(seconds * 1_000_000)
        return seconds

    async def _write(self, call: Callable[[], Awaitable[T]]) -> T:
        """A write transaction of the wrapped store, behind the outage switch and the
        injected commit latency."""
        self._check_available()
        started = time.monotonic()
        delay = self._next_delay()
        try:
            if delay > 0:
                await anyio.sleep(delay)
            return await call()
        finally:
            self._counters["transact_us"] += round((time.monotonic() - started) * 1_000_000)

    async def transact(self, fn: Callable[[Transaction], T]) -> T:
        return await self._write(lambda: self.inner.transact(fn))

    async def transact_optimistic(
        self, fn: Callable[[Transaction], T], counts: OptimisticCounts | None = None
    ) -> T:
        return await self._write(lambda: self.inner.transact_optimistic(fn, counts))

    async def read(self, fn: Callable[[ReadTransaction], T], *, quick: bool = False) -> T:
        self._check_available()
        return await self.inner.read(fn, quick=quick)

    def transact_sync(self, fn: Callable[[Transaction], T]) -> T:
        self._check_available()
        started = time.monotonic()
        delay = self._next_delay()
        try:
            if delay > 0:
                time.sleep(delay)
            return self.inner.transact_sync(fn)
        finally:
            self._counters["transact_us"] += round((time.monotonic() - started) * 1_000_000)

    async def aclose(self) -> None:
        await self.inner.aclose()


def open_injected(url: str, open_inner: Callable[[str], KV]) -> InjectedFaultsKV:
    inner_url, options = split_url(url)
    return InjectedFaultsKV(open_inner(inner_url), options)


if TYPE_CHECKING:

    def _check(inner: KV) -> KV:
        # mypy checks here that InjectedFaultsKV implements the KV protocol.
        return InjectedFaultsKV(inner, FaultOptions())
