"""Typed application config: one YAML file -> `AppConfig` -> builder.

A Serve config file (`configs/*.yaml`) carries an `AppConfig` as the `args` of its
application; `serve run` hands those args to `serve_app.builder:build_app`, which
validates them here. Every model forbids unknown keys, so a misspelt field fails
with its dotted path in the error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.templates import PromptTemplate

ENGINE_BACKENDS = ("vllm",)
"""Engine backends the builder can construct (see `serve_app.engine.create_engine`)."""

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(StrictModel):
    """Engine arguments for one model's replicas (vLLM `AsyncEngineArgs` subset)."""

    model: str
    """HF model id or a local checkpoint directory. Relative paths resolve
    against the directory `serve run` is started from."""
    tokenizer: str | None = None
    """Tokenizer id or directory; defaults to `model`."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Activation/weight dtype the engine computes in."""
    quantization: str | None = None
    """vLLM quantization method: `fp8` on H100/H200, `awq`/`gptq` on other GPUs,
    `int8_per_channel_weight_only` on CPU. None serves the checkpoint as is."""
    max_model_len: int | None = Field(default=None, gt=0)
    """Context length (prompt + output tokens); None uses the model's own."""
    max_num_seqs: int = Field(default=256, gt=0)
    """Most sequences one engine step batches together."""
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    """Token budget of one engine step (chunked prefill); None lets vLLM choose."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (templates, system prompts)."""
    tensor_parallel_size: int = Field(default=1, gt=0)
    """GPUs one replica shards the model over."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory vLLM may claim (weights + KV cache)."""
    cpu_kv_cache_gib: int | None = Field(default=None, gt=0)
    """CPU builds only: GiB of KV cache (sets VLLM_CPU_KVCACHE_SPACE)."""
    seed: int = 0
    """Engine RNG seed, so sampled runs repeat."""
    extra_engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further `AsyncEngineArgs` fields passed through verbatim."""

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for vLLM's `AsyncEngineArgs`."""
        kwargs = self.model_dump(exclude={"cpu_kv_cache_gib", "extra_engine_args"})
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        return {**kwargs, **self.extra_engine_args}


class DeploymentOptions(StrictModel):
    """Ray Serve options of one deployment (`serve.deployment(...)` keywords)."""

    num_replicas: int | None = Field(default=None, ge=0)
    """Fixed replica count; leave unset when `autoscaling_config` is given."""
    autoscaling_config: dict[str, Any] | None = None
    """Serve `AutoscalingConfig` (min/max replicas, targets, delays)."""
    max_ongoing_requests: int = Field(default=64, gt=0)
    """Requests one replica holds at once before Serve queues at the caller."""
    max_queued_requests: int = Field(default=-1, ge=-1)
    """Requests queued at callers before Serve answers 503 (-1: unbounded)."""
    health_check_period_s: float = Field(default=10.0, gt=0)
    """Seconds between replica health checks."""
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a health check may take before the replica is marked unhealthy."""
    graceful_shutdown_timeout_s: float = Field(default=30.0, ge=0)
    """Seconds a stopping replica gets to finish in-flight requests."""
    ray_actor_options: dict[str, Any] = Field(default_factory=dict)
    """Ray actor options: `num_cpus`, `num_gpus`, `resources`, `runtime_env`, ..."""
    placement_group_bundles: list[dict[str, float]] | None = None
    """Resource bundles reserved per replica (tensor-parallel workers), the
    first of which hosts the replica actor itself."""
    placement_group_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = None
    """How the bundles are placed; STRICT_PACK keeps a TP group on one node."""

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        return self

    def serve_options(self) -> dict[str, Any]:
        """Keyword arguments for `Deployment.options(...)`."""
        options = self.model_dump()
        if options["num_replicas"] is None and options["autoscaling_config"] is None:
            options["num_replicas"] = 1
        return {key: value for key, value in options.items() if value is not None}


class ModelConfig(StrictModel):
    """One served model: its engine and the deployment that runs it."""

    name: str
    """Model id clients send in `model` and see in `/v1/models`."""
    backend: Literal[ENGINE_BACKENDS] = "vllm"  # type: ignore[valid-type]
    """Engine implementation behind the `LLMEngine` interface."""
    engine: EngineConfig
    """Engine arguments."""
    deployment: DeploymentOptions = Field(
        default_factory=lambda: DeploymentOptions(ray_actor_options={"num_cpus": 1})
    )
    """Ray Serve options of this model's replicas."""
    stream_interval_ms: float = Field(default=50.0, ge=0)
    """Streamed output is sent to the router at most this often (the first token
    at once); fewer, larger chunks leave more CPU to the engine. 0 sends every step."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _MODEL_NAME.match(name):
            raise ValueError(f"model name {name!r} must match {_MODEL_NAME.pattern}")
        return name


class TemplateConfig(StrictModel):
    """A server-side prompt template; clients send its name and `params`."""

    prompt: str
    """Text with `{param}` placeholders, rendered as the prompt (completions) or
    the user message (chat). Write `{{`/`}}` for literal braces."""
    system: str | None = None
    """Optional system message for chat requests (placeholders allowed)."""
    description: str = ""
    """What the template is for, shown to operators."""


class RouterConfig(StrictModel):
    """The OpenAI-compatible ingress."""

    max_body_bytes: int = Field(default=1_048_576, gt=0)
    """Largest request body accepted; larger ones get 413."""
    gzip_min_bytes: int = Field(default=1024, ge=0)
    """Responses at least this large are gzip-compressed for clients that accept it."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a non-streamed request may take before the router answers 504."""
    deployment: DeploymentOptions = Field(
        default_factory=lambda: DeploymentOptions(
            max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0}
        )
    )
    """Ray Serve options of the router replicas."""


class AppConfig(StrictModel):
    """Everything one application needs: models, templates and the router."""

    models: list[ModelConfig] = Field(min_length=1)
    """Served models; the first is the default when a request names none."""
    templates: dict[str, TemplateConfig] = Field(default_factory=dict)
    """Prompt templates by name."""
    router: RouterConfig = Field(default_factory=RouterConfig)
    """Ingress settings."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [model.name for model in models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
        return models

    @model_validator(mode="after")
    def _templates_parse(self) -> AppConfig:
        for name, template in self.templates.items():
            PromptTemplate(name, template)  # raises ValueError naming the template
        return self

    def model_by_name(self) -> dict[str, ModelConfig]:
        return {model.name: model for model in self.models}


def load_serve_config(path: str | Path) -> dict[str, Any]:
    """Read a Serve config file (the YAML `serve run` takes)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def app_configs(serve_config: dict[str, Any]) -> dict[str, AppConfig]:
    """Validate the `args` of every application in a Serve config, by app name."""
    applications = serve_config.get("applications") or []
    if not applications:
        raise ValueError("the Serve config defines no applications")
    return {
        app.get("name", "default"): AppConfig.model_validate(app.get("args") or {})
        for app in applications
    }
