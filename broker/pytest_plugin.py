"""The pytest fixture `kafka_broker`: a bucketlog broker in the test's process, with
its stores in the test's temporary folder (broker.testing), stopped after the test.

    def test_round_trip(kafka_broker):
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})

Registered through the `pytest11` entry point when bucketlog is installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.testing import RunningBroker, running_broker


@pytest.fixture
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    with running_broker(tmp_path_factory.mktemp("bucketlog")) as broker:
        yield broker
