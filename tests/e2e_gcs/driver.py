"""The Ray drivers of the GCS fault-tolerance test, each run as its own process.

A Ray driver ends its process when the GCS is unreachable for
`gcs_rpc_server_reconnect_timeout_s` (60 s), so the test's own process never
connects: it only owns the cluster's processes (and kills and restarts the GCS).

    python -m tests.e2e_gcs.driver deploy ADDRESS HTTP_PORT   # Serve and the app, then exit
    python -m tests.e2e_gcs.driver check ADDRESS              # prints the cluster's state as JSON
    python -m tests.e2e_gcs.driver shutdown ADDRESS           # Serve's graceful shutdown
"""

from __future__ import annotations

import json
import sys

import ray
from ray import serve

from serve_app.app import build_from_config
from serve_app.config import AppConfig
from tests.conftest import REPO, wait_until

MODEL = "smollm2"


def deploy(address: str, http_port: int) -> None:
    """Serve (detached: it outlives this driver) and one float32 replica of the real model."""
    ray.init(address=address)
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": http_port})
    config = AppConfig.model_validate({
        "models": [{"name": MODEL, "stream_chunk_tokens": 1, "engine": {
            "model": str(REPO / "models" / "SmolLM2-135M-Instruct"), "dtype": "float32", "max_model_len": 512,
            "max_num_seqs": 16, "cpu_kv_cache_gib": 1, "enforce_eager": True}}],
    })
    serve.run(build_from_config(config), name="llm", route_prefix="/")


def check(address: str) -> dict:
    """What the cluster recovered: the app's status (waited for up to 60 s), the nodes, new work."""
    ray.init(address=address)

    def app_status() -> str:
        return serve.status().applications["llm"].status.value

    wait_until(lambda: app_status() == "RUNNING", 60, poll_s=1)
    return {
        "app": app_status(),
        "nodes_alive": [node["Alive"] for node in ray.nodes()],
        "task": ray.get(ray.remote(num_cpus=0)(lambda: "scheduled").remote(), timeout=60),
    }


if __name__ == "__main__":
    command, address, *rest = sys.argv[1:]
    if command == "deploy":
        deploy(address, int(rest[0]))
    elif command == "check":
        print(json.dumps(check(address)))
    else:
        ray.init(address=address)
        serve.shutdown()
