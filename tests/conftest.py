"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import boto3
import pytest

from tests.storage.moto_support import TEST_BUCKET, TEST_CREDENTIALS, moto_server
from tests.support import fdb_server
from tests.support.brokerproc import BrokerProcess, StoreChoice, free_ports, select_stores

METADATA_ENV = "BUCKETLOG_TEST_METADATA"
STORAGE_ENV = "BUCKETLOG_TEST_STORAGE"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bucketlog", "stores of the brokers the tests start")
    group.addoption(
        "--metadata-backend",
        choices=("sqlite", "fdb"),
        default=os.environ.get(METADATA_ENV) or "sqlite",
        help=f"metadata store of every broker the tests start [{METADATA_ENV}]",
    )
    group.addoption(
        "--object-store",
        choices=("local", "s3"),
        default=os.environ.get(STORAGE_ENV) or "local",
        help=f"object store of every broker the tests start (s3: a moto server) [{STORAGE_ENV}]",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under --object-store s3 (the second configuration of `make test`), skip the tests
    the object store makes no difference to: they ran in the first."""
    if config.getoption("--object-store") != "s3":
        return
    skip = pytest.mark.skip(
        reason="store_independent: the object store chosen makes no difference to it (or "
        "it chooses its own); it runs in the local configuration"
    )
    for item in items:
        if item.get_closest_marker("store_independent"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fdb_cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A FoundationDB cluster file: a throwaway local fdbserver, or BUCKETLOG_TEST_FDB_CLUSTER_FILE."""
    if not fdb_server.available():
        pytest.skip(fdb_server.FDB_MISSING)
    with fdb_server.fdb_cluster(tmp_path_factory.mktemp("fdb")) as cluster_file:
        yield cluster_file


@pytest.fixture(scope="session", autouse=True)
def _broker_stores(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start every broker of the session on the stores chosen by the options above."""
    fdb_cluster, s3_endpoint, unavailable = None, None, None
    if request.config.getoption("--metadata-backend") == "fdb":
        if fdb_server.available():
            fdb_cluster = request.getfixturevalue("fdb_cluster_file")
        else:
            unavailable = fdb_server.FDB_MISSING  # the broker tests skip, the rest run
    if request.config.getoption("--object-store") == "s3":
        s3_endpoint = request.getfixturevalue("moto_s3")
    with select_stores(StoreChoice(fdb_cluster, s3_endpoint, unavailable)):
        yield


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint URL of a moto S3 server holding an empty bucket TEST_BUCKET."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in TEST_CREDENTIALS.items():
            mp.setenv(name, value)
        # Keep a developer's own AWS profile out of the tests.
        mp.setenv("AWS_CONFIG_FILE", "/dev/null")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        mp.delenv("AWS_PROFILE", raising=False)
        with moto_server() as url:
            client = boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1")
            client.create_bucket(Bucket=TEST_BUCKET)
            client.close()
            yield url


@pytest.fixture
def start_broker(tmp_path) -> Iterator[Callable[..., BrokerProcess]]:
    """A factory: start_broker(agents=1, extra_args=[...], data_dir=None) -> running broker."""
    started: list[BrokerProcess] = []

    def start(
        agents: int = 1, extra_args: list[str] | None = None, data_dir=None, env=None, port=None
    ) -> BrokerProcess:
        ports = [port] if port else free_ports(agents)
        broker = BrokerProcess(
            data_dir=data_dir or (tmp_path / "data"),
            port=ports[0],
            agents=agents,
            extra_args=list(extra_args or []),
            env=dict(env or {}),
        )
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(start_broker) -> BrokerProcess:
    """One running agent on the embedded default stores."""
    return start_broker()
