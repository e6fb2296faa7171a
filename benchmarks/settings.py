"""Each system's settings as it is given them, and the table of those that differ.

`system_settings` builds a flat record from the same objects the servers are
started from (the model's `ModelConfig`, the server kind and the stream interval
the server is given); `settings_table` renders the rows where systems differ,
so a report shows every unequal setting next to its figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from benchmarks.provenance import resolved_dtype
from serve_app.config import ModelConfig

ServerKind = Literal["app", "vllm", "rayllm"]

SERVERS: dict[str, str] = {
    "app": "this app (`serve run`)",
    "vllm": "vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`)",
    "rayllm": "Ray Serve LLM (`build_openai_app`)",
}
"""What runs each kind of system."""

STATS_LOGGING: dict[str, bool] = {"app": False, "vllm": False, "rayllm": True}
"""Engine stats logging per server kind: the app's engine is built with
`disable_log_stats=True`, the `vllm` baseline is started with `--disable-log-stats`,
Ray Serve LLM keeps vLLM's default (on)."""

VLLM_DEFAULT_STREAM_INTERVAL = 1
"""vLLM's `--stream-interval` default: every token its own chunk."""


def stream_interval(kind: ServerKind, model: ModelConfig, given: int | None) -> str:
    """Tokens per streamed chunk under load, as the system is configured."""
    if kind == "app":
        return f"{model.stream_chunk_tokens} (from {model.stream_busy_requests} in flight; 1 below)"
    return str(given or VLLM_DEFAULT_STREAM_INTERVAL)


def system_settings(kind: ServerKind, model: ModelConfig, *, stream_interval_tokens: int | None = None,
                    length_aware: bool = False, true_priority: bool = False) -> dict[str, Any]:
    """The settings one system runs with, flat (`engine.<arg>`, `env.<var>`)."""
    from benchmarks.servers import RAY_NODE_ENV, replica_engine_env

    engine = model.engine
    kwargs = {k: v for k, v in engine.engine_kwargs().items() if k not in ("model", "dtype")}
    env = replica_engine_env(model)
    if kind != "vllm":
        env |= RAY_NODE_ENV  # Serve nodes (this app's, Ray Serve LLM's) start with Ray's workers at this niceness
    return {
        "server": SERVERS[kind],
        "model": engine.model,
        "dtype": resolved_dtype(engine.dtype),
        "stream_interval": stream_interval(kind, model, stream_interval_tokens),
        "cpu_isolation": ("other processes moved off the engine's cores" if kind == "app" and engine.cpu_isolate_workers
                          else "none (processes float over every core)"),
        "stats_logging": "on" if STATS_LOGGING[kind] else "off",
        "reserved_cores": env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vLLM default (cores beyond the OMP binding)"),
        "length_awareness": "on" if length_aware else "off",
        "priority_from": "true class" if true_priority else ("predicted length" if length_aware else "none"),
        **{f"engine.{k}": v for k, v in sorted(kwargs.items())},
        **{f"env.{k}": v for k, v in sorted(env.items())},
    }


def differing(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`{setting: {system: value}}` for every setting whose value is not the same in all systems."""
    keys = list(dict.fromkeys(k for s in settings.values() for k in s))
    rows = {key: {name: s.get(key) for name, s in settings.items()} for key in keys}
    return {key: row for key, row in rows.items() if len({repr(v) for v in row.values()}) > 1}


def settings_table(settings: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of the settings that differ between systems (one column
    per system), or a line saying they are all equal."""
    rows = differing(settings)
    if not rows:
        return "All systems ran with the same settings."
    names = list(settings)
    lines = ["| setting | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {key} | " + " | ".join("-" if row[n] is None else str(row[n]) for n in names) + " |"
              for key, row in rows.items()]
    return "\n".join(lines)
