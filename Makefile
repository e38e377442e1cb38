# The two commands of the README:
#   make demo   set up .venv and run the embedded default (a local swarm of tiny built-in models)
#   make test   set up .venv with the dev extra and run the test suite
# `make test-quick` skips the slow multi-process tests.
# `make test` also installs vLLM for this machine (CPU build without a GPU) and requires its tests to run:
# SWARM_NODE_REQUIRE_VLLM=1 turns "vllm not installed" into an error instead of a skip.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-dev setup-test demo test test-quick lint

setup:
	./scripts/setup.sh

setup-dev:
	./scripts/setup.sh dev

setup-test:
	./scripts/setup.sh dev,vllm

demo: setup
	$(VENV)/bin/swarm-node demo

test: setup-test
	SWARM_NODE_REQUIRE_VLLM=1 $(PY) -m pytest -q

test-quick: setup-dev
	$(PY) -m pytest -q -m "not slow"

lint: setup-dev
	$(VENV)/bin/ruff check swarm_node tests benchmarks
