"""Fixtures of the integration tests: one broker and one SparkSession for the whole run.

These tests run real JVMs: Spark with its Kafka connector, Apache Kafka's own tools and
Kafka Streams, with the jars of integration/fetch-jars.sh (fetched here when the cache is
empty). They need `java` on PATH and are skipped, saying so, without it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.support import INTEGRATION
from tests.support.brokerproc import BrokerProcess, free_ports

# integration/ holds scripts, not a package: spark_support.py and pipeline.py import each
# other as top-level modules, as they do when run from there.
if str(INTEGRATION) not in sys.path:
    sys.path.insert(0, str(INTEGRATION))

NO_JAVA = "`java` is not on PATH (Spark and Apache Kafka's tools need Java 17+)"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marker added here
def pytest_collection_modifyitems(config, items):
    java = shutil.which("java") is not None
    for item in items:
        if item.nodeid.startswith("tests/integration/"):
            # JVMs (Spark, Kafka Streams, the tools) take a core and seconds to start:
            # `make test` runs these alone, after the others (the `serial` marker).
            item.add_marker(pytest.mark.serial)
            if not java:
                item.add_marker(pytest.mark.skip(reason=NO_JAVA))


@pytest.fixture(scope="session")
def jars() -> None:
    """The jar cache of integration/fetch-jars.sh, filled if empty."""
    cache = INTEGRATION / ".cache" / "jars"
    missing = [p for p in ("spark", "kafka", "streams") if not any((cache / p).glob("*.jar"))]
    if missing:
        subprocess.run([str(INTEGRATION / "fetch-jars.sh"), *missing], check=True)


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One agent shared by every integration test; each test uses its own topics."""
    data_dir = tmp_path_factory.mktemp("integration") / "data"
    # A new group's first rebalance does not wait for more members (3 s by default), as
    # in Kafka's own test setups: every console consumer and Spark query starts at once.
    broker = BrokerProcess(
        data_dir=data_dir,
        port=free_ports(1)[0],
        extra_args=["--group-initial-rebalance-delay-ms", "0"],
    )
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def spark(jars, tmp_path_factory):
    """The one SparkSession of the test run (starting one takes several seconds)."""
    from spark_support import spark_session, stop_session

    session = spark_session(
        "bucketlog-tests",
        # C1 only: these jobs are short and small, so JIT warm-up costs more than it gains.
        java_options="-XX:TieredStopAtLevel=1",
        conf={"spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse"))},
    )
    yield session
    stop_session(session)
