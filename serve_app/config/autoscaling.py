"""Queue-duration autoscaling: how each pool follows the time requests wait for it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from serve_app.config.base import StrictModel

APP_POLICY = "serve_app.autoscaling.entry:RayAppPolicy"
"""`policy_function` a Serve config names as its application's `autoscaling_policy`."""


class QueueDurationAutoscaling(StrictModel):
    """How one pool follows the time its requests wait in the ingress's queue."""

    target_queue_wait_s: float = Field(default=2.0, gt=0)
    """Queue wait the pool is sized for; sustained waits above it add replicas."""
    percentile: Literal["p50", "p90"] = "p90"
    """Which percentile of recent waits is the signal (raised to the oldest
    waiting request's age when that is longer)."""
    upscale_delay_s: float = Field(default=30.0, ge=0)
    """The signal must stay above target this long before replicas are added,
    so a one-sample spike never scales."""
    downscale_delay_s: float = Field(default=300.0, ge=0)
    """The signal must stay at or below target, with the load fitting in fewer
    replicas, this long before replicas are removed."""
    max_step_up: int = Field(default=2, gt=0)
    """Most replicas added by one decision."""
    max_step_down: int = Field(default=1, gt=0)
    """Most replicas removed by one decision (idle-to-zero excepted)."""
    downscale_max_utilization: float = Field(default=0.8, gt=0, le=1)
    """Replicas are removed only down to a count whose slots the current load
    (queued + in flight) fills at most this much, so the smaller pool is not
    full at once."""
    min_replicas: int = Field(default=0, ge=0)
    """Fewest replicas (the deployment's own `min_replicas` also applies)."""
    max_replicas: int | None = Field(default=None, gt=0)
    """Most replicas; None: the deployment's `max_replicas` alone."""
    scale_from_zero_delay_s: float = Field(default=10.0, ge=0)
    """At zero replicas, demand (queued or diverted requests) must last this long
    before one replica starts; brief blips stay with the fallback model."""
    idle_to_zero_delay_s: float | None = Field(default=600.0, ge=0)
    """With nothing queued, in flight or diverted for this long the pool goes to
    zero (if `min_replicas` is 0). None: never to zero."""

    @model_validator(mode="after")
    def _bounds(self) -> QueueDurationAutoscaling:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        return self


class QueueDurationAppPolicyConfig(StrictModel):
    """`policy_kwargs` of the application-level policy."""

    default: QueueDurationAutoscaling = Field(default_factory=QueueDurationAutoscaling)
    """Settings of every pool."""
    pools: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Overrides of `default` by queue name (the pool's deployment name without
    a capacity suffix), e.g. a longer target wait for a batch-heavy pool."""
    stale_after_s: float = Field(default=60.0, gt=0)
    """An ingress replica whose newest report is older than this is ignored; with
    none left the pools hold (their metrics are missing)."""

    @model_validator(mode="after")
    def _overrides_valid(self) -> QueueDurationAppPolicyConfig:
        for queue in self.pools:
            self.for_queue(queue)
        return self

    def for_queue(self, queue: str) -> QueueDurationAutoscaling:
        return QueueDurationAutoscaling.model_validate({**self.default.model_dump(), **self.pools.get(queue, {})})
