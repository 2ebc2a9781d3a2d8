"""Authentication with real clients against one broker of two agents, each serving four
listeners: PLAINTEXT, SASL_PLAINTEXT (PLAIN and SCRAM), SSL (client certificates
required) and SASL_SSL (certificates not asked for, as in Kafka).

confluent-kafka, kafka-python, aiokafka, kcat and the Java console clients produce and
consume over SASL_SSL with SCRAM-SHA-512, over SASL_PLAINTEXT with PLAIN and over SSL
with a client certificate (the Java producer over SASL_SSL, its consumer the other two
ways); aiokafka and kcat over SASL_PLAINTEXT with SCRAM-SHA-256 too; credentials are made with
AlterUserScramCredentials (and Apache Kafka's kafka-configs where Java and its jars are
here). Bad credentials, an expired
certificate, plaintext on a TLS port and a request before authentication are refused,
each with one line, and the PLAINTEXT listener serves on.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from tests.e2e import wire
from tests.e2e.wire import ConnectionClosed, WireClient, request
from tests.security.certs import CLIENT_SUBJECT, Certificates, make_certificates
from tests.support.brokerproc import BrokerProcess, free_ports

pytestmark = pytest.mark.slow

AGENTS = 2
PLAIN_USERS = "# PLAIN users of the tests\nbob:bob-secret\n"
SECRET = "alice-secret-4711"  # never in the broker's log
SHA256, SHA512 = 1, 2


class Cluster:
    def __init__(self, broker: BrokerProcess, base: int, certs: Certificates) -> None:
        self.broker = broker
        self.certs = certs
        self.plaintext = base
        self.sasl_plaintext = base + AGENTS
        self.ssl = base + 2 * AGENTS
        self.sasl_ssl = base + 3 * AGENTS

    def log_lines(self, *words: str) -> list[str]:
        return [
            line for line in self.broker.log_text().splitlines() if all(w in line for w in words)
        ]

    def wait_for_line(self, *words: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.log_lines(*words)
            if lines:
                return lines[-1]
            time.sleep(0.05)
        raise AssertionError(f"no broker log line with {words}:\n{self.broker.log_text()}")

    def stat(self, *path: str) -> int:
        """A counter of the stats files, summed over the agents."""
        total = 0
        for port in self.broker.ports:
            node: object = self.broker.stats(port)
            for part in path:
                node = node.get(part, {}) if isinstance(node, dict) else {}
            total += node if isinstance(node, int) else 0
        return total

    def wait_for_count(self, *path: str, above: int, timeout: float = 5.0) -> None:
        """Until the counter is above `above` (the stats files are written each second)."""
        deadline = time.monotonic() + timeout
        while self.stat(*path) <= above:
            assert time.monotonic() < deadline, (path, self.broker.stats())
            time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("security")
    certs = make_certificates(root / "certs")
    users = root / "plain-users"
    users.write_text(PLAIN_USERS)
    base = free_ports(4 * AGENTS)[0]
    listeners = ",".join(
        f"{name}://127.0.0.1:{base + index * AGENTS}"
        for index, name in enumerate(("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"))
    )
    broker = BrokerProcess(
        data_dir=root / "data",
        port=base,
        agents=AGENTS,
        extra_args=[
            "--listeners",
            listeners,
            # Clients of SASL_PLAINTEXT are sent to "localhost"; agent 1 to port + 1 too.
            "--advertised-listeners",
            f"SASL_PLAINTEXT://localhost:{base + AGENTS}",
            "--ssl-keyfile",
            str(certs.server_key),
        ],
        env={
            # Every option is also a BUCKETLOG_* variable.
            "BUCKETLOG_SSL_CERTFILE": str(certs.server_cert),
            "BUCKETLOG_SSL_CAFILE": str(certs.ca),
            "BUCKETLOG_SSL_CLIENT_AUTH": "required",  # SSL only: SASL_SSL asks for none
            "BUCKETLOG_SASL_PLAIN_USERS": str(users),
        },
    )
    broker.start()
    yield Cluster(broker, base, certs)
    broker.stop()


@pytest.fixture(scope="module")
def credentials(cluster: Cluster) -> None:
    """alice (SCRAM-SHA-512) and carol (SCRAM-SHA-256), made with confluent-kafka's
    AdminClient over PLAINTEXT."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.plaintext}"})
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), SECRET.encode()
            ),
            UserScramCredentialUpsertion(
                "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-pw"
            ),
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    described = admin.describe_user_scram_credentials(["alice", "carol"])
    infos = described["alice"].result(timeout=30).scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_512, 8192)]


def topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- confluent-kafka, kafka-python, aiokafka, kcat ---------------------------------------


def confluent_roundtrip(port: int, settings: dict[str, str], count: int = 5) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    name = topic("confluent")
    config = {"bootstrap.servers": f"127.0.0.1:{port}", **settings}
    producer = Producer(config)
    for index in range(count):
        producer.produce(name, b"confluent-%d" % index)
    assert producer.flush(30) == 0
    consumer = Consumer({**config, "group.id": name, "enable.auto.commit": False})
    consumer.assign([TopicPartition(name, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def kafka_python_roundtrip(port: int, settings: dict[str, object], count: int = 5) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    name = topic("kafka-python")
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", **settings)
    futures = [producer.send(name, b"kafka-python-%d" % i, partition=0) for i in range(count)]
    producer.flush(30)
    assert [f.get(10).offset for f in futures] == list(range(count))
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        group_id=None,
        enable_auto_commit=False,
        **settings,
    )
    consumer.assign([TopicPartition(name, 0)])
    consumer.seek_to_beginning()
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
    consumer.close()
    return values


def expected(client: str, count: int = 5) -> list[bytes]:
    return [b"%s-%d" % (client.encode(), i) for i in range(count)]


def test_ssl_with_a_client_certificate(cluster: Cluster) -> None:
    certs = cluster.certs
    confluent = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
        "ssl.certificate.location": str(certs.client_cert),
        "ssl.key.location": str(certs.client_key),
    }
    assert confluent_roundtrip(cluster.ssl, confluent) == expected("confluent")
    kafka_python = {
        "security_protocol": "SSL",
        "ssl_cafile": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }
    assert kafka_python_roundtrip(cluster.ssl, kafka_python) == expected("kafka-python")
    # The principal: the certificate's subject as Kafka's default principal builder says.
    # (First in the module: the lines of successes are rate-limited, 10 per 10 s.)
    cluster.wait_for_line(f"authenticated as User:{CLIENT_SUBJECT} with its client certificate")
    cluster.wait_for_count("authentication", "successes", "SSL", above=0)


def test_sasl_ssl_with_scram_sha_512(cluster: Cluster, credentials: None) -> None:
    confluent = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": SECRET,
        "ssl.ca.location": str(cluster.certs.ca),
    }
    assert confluent_roundtrip(cluster.sasl_ssl, confluent) == expected("confluent")
    kafka_python = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": SECRET,
        "ssl_cafile": str(cluster.certs.ca),
    }
    assert kafka_python_roundtrip(cluster.sasl_ssl, kafka_python) == expected("kafka-python")
    cluster.wait_for_count("authentication", "successes", "SCRAM-SHA-512", above=1)


def test_sasl_plaintext_with_plain(cluster: Cluster) -> None:
    confluent = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "bob",
        "sasl.password": "bob-secret",
    }
    assert confluent_roundtrip(cluster.sasl_plaintext, confluent) == expected("confluent")
    kafka_python = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "bob",
        "sasl_plain_password": "bob-secret",
    }
    assert kafka_python_roundtrip(cluster.sasl_plaintext, kafka_python) == expected("kafka-python")
    cluster.wait_for_count("authentication", "successes", "PLAIN", above=1)


# -- refusals ---------------------------------------------------------------------------


def sasl_session(port: int, mechanism: str) -> WireClient:
    client = WireClient(("127.0.0.1", port))
    answer = client.call(request(17, 1, mechanism=mechanism))
    assert answer.error_code == ErrorCode.none, answer
    return client


def test_a_request_before_authentication_closes_the_connection(cluster: Cluster) -> None:
    with WireClient(("127.0.0.1", cluster.sasl_plaintext)) as client:
        client.send(request(3, 12, topics=None, allow_auto_topic_creation=False,
                            include_topic_authorized_operations=False))  # fmt: skip
        assert client.wait_closed()
    cluster.wait_for_line("API key 3 before authentication on SASL_PLAINTEXT")
    # A frame larger than Kafka's sasl.server.max.receive.size before authentication.
    with WireClient(("127.0.0.1", cluster.sasl_plaintext)) as client:
        client.send_raw(struct.pack(">i", 600_000) + b"\x00" * 1000)
        assert client.wait_closed()  # at once, not when the frame would be complete
    cluster.wait_for_line("a frame of 600000 bytes before authentication")
    # After the handshake, only SaslAuthenticate.
    with sasl_session(cluster.sasl_plaintext, "PLAIN") as client:
        client.send(request(18, 3, client_software_name="x", client_software_version="1"))
        assert client.wait_closed()


def test_wrong_password_and_unknown_user_are_refused(cluster: Cluster, credentials: None) -> None:
    before = cluster.stat("connections", "authentication_failures")
    for token in (b"\x00bob\x00" + SECRET.encode(), b"\x00nobody\x00bob-secret"):
        with sasl_session(cluster.sasl_plaintext, "PLAIN") as client:
            answer = client.call(request(36, 2, auth_bytes=token))
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert answer.error_message == "Authentication failed: Invalid username or password"
            assert client.wait_closed()
    with sasl_session(cluster.sasl_plaintext, "SCRAM-SHA-512") as client:
        answer = client.call(request(36, 2, auth_bytes=b"n,,n=nobody,r=abcdef"))
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert client.wait_closed()
    # alice's SCRAM password, wrong: librdkafka reports the broker's answer.
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    errors: list[KafkaError] = []
    admin = AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{cluster.sasl_ssl}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "not-" + SECRET,
            "ssl.ca.location": str(cluster.certs.ca),
            "error_cb": errors.append,
        }
    )
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.1)
    del admin  # it would try again and again
    assert [e.code() for e in errors][:1] == [KafkaError._AUTHENTICATION], errors
    assert "invalid credentials" in errors[0].str()
    cluster.wait_for_count("authentication", "failures", "SCRAM-SHA-512", above=1)
    cluster.wait_for_count("connections", "authentication_failures", above=before + 3)
    assert SECRET not in cluster.broker.log_text()


def test_sasl_handshake_v0_takes_raw_tokens(cluster: Cluster) -> None:
    """After a v0 handshake the tokens come without request headers (Kafka before 1.0)."""
    with WireClient(("127.0.0.1", cluster.sasl_plaintext)) as client:
        answer = client.call(request(17, 0, mechanism="PLAIN"))
        assert answer.error_code == ErrorCode.none
        token = b"\x00bob\x00bob-secret"
        client.send_raw(struct.pack(">i", len(token)) + token)
        assert client.read_frame() == b""  # PLAIN's empty answer: authenticated
        brokers = wire.metadata(client, None, allow_auto=False).brokers
        assert sorted(b.port for b in brokers) == [cluster.sasl_plaintext + i for i in range(2)]
    with WireClient(("127.0.0.1", cluster.sasl_plaintext)) as client:
        assert client.call(request(17, 0, mechanism="PLAIN")).error_code == ErrorCode.none
        token = b"\x00bob\x00wrong"
        client.send_raw(struct.pack(">i", len(token)) + token)
        assert client.wait_closed()  # no room for an error in v0: closed


def test_unsupported_mechanism_is_refused(cluster: Cluster) -> None:
    with WireClient(("127.0.0.1", cluster.sasl_plaintext)) as client:
        answer = client.call(request(17, 1, mechanism="GSSAPI"))
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(answer.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert client.wait_closed()


def test_plaintext_on_a_tls_port_and_an_expired_certificate_are_refused(
    cluster: Cluster,
) -> None:
    with WireClient(("127.0.0.1", cluster.ssl)) as client:
        client.send(request(18, 3, client_software_name="x", client_software_version="1"))
        assert client.wait_closed(timeout=15)
    cluster.wait_for_line("closing connection from", f"SSL://127.0.0.1:{cluster.ssl}", "TLS")

    before = cluster.stat("authentication", "failures", "SSL")
    handshakes = cluster.stat("connections", "tls_handshake_failures")
    context = ssl.create_default_context(cafile=str(cluster.certs.ca))
    context.load_cert_chain(str(cluster.certs.expired_cert), str(cluster.certs.expired_key))
    with socket.create_connection(("127.0.0.1", cluster.ssl), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError, ConnectionClosed)):
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                # TLS 1.3: the server checks the certificate after the client's handshake.
                tls.sendall(struct.pack(">i", 4) + b"\x00\x12\x00\x00")
                if not tls.recv(4):
                    raise ConnectionClosed("closed")
    cluster.wait_for_line("TLS handshake failed", "certificate has expired")
    cluster.wait_for_count("authentication", "failures", "SSL", above=before)
    cluster.wait_for_count("connections", "tls_handshake_failures", above=handshakes)


# -- listeners, the admin APIs, and the PLAINTEXT clients --------------------------------


def test_each_listener_answers_with_its_own_addresses(cluster: Cluster) -> None:
    with sasl_session(cluster.sasl_plaintext + 1, "PLAIN") as client:
        answer = client.call(request(36, 1, auth_bytes=b"\x00bob\x00bob-secret"))
        assert answer.error_code == ErrorCode.none
        assert answer.session_lifetime.total_seconds() == 0  # no re-authentication
        brokers = wire.metadata(client, None, allow_auto=False).brokers
        assert sorted((b.host, b.port) for b in brokers) == [
            ("localhost", cluster.sasl_plaintext + i) for i in range(2)
        ]
        coordinator = client.call(request(10, 3, key="a-group", key_type=0))
        assert coordinator.host == "localhost"
        assert coordinator.port in {cluster.sasl_plaintext, cluster.sasl_plaintext + 1}
        described = client.call(
            request(60, 1, include_cluster_authorized_operations=False, endpoint_type=1)
        )
        assert sorted(b.port for b in described.brokers) == [
            cluster.sasl_plaintext + i for i in range(2)
        ]
        # Authenticated already: the SASL requests are out of turn, answered, not closed.
        again = client.call(request(17, 1, mechanism="PLAIN"))
        assert again.error_code == ErrorCode.illegal_sasl_state
    with WireClient(("127.0.0.1", cluster.plaintext + 1)) as client:
        brokers = wire.metadata(client, None, allow_auto=False).brokers
        assert sorted((b.host, b.port) for b in brokers) == [
            ("127.0.0.1", cluster.plaintext + i) for i in range(2)
        ]
        versions = wire.api_versions(client)
        assert versions[17] == (0, 1) and versions[36] == (0, 2)
        assert versions[50] == (0, 0) and versions[51] == (0, 0)
        handshake = client.call(request(17, 1, mechanism="PLAIN"))
        assert handshake.error_code == ErrorCode.illegal_sasl_state  # not a SASL listener


def alter(client: WireClient, deletions=(), upsertions=()) -> dict[str, tuple[int, str | None]]:
    answer = client.call(request(51, 0, deletions=list(deletions), upsertions=list(upsertions)))
    return {r.user: (r.error_code, r.error_message) for r in answer.results}


def upsertion(name: str, mechanism: int = SHA256, iterations: int = 4096) -> dict[str, object]:
    return {
        "name": name,
        "mechanism": mechanism,
        "iterations": iterations,
        "salt": b"salt" * 4,
        "salted_password": b"x" * 32,
    }


def test_scram_credential_requests_get_kafkas_errors(cluster: Cluster) -> None:
    with WireClient(("127.0.0.1", cluster.plaintext)) as client:
        results = alter(
            client,
            deletions=[{"name": "ghost", "mechanism": SHA256}, {"name": "twice", "mechanism": 1}],
            upsertions=[
                upsertion("few", iterations=1000),
                upsertion("many", iterations=20000),
                upsertion("nomech", mechanism=0),
                upsertion(""),
                upsertion("twice"),
                upsertion("fine"),
            ],
        )
        assert results == {
            "ghost": (
                ErrorCode.resource_not_found,
                "Attempt to delete a user credential that does not exist",
            ),
            "twice": (
                ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request",
            ),
            "few": (ErrorCode.unacceptable_credential, "Too few iterations"),
            "many": (ErrorCode.unacceptable_credential, "Too many iterations"),
            "nomech": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
            "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
            "fine": (ErrorCode.none, None),
        }
        described = client.call(request(50, 0, users=[{"name": "fine"}, {"name": "ghost"}]))
        by_user = {r.user: r for r in described.results}
        assert by_user["ghost"].error_code == ErrorCode.resource_not_found
        assert [(i.mechanism, i.iterations) for i in by_user["fine"].credential_infos] == [
            (SHA256, 4096)
        ]
        assert alter(client, deletions=[{"name": "fine", "mechanism": SHA256}]) == {
            "fine": (ErrorCode.none, None)
        }
        # Quotas (which kafka-configs --describe asks for too): none is ever set.
        user = {"entity_type": "user", "match_type": 0, "match": "fine"}
        quotas = client.call(request(48, 1, components=[user], strict=False))
        assert (quotas.error_code, quotas.entries) == (ErrorCode.none, ())
        ip = {"entity_type": "ip", "match_type": 2, "match": None}
        quotas = client.call(request(48, 1, components=[user, ip], strict=False))
        assert quotas.error_code == ErrorCode.invalid_request


def java_tools() -> None:
    """Skips unless Java and Apache Kafka's jars (`make jars`) are here; never fetches."""
    root = Path(__file__).resolve().parents[2]
    jars = root / "integration" / ".cache" / "jars" / "kafka"
    if shutil.which("java") is None or not any(jars.glob("*.jar")):
        pytest.skip("Java or Apache Kafka's jars (make jars) are not here")


def test_java_console_clients_each_way_in(
    cluster: Cluster, credentials: None, tmp_path: Path
) -> None:
    java_tools()
    from tests.integration.support import run_tool

    properties = tmp_path / "client.properties"
    properties.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required"
        f' username="alice" password="{SECRET}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={cluster.certs.ca}\n"
    )
    name = topic("java")
    run_tool(
        "kafka-console-producer", "--bootstrap-server", f"127.0.0.1:{cluster.sasl_ssl}",
        "--topic", name, "--command-config", str(properties), stdin="java-0\njava-1\n",
    )  # fmt: skip
    # The consumer over SSL with its client certificate (a PEM keystore: key, then chain).
    certs = cluster.certs
    keystore = tmp_path / "keystore.pem"
    keystore.write_text(certs.client_key.read_text() + certs.client_cert.read_text())
    mtls = tmp_path / "mtls.properties"
    mtls.write_text(
        "security.protocol=SSL\n"
        f"ssl.truststore.type=PEM\nssl.truststore.location={certs.ca}\n"
        f"ssl.keystore.type=PEM\nssl.keystore.location={keystore}\n"
    )
    consumed = run_tool(
        "kafka-console-consumer", "--bootstrap-server", f"127.0.0.1:{cluster.ssl}",
        "--topic", name, "--command-config", str(mtls), "--partition", "0",
        "--offset", "earliest", "--max-messages", "2",
    )  # fmt: skip
    assert consumed.stdout.split() == ["java-0", "java-1"]
    # And over SASL_PLAINTEXT with PLAIN.
    plain = tmp_path / "plain.properties"
    plain.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required"
        ' username="bob" password="bob-secret";\n'
    )
    consumed = run_tool(
        "kafka-console-consumer", "--bootstrap-server", f"127.0.0.1:{cluster.sasl_plaintext}",
        "--topic", name, "--command-config", str(plain), "--partition", "0",
        "--offset", "earliest", "--max-messages", "2",
    )  # fmt: skip
    assert consumed.stdout.split() == ["java-0", "java-1"]


# The three ways in for aiokafka and kcat: (listener attribute, aiokafka settings, kcat
# settings); SSL contexts are made in the test from the certificates.
MODES = {
    "SASL_SSL-SCRAM-SHA-512": (
        "sasl_ssl",
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
         "sasl_plain_username": "alice", "sasl_plain_password": SECRET},
        ["security.protocol=SASL_SSL", "sasl.mechanisms=SCRAM-SHA-512",
         "sasl.username=alice", f"sasl.password={SECRET}"],
    ),
    "SASL_PLAINTEXT-PLAIN": (
        "sasl_plaintext",
        {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
         "sasl_plain_username": "bob", "sasl_plain_password": "bob-secret"},
        ["security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=PLAIN",
         "sasl.username=bob", "sasl.password=bob-secret"],
    ),
    "SSL-client-certificate": ("ssl", {"security_protocol": "SSL"}, ["security.protocol=SSL"]),
    "SASL_PLAINTEXT-SCRAM-SHA-256": (
        "sasl_plaintext",
        {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
         "sasl_plain_username": "carol", "sasl_plain_password": "carol-pw"},
        ["security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=SCRAM-SHA-256",
         "sasl.username=carol", "sasl.password=carol-pw"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", list(MODES))
def test_aiokafka_and_kcat_each_way_in(cluster: Cluster, credentials: None, mode: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    attribute, settings, kcat_settings = MODES[mode]
    port = getattr(cluster, attribute)
    certs = cluster.certs
    extra: dict[str, object] = {}
    kcat_extra: list[str] = []
    if "SSL" in settings["security_protocol"]:
        context = ssl.create_default_context(cafile=str(certs.ca))
        kcat_extra.append(f"ssl.ca.location={certs.ca}")
        if settings["security_protocol"] == "SSL":
            context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
            kcat_extra += [
                f"ssl.certificate.location={certs.client_cert}",
                f"ssl.key.location={certs.client_key}",
            ]
        extra["ssl_context"] = context
    name = topic("aiokafka")

    async def roundtrip() -> list[bytes]:
        common = {"bootstrap_servers": f"127.0.0.1:{port}", **settings, **extra}
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for index in range(3):
                await producer.send_and_wait(name, b"aiokafka-%d" % index, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**common, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(name, 0)])
            await consumer.seek_to_beginning()
            batches = await consumer.getmany(timeout_ms=10_000, max_records=3)
            return [r.value for records in batches.values() for r in records]
        finally:
            await consumer.stop()

    assert asyncio.run(roundtrip()) == expected("aiokafka", 3)

    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not on PATH")
    name = topic("kcat")
    command = [kcat, "-b", f"127.0.0.1:{port}", "-t", name]
    for setting in kcat_settings + kcat_extra:
        command += ["-X", setting]
    subprocess.run([*command, "-P"], input=b"kcat-0\nkcat-1\n", check=True, timeout=30)
    out = subprocess.run(
        [*command, "-C", "-o", "beginning", "-e", "-c", "2"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert out.stdout.split() == [b"kcat-0", b"kcat-1"]


def test_kafka_configs_adds_a_scram_user(cluster: Cluster) -> None:
    java_tools()
    from tests.integration.support import run_tool

    run_tool(
        "kafka-configs",
        "--bootstrap-server",
        f"127.0.0.1:{cluster.plaintext}",
        "--alter",
        "--add-config",
        "SCRAM-SHA-256=[iterations=8192,password=dave-pw]",
        "--entity-type",
        "users",
        "--entity-name",
        "dave",
    )
    described = run_tool(
        "kafka-configs",
        "--bootstrap-server",
        f"127.0.0.1:{cluster.plaintext}",
        "--describe",
        "--entity-type",
        "users",
        "--entity-name",
        "dave",
    )
    assert "SCRAM-SHA-256=iterations=8192" in described.stdout
    confluent = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "dave",
        "sasl.password": "dave-pw",
    }
    assert confluent_roundtrip(cluster.sasl_plaintext, confluent, 2) == expected("confluent", 2)


def test_the_plaintext_listener_serves_on(cluster: Cluster) -> None:
    """Runs last: after every refusal above, PLAINTEXT clients on both agents still
    produce and consume, and no line of the log is a traceback."""
    for index in range(AGENTS):
        assert confluent_roundtrip(cluster.plaintext + index, {}, 2) == expected("confluent", 2)
    assert "Traceback" not in cluster.broker.log_text()
    assert SECRET not in cluster.broker.log_text()
