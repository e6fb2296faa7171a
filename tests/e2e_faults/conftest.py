"""One live app for the package, started in this process on a local Ray node:
the real SmolLM2 in two pools (short <= 64 tokens, long), one replica each, in
float32 so greedy runs on different engines agree token for token, with short
ingress deadlines so the timeout tests finish in seconds. A third model whose
engine refuses its config (a context longer than the model's) stands for a
pool whose replica can never start."""

from __future__ import annotations

import threading
import time

import pytest
import ray
from ray import serve

from benchmarks.servers import free_port
from serve_app.app import build_from_config
from serve_app.config import AppConfig
from tests.conftest import REPO

MODEL = "smollm2"
BROKEN = "smollm2-broken"
REQUEST_TIMEOUT_S = 40
ONE_THREAD = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def engine(**overrides) -> dict:
    return {"model": str(REPO / "models" / "SmolLM2-135M-Instruct"), "dtype": "float32", "max_model_len": 1024,
            "max_num_seqs": 16, "cpu_kv_cache_gib": 1, "enforce_eager": True, **overrides}


def pool(name: str, max_output_tokens: int | None = None) -> dict:
    return {"name": name, "max_output_tokens": max_output_tokens, "deployment": {
        "num_replicas": 1, "max_ongoing_requests": 16, "health_check_period_s": 2,
        "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": ONE_THREAD}}}}


def app_config() -> AppConfig:
    return AppConfig.model_validate({
        "models": [
            {"name": MODEL, "engine": engine(), "stream_chunk_tokens": 1,
             "pools": [pool("short", 64), pool("long")]},
            {"name": BROKEN, "engine": engine(max_model_len=10**6), "deployment": {
                "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}},
        ],
        "templates": {"capital": {"prompt": "What is the capital of {country}? Answer in one sentence."}},
        "ingress": {"request_timeout_s": REQUEST_TIMEOUT_S, "stream_idle_timeout_s": 20, "queue_timeout_s": 30,
                    "retry_backoff_s": 0.2, "max_attempts": 4},
    })


def running(deployment_prefix: str) -> int:
    app = serve.status().applications.get("llm")
    if app is None:  # not deployed yet
        return 0
    deployments = app.deployments
    return sum(n for name, d in deployments.items() if name.startswith(deployment_prefix)
               for state, n in d.replica_states.items() if getattr(state, "value", state) == "RUNNING")


def wait_for(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s}s"
        time.sleep(1)
    return time.monotonic() - started


def deploy() -> None:
    try:
        serve.run(build_from_config(app_config()), name="llm", route_prefix="/")
    except RuntimeError as exc:  # DEPLOY_FAILED: the broken model, as intended
        print(f"\n[faults] deploy finished with: {str(exc)[:200]}")


@pytest.fixture(scope="package")
def live_app():
    """(base URL without /v1, the app config)."""
    env = pytest.MonkeyPatch()
    env.setenv("PYTHONPATH", str(REPO))
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    started = time.monotonic()
    # `serve.run` waits for every deployment and raises once the broken one has
    # failed; the rest of the app keeps serving, so deploy from a thread.
    deploying = threading.Thread(target=deploy, daemon=True)
    deploying.start()
    wait_for(lambda: running(f"LLMServer-{MODEL}-short") + running(f"LLMServer-{MODEL}-long") == 2, 300,
             "both pools running")
    print(f"\n[faults] pools ready after {time.monotonic() - started:.0f}s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        env.undo()
