# Quick start: `make run` starts a broker on 127.0.0.1:9092; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.run-stamp

.PHONY: run test lint unit kcat prometheus maven jars clean bench soak chaos

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

# The broker alone (no test or Spark packages): quick on a fresh machine.
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/bucketlog serve

kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat; }

# A Prometheus server, to scrape an agent's /metrics in tests/e2e/test_prometheus_scrape.py.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# Java and Maven, for Spark's Kafka connector and Apache Kafka's tools (tests/integration).
maven:
	@{ command -v mvn && command -v java; } >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq maven; }

# The jars of integration/pom.xml, from Maven Central into integration/.cache/jars (once;
# again when the pom or the script changes).
JARS_STAMP := integration/.cache/jars/.fetched
$(JARS_STAMP): integration/pom.xml integration/fetch-jars.sh | $(STAMP) maven
	PYTHON=$(BIN)/python integration/fetch-jars.sh
	touch $@

jars: $(JARS_STAMP)

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/mypy

# The whole suite, then a second configuration: the end-to-end tests again with every
# broker on the S3 store (a moto server) and SQLite metadata. Each configuration runs in
# two passes: first the tests not marked `serial`, in TEST_WORKERS pytest processes
# (pytest-xdist, whole files to each: most of them wait on brokers, clients and timers,
# not on a core), then the `serial` ones (kills, faults, chaos, the JVMs) in one process
# alone. TEST_WORKERS=0 runs each configuration in one process, in one pass.
# Bytecode is written while testing, even where PYTHONDONTWRITEBYTECODE is set: pytest
# keeps each test module's rewritten asserts beside it and reads them in every later pytest
# process (a collection of the whole suite takes 6 s of CPU then, 18.6 without), and each
# agent a test starts reads its modules compiled. PYTHONFAULTHANDLER: a crash in native
# code (a client library's threads), even after the summary as the interpreter exits,
# prints every thread's Python stack.
TEST_WORKERS ?= 2
PYTEST := PYTHONDONTWRITEBYTECODE= PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q -p no:cacheprovider
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile -m "not serial")
test: $(STAMP) kcat prometheus jars lint
	$(PYTEST) $(PARALLEL)
	$(if $(PARALLEL),$(PYTEST) -m serial)
	$(PYTEST) tests/e2e --object-store s3 $(PARALLEL)
	$(if $(PARALLEL),$(PYTEST) tests/e2e --object-store s3 -m serial)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,spark,bench]'
	touch $(BENCH_STAMP)

# Apache Kafka vs bucketlog on this machine (~15 min, and ~10 more for the pinned-core and
# S3-store rows); not part of `make test`. BENCH_ARGS: more options of run.py, e.g.
# BENCH_ARGS="--systems= --extras s3" for the S3-store rows alone.
BENCH_ARGS ?=
bench: $(BENCH_STAMP) jars
	$(BIN)/python integration/bench/run.py $(BENCH_ARGS)

# Retention, garbage collection and compaction under 20 minutes of steady load, with a plot.
soak: $(BENCH_STAMP) jars
	$(BIN)/python integration/bench/soak.py

# The chaos scenarios of integration/chaos against agents started here, each bounded in
# time and count (about 15 minutes on 2 cores); a JSON report of each, with the machine,
# in integration/chaos/results/. The disk-full runs need root to mount a tmpfs; without
# it they say so and exit 3, which does not stop the rest.
CHAOS := integration/chaos/results/$$(date -u +%F)
# How long S3 faults last in `make chaos` (600: the 10-minute run, about 11 minutes alone).
S3_FAULT_S ?= 45
chaos: $(STAMP)
	mkdir -p integration/chaos/results
	$(BIN)/python -m integration.chaos.killloop --agents 3 --kills 1000 --interval-s 0.35 \
	  --seconds 720 --report $(CHAOS)-kill-loop.json
	$(BIN)/python -m integration.chaos.killloop --agents 3 --kills 100 --interval-s 1 \
	  --topic-config bucketlog.topic.type=lightning --classic-alongside \
	  --agent-arg=--journal-sweep-interval-ms --agent-arg=1000 \
	  --agent-arg=--journal-idle-ms --agent-arg=2000 --report $(CHAOS)-kill-loop-lightning.json
	$(BIN)/python -m integration.chaos.transactions --agents 3 --transactions 5000 --kills 200 \
	  --interval-s 2 --seconds 480 --seed 1 --report $(CHAOS)-transactions.json
	$(BIN)/python integration/chaos/fuzz.py --cases 100000 --seed 0 --report $(CHAOS)-fuzz.json
	$(BIN)/python -m integration.chaos.s3faults --fault-rate 0.2 --seconds $(S3_FAULT_S) \
	  --report $(CHAOS)-s3-faults.json
	$(BIN)/python -m integration.chaos.metafaults --lock-s 35 --gap-s 3 --seconds 36 \
	  --report $(CHAOS)-metadata-long-lock.json
	$(BIN)/python -m integration.chaos.diskfull --store objects --full-s 4 --gap-s 2 \
	  --seconds 15 --report $(CHAOS)-disk-full-objects.json || test $$? -eq 3
	$(BIN)/python -m integration.chaos.diskfull --store metadata --full-s 4 --gap-s 2 \
	  --seconds 15 --report $(CHAOS)-disk-full-metadata.json || test $$? -eq 3

clean:
	rm -rf $(VENV) bucketlog-data
