# Two commands do everything on a fresh machine:
#   make run    prepare the venv and the tiny model, then `serve run configs/local.yaml`
#   make test   prepare the same, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/local.yaml

.PHONY: setup run test test-unit bench bench-sharegpt validate

setup:
	scripts/setup_env.sh $(VENV)

# Ray nices its workers to 15; Serve's proxy and the ingress then lose the core
# they share with the engine's spinning scheduler (nice 0, like `vllm serve`).
run: setup
	RAY_worker_niceness=0 $(VENV)/bin/serve run $(CONFIG)

test: setup
	$(PY) -m pytest -v --durations=25 tests

test-unit: setup
	$(PY) -m pytest -v -m "not e2e and not slow and not cluster" tests

validate: setup
	$(PY) -m serve_app.tools.cli validate configs/local.yaml configs/prod.yaml

bench: setup
	$(PY) benchmarks/throughput.py --config $(CONFIG)

bench-sharegpt: setup
	$(PY) benchmarks/sharegpt_serve.py --config $(CONFIG)
