"""The Ray Serve LLM baseline: `ray.serve.llm.build_openai_app` on a config's
first model, with the same engine arguments, on a fresh local Ray cluster.

    python benchmarks/ray_serve_llm_app.py --config configs/local.yaml --port 8010

Serves until SIGTERM or Ctrl-C, then shuts Serve and Ray down. `RayServeLLMServer`
starts it as a `LocalServer` for the benchmarks.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.servers import RAY_NODE_ENV, LocalServer, replica_engine_env  # noqa: E402
from serve_app.config import ModelConfig, app_configs, load_serve_config  # noqa: E402
from serve_app.engine.cpu_dtype import engine_kwargs_here  # noqa: E402


def first_model(config_path: Path) -> ModelConfig:
    return next(iter(app_configs(load_serve_config(config_path)).values())).models[0]


def llm_config_kwargs(model: ModelConfig, cwd: Path) -> dict[str, Any]:
    """`LLMConfig` fields for `model`: one replica whose engine gets one CPU bundle,
    the model's engine arguments, and this app's replica engine environment."""
    engine = engine_kwargs_here(model.engine)
    source = engine.pop("model")
    local = cwd / source
    env_vars = {**replica_engine_env(model), **RAY_NODE_ENV}  # as this app's replicas run
    return {
        # A local directory goes in absolute: Ray's workers do not start in our cwd.
        "model_loading_config": {"model_id": model.name, "model_source": str(local) if local.exists() else source},
        "engine_kwargs": engine,
        "deployment_config": {"num_replicas": 1},
        "placement_group_config": {"bundles": [{"CPU": 1}]},
        "runtime_env": {"env_vars": env_vars},
    }


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-cpus", type=int, default=6,
                        help="logical CPUs of the local Ray node: the engine bundle, the LLM replica and "
                             "the ingress must all fit, even on 2 physical cores")
    args = parser.parse_args()

    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    signal.signal(signal.SIGTERM, _stop)
    llm_config = LLMConfig(**llm_config_kwargs(first_model(Path(args.config)), Path.cwd()))
    ray.init(address="local", num_cpus=args.num_cpus)  # a fresh cluster, as `serve run -a local`
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(build_openai_app({"llm_configs": [llm_config]}))
        print(f"Ray Serve LLM serving {llm_config.model_id} on 127.0.0.1:{args.port}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0
    finally:
        # Ending the local cluster ends Serve with it, without the ~60 s that
        # `serve.shutdown()` waits for the engine replica to drain.
        ray.shutdown()


class RayServeLLMServer(LocalServer):
    """This script as a child process. It is stopped with SIGTERM and counts as
    stopped only once its whole process group (the Ray cluster) has exited."""

    label = "ray-serve-llm"

    def __init__(self, config_path: Path, cwd: Path, stop_timeout_s: float = 90.0, **kwargs: Any) -> None:
        super().__init__(cwd, **kwargs)
        self.config_path = Path(config_path)
        self.stop_timeout_s = stop_timeout_s
        self.model_name = first_model(self.config_path).name

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--config", str(self.config_path),
                "--port", str(self.port)]

    def env(self) -> dict[str, str]:
        return {**super().env(), **RAY_NODE_ENV}  # as this app's node runs

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while (process.poll() is None or _group_alive(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
