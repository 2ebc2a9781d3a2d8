"""compose/Dockerfile and compose/docker-compose.yml agree with the CLI and with each other.

No Docker engine runs here, so the files are parsed rather than run: every BUCKETLOG_*
variable they set is an option of `bucketlog serve`; each agent's environment parses into
a broker configuration; ports line up between BUCKETLOG_PORT, EXPOSE, the published ports
and the healthcheck; the FoundationDB client is the server's version; the healthcheck
command runs against a real socket and the one-shot shell scripts parse.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.cli import ENV_PREFIX, SERVE_OPTIONS, build_parser, config_from_args, env_name
from metadata.fdb_kv import parse_fdb_url
from tests.support.brokerproc import BrokerProcess, free_ports

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose"
SERVE_VARIABLES = {env_name(name) for name, *_ in SERVE_OPTIONS}
AGENTS = ("agent-1", "agent-2", "agent-3")


# -- a small Dockerfile reader -------------------------------------------------------------


@dataclass
class Dockerfile:
    stages: list[str] = field(default_factory=list)  # FROM lines
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults, last stage wins
    env: dict[str, str] = field(default_factory=dict)  # ENV of the final stage
    instructions: list[tuple[str, str]] = field(default_factory=list)  # of the final stage

    def final(self, name: str) -> list[str]:
        return [rest for instr, rest in self.instructions if instr == name]


def read_dockerfile(path: Path) -> Dockerfile:
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    parsed = Dockerfile()
    for line in logical:
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            parsed.stages.append(rest)
            parsed.env = {}
            parsed.instructions = []
        if instr == "ARG":
            name, _, default = rest.partition("=")
            parsed.args[name] = default
        if instr == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                parsed.env[key] = value
        parsed.instructions.append((instr, rest))
    return parsed


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return read_dockerfile(COMPOSE / "Dockerfile")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # safe_load resolves the YAML anchors and merge keys the file uses, as Compose does.
    loaded: dict[str, Any] = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    return loaded


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def published(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) pairs of a service's `ports`."""
    pairs = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            pairs.append((int(entry["published"]), int(entry["target"])))
        else:
            parts = str(entry).split("/")[0].split(":")
            pairs.append((int(parts[-2]), int(parts[-1])))
    return pairs


def parse_serve(env: dict[str, str], argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """`bucketlog <argv>` parsed as the CLI would in a container with exactly `env`."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return build_parser().parse_args(argv)


def agent_env(dockerfile: Dockerfile, compose: dict[str, Any], name: str) -> dict[str, str]:
    return {**dockerfile.env, **environment(compose["services"][name])}


# -- the Dockerfile ------------------------------------------------------------------------


def test_dockerfile_base_user_and_entrypoint(
    dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert dockerfile.stages[-1] == "${PYTHON_IMAGE}"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", dockerfile.args["PYTHON_IMAGE"])
    (user,) = dockerfile.final("USER")
    assert user not in ("root", "0")
    assert "useradd" in " ".join(dockerfile.final("RUN")) and user in " ".join(
        dockerfile.final("RUN")
    )
    (entrypoint,) = dockerfile.final("ENTRYPOINT")
    command = json.loads(entrypoint)
    assert command == ["bucketlog", "serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[command[0]] == "broker.__main__:main"
    args = parse_serve(dockerfile.env, command[1:], monkeypatch)
    assert args.command == "serve"
    assert args.host == "0.0.0.0"  # reachable from outside the container
    assert args.port == int(dockerfile.env["BUCKETLOG_PORT"])
    config = config_from_args(args)
    assert config.data_dir == dockerfile.env["BUCKETLOG_DATA_DIR"]


def test_dockerfile_sets_only_known_variables(dockerfile: Dockerfile) -> None:
    set_here = {k for k in dockerfile.env if k.startswith(ENV_PREFIX)}
    assert set_here and set_here <= SERVE_VARIABLES, set_here - SERVE_VARIABLES


def test_dockerfile_port_expose_and_healthcheck_agree(dockerfile: Dockerfile) -> None:
    port = dockerfile.env["BUCKETLOG_PORT"]
    metrics_port = dockerfile.env["BUCKETLOG_METRICS_PORT"]
    (exposed,) = dockerfile.final("EXPOSE")
    assert [p.split("/")[0] for p in exposed.split()] == [port, metrics_port]
    (healthcheck,) = dockerfile.final("HEALTHCHECK")
    cmd = json.loads(healthcheck[healthcheck.index("CMD ") + 4 :])
    assert cmd[:2] == ["python", "-c"]
    assert "BUCKETLOG_METRICS_PORT" in cmd[2] and f"'{metrics_port}'" in cmd[2]


def _healthcheck(dockerfile: Dockerfile) -> list[str]:
    (healthcheck,) = dockerfile.final("HEALTHCHECK")
    cmd: list[str] = json.loads(healthcheck[healthcheck.index("CMD ") + 4 :])
    return [sys.executable, *cmd[1:]]


def test_healthchecks_pass_when_the_agent_answers_and_fail_when_not(
    dockerfile: Dockerfile, compose: dict[str, Any], tmp_path: Path
) -> None:
    """The image's check (/healthz) and the compose file's (/readyz), against an agent."""
    test = compose["services"]["agent-1"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    commands = [_healthcheck(dockerfile), [sys.executable, *test[2:]]]
    (port, metrics_port) = free_ports(2)
    agent = BrokerProcess(
        data_dir=tmp_path / "data", port=port, extra_args=["--metrics-port", str(metrics_port)]
    ).start()
    env = {**os.environ, "BUCKETLOG_METRICS_PORT": str(metrics_port)}
    try:
        for cmd in commands:
            assert subprocess.run(cmd, env=env, timeout=10).returncode == 0
    finally:
        agent.stop()
    for cmd in commands:
        assert subprocess.run(cmd, env=env, capture_output=True, timeout=10).returncode != 0


def test_dockerfile_pins_the_foundationdb_client(dockerfile: Dockerfile) -> None:
    version = dockerfile.args["FDB_VERSION"]
    assert re.fullmatch(r"7\.3\.\d+", version)
    assert re.fullmatch(r"[0-9a-f]{64}", dockerfile.args["FDB_CLIENTS_SHA256"])
    runs = " ".join(dockerfile.final("RUN"))
    assert (
        "https://github.com/apple/foundationdb/releases/download/${FDB_VERSION}/"
        "foundationdb-clients_${FDB_VERSION}-1_amd64.deb" in runs
    )
    assert '"${FDB_CLIENTS_SHA256}  $deb" | sha256sum -c -' in runs
    # The Python bindings of the build stage are libfdb_c's version.
    text = (COMPOSE / "Dockerfile").read_text()
    assert text.count("ARG FDB_VERSION=" + version) == 2
    assert '"foundationdb==${FDB_VERSION}"' in text


def test_image_holds_the_package_sources(dockerfile: Dockerfile) -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    ignore = (COMPOSE / "Dockerfile.dockerignore").read_text()
    for pattern in packages:
        name = pattern.rstrip("*")
        assert f"COPY {name} ./{name}" in text
        assert f"!{name}/" in ignore


# -- docker-compose.yml --------------------------------------------------------------------


def test_every_bucketlog_variable_is_a_serve_option(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        unknown = {k for k in environment(service) if k.startswith(ENV_PREFIX)} - SERVE_VARIABLES
        assert not unknown, f"{name}: {unknown}"


def test_agents_are_the_image_and_parse_into_broker_configs(
    dockerfile: Dockerfile, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    agents = [n for n, s in services.items() if s.get("build", {}).get("dockerfile")]
    assert tuple(agents) == AGENTS
    entrypoint = json.loads(dockerfile.final("ENTRYPOINT")[0])
    for name in AGENTS:
        service = services[name]
        assert service["build"] == {"context": "..", "dockerfile": "compose/Dockerfile"}
        assert "command" not in service and "entrypoint" not in service
        args = parse_serve(agent_env(dockerfile, compose, name), entrypoint[1:], monkeypatch)
        config = config_from_args(args)
        assert config.host == "0.0.0.0"
        assert config.advertised == name  # the service name: what clients can resolve
        assert config.metadata_url == "fdb:///var/fdb/fdb.cluster"
        assert parse_fdb_url(config.metadata_url) == ("/var/fdb/fdb.cluster", "bucketlog")
        assert config.storage_url == "s3://bucketlog/data"
        assert config.s3_endpoint_url == "http://minio:9000"
        assert config.s3_addressing_style == "path"
        assert config.cluster_name == "compose"
        # The cluster file the URL names is mounted into the agent.
        targets = [c["target"] for c in service["configs"]]
        assert "/var/fdb/fdb.cluster" in targets


def test_ports_line_up(
    dockerfile: Dockerfile, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    entrypoint = json.loads(dockerfile.final("ENTRYPOINT")[0])
    exposed = int(dockerfile.final("EXPOSE")[0].split()[0].split("/")[0])  # the Kafka port
    endpoints = []
    for name in AGENTS:
        args = parse_serve(agent_env(dockerfile, compose, name), entrypoint[1:], monkeypatch)
        assert args.agents == 1
        config = config_from_args(args)
        assert [str(x) for x in config.bound_listeners] == [f"PLAINTEXT://0.0.0.0:{config.port}"]
        # Published 1:1: the advertised port is the one a host client connects to.
        assert config.advertised_port == config.port
        assert published(compose["services"][name]) == [(config.port, config.port)]
        endpoints.append(f"{config.advertised}:{config.advertised_port}")
    assert published(compose["services"]["agent-1"]) == [(exposed, exposed)]
    assert len(set(endpoints)) == len(endpoints)
    # The Spark pipeline is pointed at exactly these agents.
    command = compose["services"]["spark"]["command"]
    assert command[command.index("--bootstrap") + 1] == ",".join(endpoints)
    host_ports = [h for s in compose["services"].values() for h, _ in published(s)]
    assert len(host_ports) == len(set(host_ports))


def test_foundationdb_service(dockerfile: Dockerfile, compose: dict[str, Any]) -> None:
    services = compose["services"]
    fdb, init = services["fdb"], services["fdb-init"]
    client_version = dockerfile.args["FDB_VERSION"]
    assert fdb["image"] == init["image"] == f"foundationdb/foundationdb:{client_version}"
    cluster = compose["configs"]["fdb-cluster"]["content"]
    assert environment(fdb)["FDB_CLUSTER_FILE_CONTENTS"] == cluster
    description, _, coordinator = cluster.partition("@")
    assert re.fullmatch(r"\w+:\w+", description)
    ip, port = coordinator.split(":")
    assert environment(fdb)["FDB_PORT"] == port
    assert fdb["networks"]["default"]["ipv4_address"] == ip
    (subnet,) = [c["subnet"] for c in compose["networks"]["default"]["ipam"]["config"]]
    assert ip.rsplit(".", 1)[0] == subnet.split("/")[0].rsplit(".", 1)[0]
    script = init["entrypoint"][-1]
    assert "configure new single ssd" in script
    assert {"source": "fdb-cluster", "target": "/var/fdb/fdb.cluster"} in init["configs"]
    for name in AGENTS:
        depends = services[name]["depends_on"]
        assert depends["fdb-init"]["condition"] == "service_completed_successfully"


def test_minio_bucket_and_credentials(compose: dict[str, Any]) -> None:
    services = compose["services"]
    minio, init = environment(services["minio"]), services["minio-init"]
    script = init["entrypoint"][-1]
    assert "mc mb --ignore-existing local/bucketlog" in script
    for name in AGENTS:
        env = environment(services[name])
        assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
        assert env["BUCKETLOG_STORAGE"].startswith("s3://bucketlog/")
        assert services[name]["depends_on"]["minio-init"]["condition"] == (
            "service_completed_successfully"
        )
    assert published(services["minio"]) == [(9000, 9000), (9001, 9001)]


@pytest.mark.parametrize(("service", "shell"), [("fdb-init", "bash"), ("minio-init", "sh")])
def test_one_shot_scripts_parse(compose: dict[str, Any], service: str, shell: str) -> None:
    entrypoint = compose["services"][service]["entrypoint"]
    assert entrypoint[0].endswith("/" + shell) and entrypoint[1] == "-c"
    # Compose turns $$ into $ before the shell sees the script.
    script = entrypoint[2].replace("$$", "$")
    done = subprocess.run([shutil.which(shell) or shell, "-n", "-c", script], capture_output=True)
    assert done.returncode == 0, done.stderr


def test_fdb_init_loops_until_the_database_exists(compose: dict[str, Any], tmp_path: Path) -> None:
    # Run the script with a stand-in fdbcli that fails twice, then reports the database.
    script = compose["services"]["fdb-init"]["entrypoint"][2].replace("$$", "$")
    counter = tmp_path / "calls"
    fake = tmp_path / "fdbcli"
    fake.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {counter}\n"
        '[ "$n" -ge 3 ] && { echo "Database created"; exit 0; }\n'
        'echo "ERROR: timed out"; exit 1\n'
    )
    fake.chmod(0o755)
    script = script.replace("sleep 2", "sleep 0")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert counter.read_text().strip() == "3"
    assert done.stdout.strip().endswith("Database created")


def test_spark_runs_the_example_pipeline(compose: dict[str, Any]) -> None:
    spark = compose["services"]["spark"]
    image_version = spark["image"].rpartition(":")[2]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pinned = [d for deps in extras.values() for d in deps if d.startswith("pyspark==")]
    if pinned:  # the same Spark as the tests run
        assert pinned[0] == f"pyspark=={image_version}"
    command = spark["command"]
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{image_version}" in command
    script = next(c for c in command if c.endswith(".py"))
    mounts = {v.split(":")[1]: v.split(":")[0] for v in spark["volumes"] if v.startswith(".")}
    # The driver and the pipeline are the repository's files, mounted where it expects.
    assert mounts[script] == "./run_pipeline.py"
    assert mounts["/opt/bucketlog/integration"] == "../integration"
    assert (COMPOSE / "run_pipeline.py").is_file()
    assert (REPO / "integration" / "pipeline.py").is_file()
    for name in AGENTS:
        assert spark["depends_on"][name]["condition"] == "service_healthy"


def test_spark_command_parses_with_the_pipelines_options(compose: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO / "integration"))
    try:
        import pipeline  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(REPO / "integration"))
    command = compose["services"]["spark"]["command"]
    script_at = next(i for i, c in enumerate(command) if c.endswith(".py"))
    args = pipeline.parse_args(command[script_at + 1 :])
    assert args.bootstrap == "agent-1:9092,agent-2:9093,agent-3:9094"
    assert args.checkpoint.startswith("/var/lib/pipeline/")
    # run_pipeline.py hands every parsed option to pipeline.start, by its parameter names.
    source = (COMPOSE / "run_pipeline.py").read_text()
    for option in vars(args):
        assert f"=args.{option}," in source, option
    parameters = set(inspect.signature(pipeline.start).parameters)
    passed = set(re.findall(r"(\w+)=args\.", source))
    assert passed and passed <= parameters, passed - parameters
