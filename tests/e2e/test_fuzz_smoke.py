"""Protocol fuzzing, short runs (integration/chaos/fuzz.py; `make chaos` runs a long one).

Against one broker: the regression frames of tests.support.regression_frames first,
then valid requests of every API and version the broker advertises, the same mutated
(lengths, varints, tagged fields, strings, headers, size prefixes, record batches) and
random bytes. Every answer must be the one the broker's own decoder says it owes, and
after every batch of cases the agent is alive, its RSS under a bound, its log free of
ERROR lines and tracebacks, and confluent-kafka still produces a record and reads it
back.

One run draws cases from `random` with many connections at once; the other from
hypothesis, one connection at a time, so that a failure comes back shrunk. The seed is
fixed (BUCKETLOG_FUZZ_SEED changes it): a failure names the frames that caused it, and
the same seed sends them again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from integration.chaos import fuzz
from tests.support import regression_frames
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.store_independent, pytest.mark.serial]

SEED = int(os.environ.get("BUCKETLOG_FUZZ_SEED", "20261124"))
# An idle agent holds about 70 MiB; a 64 MiB decompression bomb on a compacted topic
# takes it to about 210 MiB for a moment.
MAX_RSS_MB = 600


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Iterator[fuzz.OwnBroker]:
    broker = BrokerProcess(data_dir=tmp_path_factory.mktemp("fuzz") / "data", port=free_ports(1)[0])
    try:
        yield fuzz.OwnBroker(broker.start())
    finally:
        broker.stop()


def settings(**kw: Any) -> fuzz.Settings:
    return fuzz.Settings(cases=None, seed=SEED, max_rss_mb=MAX_RSS_MB, **kw)


def assert_clean(report: dict[str, Any], target: fuzz.OwnBroker, min_cases: int) -> None:
    found = "\n".join(json.dumps(finding)[:3000] for finding in report["findings"])
    assert report["errors_found"] == 0, f"the fuzzer found:\n{found}"
    assert report["agent_deaths"] == 0
    assert not report["stopped"], report["stopped"]
    assert 0 < report["max_rss_mb"] <= MAX_RSS_MB
    # Every batch ends with a health check; one that fails is a finding.
    assert report["health_checks"] >= 3
    assert report["cases"] >= min_cases, report
    assert report["regression_plans"] == len(regression_frames.ALL) + 1
    log = target.broker.log_text()
    assert " ERROR " not in log and "Traceback" not in log, log[-5000:]
    # Bad input was sent and refused: one WARNING line each (rate-limited).
    assert " WARNING " in log


def test_random_cases(target):
    report = fuzz.fuzz(target, settings(seconds=15, batch=1500, concurrency=32))
    assert_clean(report, target, min_cases=1500)


def test_hypothesis_cases(target):
    report = fuzz.fuzz(target, settings(seconds=8, batch=300, engine="hypothesis"))
    assert_clean(report, target, min_cases=300)
