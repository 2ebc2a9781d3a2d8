# Quick start: `make run` starts a broker on 127.0.0.1:9092; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint unit kcat clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/bucketlog serve

kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat; }

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/mypy

# The whole suite, then a second configuration: the end-to-end tests again with every
# broker on the S3 store (a moto server) and SQLite metadata.
test: $(STAMP) kcat lint
	$(BIN)/python -m pytest -q -p no:cacheprovider
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/e2e --object-store s3

# Apache Kafka vs bucketlog on this machine (~15 min); not part of `make test`.
bench: $(STAMP)
	$(BIN)/python integration/bench/run.py

clean:
	rm -rf $(VENV) bucketlog-data
