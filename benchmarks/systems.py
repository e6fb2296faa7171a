"""The systems the benchmarks compare, each a `LocalServer` started on this
machine one at a time, with the same engine flags and dtype.

- `app`: this app, `serve run` on a config with length-aware scheduling;
- `nobuckets`: the same app with length awareness off;
- `int8`: this app on the W8A8 INT8 checkpoint (`configs/local-int8.yaml`);
- `vllm`, `vllm-int8`: vLLM's own OpenAI server with the first model's engine
  flags (optionally with its scheduling policy replaced) and the app's stream
  interval (`--stream-interval` = `stream_chunk_tokens`), so headline ratios
  compare equal settings;
- `vllm-si1`: as `vllm` at vLLM's default stream interval (1), shown beside it;
- `vllm-priority`: vLLM's server with `--scheduling-policy priority`; requests
  carry `priority` from their true class (what in-engine shortest-first alone buys);
- `rayllm`: Ray Serve LLM (`build_openai_app`) on the first model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.provenance import portable
from benchmarks.ray_serve_llm_app import RayServeLLMServer
from benchmarks.servers import LocalServer, ServeRunServer, VLLMServer
from benchmarks.settings import system_settings
from serve_app.config import AppConfig, ModelConfig, app_configs, load_serve_config


@dataclass(frozen=True)
class System:
    name: str
    make: Callable[[], LocalServer]
    description: str
    engine: dict[str, Any]
    """The engine settings it was given (the model's `EngineConfig`)."""
    uses_template: bool = False
    """Accepts this app's server-side templates (`template` + `params`)."""
    true_priority: bool = False
    """Requests carry vLLM's integer `priority` from their true class."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Everything it runs with, flat (`benchmarks.settings.system_settings`): the
    source of the settings table and of each result's provenance."""


def first_app(config_path: Path) -> AppConfig:
    return next(iter(app_configs(load_serve_config(config_path)).values()))


def with_policy(model: ModelConfig, policy: str | None) -> ModelConfig:
    """`model` with its engine's scheduling policy replaced (None: as configured)."""
    if policy is None:
        return model
    return model.model_copy(update={"engine": model.engine.model_copy(update={"scheduling_policy": policy})})


def registry(repo: Path, config: str, nobuckets_config: str | None = None, int8_config: str | None = None,
             vllm_policy: str | None = None) -> dict[str, System]:
    """Every system the given config files allow. `vllm_policy` replaces the
    `vllm` baseline's scheduling policy (the mixed workload's FCFS baseline)."""
    config_path = repo / config
    app = first_app(config_path)
    model = app.models[0]
    vllm_model = with_policy(model, vllm_policy)
    priority_model = with_policy(model, "priority")
    interval = model.stream_chunk_tokens
    systems = {
        "app": System("app", lambda: ServeRunServer(config_path, cwd=repo), f"this app, {config}",
                      model.engine.model_dump(), uses_template=True,
                      settings=system_settings("app", model, length_aware=model.length_scheduling.enabled)),
        "vllm": System("vllm", lambda: VLLMServer(vllm_model, cwd=repo, stream_interval=interval),
                       f"vLLM's OpenAI server, {config}'s engine flags, policy {vllm_model.engine.scheduling_policy}, "
                       f"--stream-interval {interval} (the app's)", vllm_model.engine.model_dump(),
                       settings=system_settings("vllm", vllm_model, stream_interval_tokens=interval)),
        "vllm-si1": System("vllm-si1", lambda: VLLMServer(vllm_model, cwd=repo),
                           f"vLLM's OpenAI server, {config}'s engine flags, policy "
                           f"{vllm_model.engine.scheduling_policy}, default stream interval",
                           vllm_model.engine.model_dump(), settings=system_settings("vllm", vllm_model)),
        "vllm-priority": System(
            "vllm-priority", lambda: VLLMServer(priority_model, cwd=repo, stream_interval=interval),
            "vLLM's OpenAI server, --scheduling-policy priority, priority from the true class",
            priority_model.engine.model_dump(), true_priority=True,
            settings=system_settings("vllm", priority_model, stream_interval_tokens=interval, true_priority=True)),
        "rayllm": System("rayllm", lambda: RayServeLLMServer(config_path, cwd=repo),
                         f"Ray Serve LLM (build_openai_app), {config}'s engine flags", model.engine.model_dump(),
                         settings=system_settings("rayllm", model)),
    }
    # each lambda gets its own path variable: one shared name, reassigned, sent
    # every system built from it to the last config assigned
    if nobuckets_config and (repo / nobuckets_config).exists():
        nobuckets_path = repo / nobuckets_config
        nobuckets_model = first_app(nobuckets_path).models[0]
        systems["nobuckets"] = System(
            "nobuckets", lambda: ServeRunServer(nobuckets_path, cwd=repo),
            f"this app, length awareness off, {nobuckets_config}", nobuckets_model.engine.model_dump(),
            uses_template=True,
            settings=system_settings("app", nobuckets_model, length_aware=nobuckets_model.length_scheduling.enabled))
    if int8_config and (repo / int8_config).exists():
        int8_path = repo / int8_config
        int8_model = first_app(int8_path).models[0]
        int8_interval = int8_model.stream_chunk_tokens
        systems["int8"] = System(
            "int8", lambda: ServeRunServer(int8_path, cwd=repo), f"this app, INT8, {int8_config}",
            int8_model.engine.model_dump(), uses_template=True,
            settings=system_settings("app", int8_model, length_aware=int8_model.length_scheduling.enabled))
        systems["vllm-int8"] = System(
            "vllm-int8", lambda: VLLMServer(int8_model, cwd=repo, stream_interval=int8_interval),
            f"vLLM's OpenAI server, {int8_config}'s engine flags, --stream-interval {int8_interval}",
            int8_model.engine.model_dump(),
            settings=system_settings("vllm", int8_model, stream_interval_tokens=int8_interval))
    return systems


def choose(systems: dict[str, System], names: str, allowed: tuple[str, ...]) -> list[System]:
    """The systems named in a comma list, in that order; ValueError on an unknown or unavailable one."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in allowed]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(allowed)}")
    missing = [n for n in chosen if n not in systems]
    if missing:
        raise ValueError(f"systems {missing} need a config file that does not exist")
    return [systems[n] for n in dict.fromkeys(chosen)]


def server_pid(server: LocalServer) -> int | None:
    """The started server's root process (its descendants are the system under test)."""
    process = getattr(server, "_process", None)
    return process.pid if process is not None else None


def server_command(server: LocalServer) -> str:
    """The server's command line as the result file records it: no machine paths (files
    in this checkout relative to it, a config's temporary copy by the config's name)."""
    try:
        return " ".join(portable(word) for word in server.command())
    except Exception as exc:  # only for the record
        return f"unknown ({type(exc).__name__})"

