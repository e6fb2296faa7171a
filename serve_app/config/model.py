"""A served model: its engine, its length-bucket pools and where it falls back."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from serve_app.config.base import StrictModel
from serve_app.config.deployment import DeploymentOptions
from serve_app.config.engine import ENGINE_BACKENDS, EngineConfig
from serve_app.config.ingress import Priority
from serve_app.config.scheduling import LengthSchedulingConfig

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


class PoolConfig(StrictModel):
    """One output-length bucket of a model and the replica pool that serves it."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Pool name (`short`, `long`); part of its deployment name."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """Upper edge of the bucket: requests predicted to produce at most this many
    tokens land here. None (the last pool only) means no upper edge."""
    engine: dict = Field(default_factory=dict)
    """Overrides of the model's engine arguments for this pool, e.g. a higher
    `max_num_seqs` for short answers."""
    deployment: DeploymentOptions | None = None
    """Serve options of this pool's replicas; None uses the model's."""
    queue_size: int = Field(default=256, gt=0)
    """Requests that may wait in the ingress for this pool; beyond it, 503."""
    spot_share: float | None = Field(default=None, ge=0, le=1)
    """Share of the pool's replicas on Spot nodes (Ray label `ray.io/market-type`).
    Set: the pool runs as an on-demand deployment (the baseline, rounded up) and a
    Spot one that falls back to on-demand nodes. None: no pinning (one machine)."""


class FallbackConfig(StrictModel):
    """Where a model's requests go while it has no running replica (scaled to zero)."""

    model: str
    """Served model that answers instead, e.g. the tiny CPU tier."""
    priorities: list[Priority] = Field(default_factory=lambda: ["realtime"])
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
    stream_chunk_tokens: int = Field(default=4, ge=1)
    """Output tokens per streamed chunk while a replica is busy (vLLM's
    per-request `stream_interval`): fewer, larger chunks leave more CPU to the
    engine. The first and the last chunk always go out at once."""
    stream_busy_requests: int = Field(default=8, ge=1)
    """Requests in flight on a replica from which it counts as busy; below it
    every token is streamed as soon as it is decoded."""
    pools: list[PoolConfig] = Field(default_factory=lambda: [PoolConfig(name="default")], min_length=1)
    """Length buckets, shortest first, each with its own replica pool. One pool
    means no bucketing."""
    fallback: FallbackConfig | None = None
    """Serve some priorities from another model while this one has no replica."""
    tool_call_parser: str | None = None
    """vLLM's tool parser for this model's tool calls (`vllm serve
    --tool-call-parser`, with `--enable-auto-tool-choice`), e.g. `hermes`. None:
    `tools` are served with `tool_choice` `none`, `required` or a named function
    (vLLM constrains the output), and `auto` is refused as `vllm serve` refuses it."""
    length_scheduling: LengthSchedulingConfig = Field(default_factory=LengthSchedulingConfig)
    """Length-aware order and caps inside each pool (the pools themselves split
    by length only where they own compute)."""
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

    def pool(self, name: str) -> PoolConfig:
        return next(pool for pool in self.pools if pool.name == name)

    def stream_interval(self, in_flight: int) -> int:
        """Output tokens per chunk for a request that finds a replica running `in_flight`."""
        return self.stream_chunk_tokens if in_flight >= self.stream_busy_requests else 1

    def pool_engine(self, pool: PoolConfig) -> EngineConfig:
        """The engine arguments of one pool: the model's, with the pool's overrides."""
        try:
            return EngineConfig.model_validate({**self.engine.model_dump(), **pool.engine})
        except ValueError as exc:
            raise ValueError(f"pool {pool.name}: {exc}") from None

    def max_context_tokens(self) -> int | None:
        """The longest context any of its pools runs (a request may move to any);
        None if one leaves `max_model_len` unset (the checkpoint's own, unknown here)."""
        lengths = [self.pool_engine(pool).max_model_len for pool in self.pools]
        return None if None in lengths else max(lengths)

    def pool_deployment(self, pool: PoolConfig) -> DeploymentOptions:
        return pool.deployment or self.deployment
