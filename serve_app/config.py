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

from serve_app.autoscaling import APP_POLICY, QueueDurationAppPolicyConfig, pool_autoscaling_config
from serve_app.cost import PriceTable
from serve_app.notice_cap import NoticeCapConfig
from serve_app.placement import CapacitySplit
from serve_app.preemption import PreemptionConfig
from serve_app.templates import PromptTemplate

ENGINE_BACKENDS = ("vllm",)
"""Engine backends the builder can construct (see `serve_app.engine.create_engine`)."""

ANY_CAPACITY = "any"
"""Capacity type of an unpinned pool (runs wherever Ray places it)."""

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
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """Engine queue order: first come first served, or by request priority
    (realtime before batch) when the engine is saturated."""
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
    placement_group_bundle_label_selector: list[dict[str, str]] | None = None
    """Node labels per bundle (Serve ignores the actor's `label_selector` when
    bundles are set); how a tensor-parallel pool is pinned to a capacity type."""
    request_router_config: dict[str, Any] | None = None
    """Serve `RequestRouterConfig`; LLM pools default to the least-loaded
    router (`deployments.request_router`)."""

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


class PoolConfig(StrictModel):
    """One output-length bucket of a model and the replica pool that serves it."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Bucket name (`short`, `long`); part of the pool's deployment name."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """Upper edge: requests predicted to produce at most this many tokens land
    here. None (the last pool only) means no upper edge."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the model's engine arguments for this pool, e.g. a higher
    `max_num_seqs` for short answers."""
    deployment: DeploymentOptions | None = None
    """Serve options of this pool's replicas; None uses the model's."""
    queue_size: int = Field(default=256, gt=0)
    """Requests that may wait in the router for this pool; beyond it, 503."""
    spot_share: float | None = Field(default=None, ge=0, le=1)
    """Share of the pool's replicas on Spot nodes (Ray label `ray.io/market-type`).
    Set: the pool runs as an on-demand deployment (the baseline, rounded up) and a
    Spot one that falls back to on-demand nodes. None: no pinning (one machine)."""


class FallbackConfig(StrictModel):
    """Where a model's requests go while it has no running replica (scaled to zero)."""

    model: str
    """Served model that answers instead, e.g. the tiny CPU tier."""
    priorities: list[Literal["realtime", "batch"]] = Field(default_factory=lambda: ["realtime"])
    """Priorities that fall back; the others wait in the queue, and their demand
    (with the fallen-back requests) scales this model up."""


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
    pools: list[PoolConfig] = Field(default_factory=lambda: [PoolConfig(name="default")], min_length=1)
    """Length buckets, shortest first, each with its own replica pool. One pool
    means no bucketing."""
    fallback: FallbackConfig | None = None
    """Serve some priorities from another model while this one has no replica."""
    overrun: Literal["rebucket", "finish"] = "rebucket"
    """A request that reaches its bucket's edge unfinished: `rebucket` continues
    it (same stream, from the tokens so far) on the next bucket's pool;
    `finish` lets it run to its own limit where it is."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _MODEL_NAME.match(name):
            raise ValueError(f"model name {name!r} must match {_MODEL_NAME.pattern}")
        return name

    @model_validator(mode="after")
    def _pools_are_ordered_buckets(self) -> ModelConfig:
        names = [pool.name for pool in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        *bounded, last = self.pools
        if last.max_output_tokens is not None:
            raise ValueError(f"the last pool ({last.name}) must leave max_output_tokens unset")
        edges = [pool.max_output_tokens for pool in bounded]
        if None in edges or edges != sorted(set(edges)):
            raise ValueError("pools must be ordered by strictly increasing max_output_tokens")
        for pool in self.pools:
            self.pool_engine(pool)  # raises naming the bad override
        return self

    def pool_engine(self, pool: PoolConfig) -> EngineConfig:
        """The engine arguments of one pool: the model's, with the pool's overrides."""
        try:
            return EngineConfig.model_validate({**self.engine.model_dump(), **pool.engine})
        except ValueError as exc:
            raise ValueError(f"pool {pool.name}: {exc}") from None

    def pool_deployment(self, pool: PoolConfig) -> DeploymentOptions:
        return pool.deployment or self.deployment


class TemplateConfig(StrictModel):
    """A server-side prompt template; clients send its name and `params`."""

    prompt: str
    """Text with `{param}` placeholders, rendered as the prompt (completions) or
    the user message (chat). Write `{{`/`}}` for literal braces."""
    system: str | None = None
    """Optional system message for chat requests (placeholders allowed)."""
    description: str = ""
    """What the template is for, shown to operators."""


class PredictorConfig(StrictModel):
    """How the router predicts a request's output length (which picks its bucket)."""

    cold_start_tokens: int = Field(default=256, gt=0)
    """Prediction for a prompt class with too little history and no `max_tokens`."""
    min_samples: int = Field(default=8, gt=0)
    """Observed generations a class needs before its history is trusted."""
    quantile: float = Field(default=0.9, gt=0, le=1)
    """Quantile of a class's observed lengths used as its prediction (high, so
    few requests overrun their bucket)."""
    window: int = Field(default=256, gt=0)
    """Most recent observations kept per class."""


class PriorityConfig(StrictModel):
    """Priority classes: `realtime` is served first; `batch` yields and is shed first."""

    default: Literal["realtime", "batch"] = "realtime"
    """Priority of requests that name none (header `X-Priority` or field `priority`)."""
    batch_queue_share: float = Field(default=0.5, gt=0, le=1)
    """Share of each pool's queue that batch requests may fill; the rest is kept
    for realtime ones, so batch is refused first under load."""


class ApiKeyConfig(StrictModel):
    """One client's API key and limits. The key itself never sits in the config:
    give its SHA-256 or the environment variable that holds it."""

    name: str
    """Client name, used in metrics and logs."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the key."""
    env: str | None = None
    """Environment variable (on the router replicas) holding the key."""
    requests_per_s: float | None = Field(default=None, gt=0)
    """Sustained request rate allowed (bursts up to one second's worth); None: unlimited."""
    tokens_per_min: int | None = Field(default=None, gt=0)
    """Prompt + output tokens allowed per minute; None: unlimited."""

    @model_validator(mode="after")
    def _one_key_source(self) -> ApiKeyConfig:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError(f"api key {self.name!r}: set exactly one of sha256 or env")
        return self


class RouterConfig(StrictModel):
    """The OpenAI-compatible ingress."""

    max_body_bytes: int = Field(default=1_048_576, gt=0)
    """Largest request body accepted; larger ones get 413."""
    gzip_min_bytes: int = Field(default=1024, ge=0)
    """Responses at least this large are gzip-compressed for clients that accept it."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a non-streamed request may take before the router answers 504."""
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    """Output-length prediction."""
    priorities: PriorityConfig = Field(default_factory=PriorityConfig)
    """Priority classes."""
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    """Accepted API keys (`Authorization: Bearer <key>`); empty: no authentication."""
    max_attempts: int = Field(default=3, gt=0)
    """Tries per request when a replica is lost (a started stream resumes from
    the tokens already sent)."""
    retry_backoff_s: float = Field(default=0.5, ge=0)
    """Wait before the second try; doubles per further try."""
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
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    """How Spot replicas learn of an interruption and drain."""
    notice_cap: NoticeCapConfig = Field(default_factory=NoticeCapConfig)
    """Which requests fit in a Spot notice window (longer ones go on-demand)."""
    queue_autoscaling: bool = False
    """Pools with an `autoscaling_config` are scaled on router queue duration by
    `serve_app.autoscaling:RayAppPolicy`, which the Serve config must name as the
    application's `autoscaling_policy`: their own Ray delays are zeroed and the
    router reports its queues (`record_autoscaling_stats`)."""
    cost: PriceTable | None = None
    """Instance prices and each model's replica shape: meters replica uptime by
    capacity type and attributes it to requests (`GET /v1/cost`). None: off."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [model.name for model in models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
        return models

    @model_validator(mode="after")
    def _fallbacks_exist(self) -> AppConfig:
        models = self.model_by_name()
        for model in self.models:
            if model.fallback is None:
                continue
            target = models.get(model.fallback.model)
            if target is None or target is model:
                raise ValueError(f"model {model.name}: fallback {model.fallback.model!r} is not another served model")
            if target.fallback is not None:
                raise ValueError(f"model {model.name}: fallback {target.name} has a fallback itself")
        return self

    @model_validator(mode="after")
    def _every_pool_is_priced(self) -> AppConfig:
        if self.cost is not None:
            for model in self.models:
                for pool in model.pools:
                    try:
                        self.cost.shape(model.name, pool.name)
                    except KeyError as exc:
                        raise ValueError(f"cost: {exc.args[0]}") from None
        return self

    @model_validator(mode="after")
    def _templates_parse(self) -> AppConfig:
        for name, template in self.templates.items():
            PromptTemplate(name, template)  # raises ValueError naming the template
        return self

    def model_by_name(self) -> dict[str, ModelConfig]:
        return {model.name: model for model in self.models}

    def pool_deployments(self, model: ModelConfig, pool: PoolConfig) -> dict[str, dict[str, Any]]:
        """Serve options of each deployment of a pool, by capacity type."""
        options = model.pool_deployment(pool).serve_options()
        scaling = options.get("autoscaling_config")
        if self.queue_autoscaling and scaling is not None:
            options["autoscaling_config"] = pool_autoscaling_config(
                scaling.get("min_replicas", 1), scaling.get("max_replicas", 1), scaling.get("initial_replicas")
            )
        if pool.spot_share is None:
            return {ANY_CAPACITY: options}
        sides = CapacitySplit(pool.spot_share).serve_options(options)
        if "spot" in sides:
            # Serve stops a replica on a draining node this long before the
            # deadline, then lets it finish: give it the whole notice window.
            window = self.preemption.notice_window_s - self.preemption.drain_margin_s
            sides["spot"]["graceful_shutdown_timeout_s"] = window
        return sides


def pool_deployment_name(model_name: str, pool_name: str, capacity_type: str = ANY_CAPACITY) -> str:
    """The Serve deployment running one pool of a model on one capacity type."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in model_name)
    suffix = {ANY_CAPACITY: "", "spot": "-spot", "on-demand": "-ondemand"}[capacity_type]
    return f"LLMServer-{safe}-{pool_name}{suffix}"


def load_serve_config(path: str | Path) -> dict[str, Any]:
    """Read a Serve config file (the YAML `serve run` takes)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def app_configs(serve_config: dict[str, Any]) -> dict[str, AppConfig]:
    """Validate the `args` of every application in a Serve config, by app name."""
    applications = serve_config.get("applications") or []
    if not applications:
        raise ValueError("the Serve config defines no applications")
    configs = {}
    for app in applications:
        name = app.get("name", "default")
        configs[name] = config = AppConfig.model_validate(app.get("args") or {})
        policy = app.get("autoscaling_policy")
        if config.queue_autoscaling:
            if not policy or policy.get("policy_function") != APP_POLICY:
                raise ValueError(f"app {name!r}: queue_autoscaling needs autoscaling_policy.policy_function {APP_POLICY}")
            QueueDurationAppPolicyConfig.model_validate(policy.get("policy_kwargs") or {})
    return configs
