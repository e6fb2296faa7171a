# Two commands do everything on a fresh machine:
#   make run    prepare the venv and the tiny model, then `serve run configs/local.yaml`
#   make test   prepare the same, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/local.yaml

.PHONY: setup run test test-unit validate bench bench-throughput bench-sharegpt bench-predictor bench-fleet

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

# Every committed result file again, with the command it records (a test holds the two
# together; hours on 2 cores, the machine to itself), then the README's tables from them.
bench: bench-throughput bench-sharegpt bench-predictor bench-fleet
	$(PY) benchmarks/render_readme.py

bench-throughput: setup
	$(PY) benchmarks/throughput.py --systems app,vllm --repeats 3 --requests 64 --concurrency 32 --max-tokens 128 --warmup 8 --no-quality --curve-systems ''

bench-sharegpt: setup
	$(PY) benchmarks/sharegpt_serve.py --num-prompts 128

bench-predictor: setup
	$(PY) benchmarks/own_outputs.py --requests 400
	$(PY) benchmarks/predictor_bench.py
	$(PY) benchmarks/predictor_bench.py --lengths benchmarks/results/smollm2_sharegpt_lengths.json --window 50 --out benchmarks/results/predictor_smollm2.json

bench-fleet: setup
	$(PY) -m benchmarks.fleetsim.profile_engine
	$(PY) -m benchmarks.fleetsim.validate
	$(PY) -m benchmarks.fleetsim.project
	$(PY) -m benchmarks.fleetsim.project --engine llama-3.1-8b-l40s --out benchmarks/results/fleetsim_routing_l40s
	$(PY) -m benchmarks.fleetsim.spot_project
