"""Spot interruptions: how replicas hear of them, and which requests may run on Spot."""

from __future__ import annotations

from pydantic import Field

from serve_app.config.base import StrictModel


class PreemptionConfig(StrictModel):
    """How a Spot replica learns that its node is going away."""

    enabled: bool = True
    """Watch for notices at all. Off: replicas never drain on their own."""
    watch_all_nodes: bool = False
    """Watch on every node, not only on nodes labelled `ray.io/market-type: spot`
    (tests, or clouds whose nodes carry no market-type label)."""
    imds: bool = True
    """Poll the instance metadata service's `spot/instance-action`. Off where
    pods cannot reach IMDS (EKS with hop limit 1, `configs/prod.yaml`): the
    notice then arrives only as a drain of the Ray node (Karpenter drains the
    node, the pod gets SIGTERM, Ray drains its node), which is always watched."""
    imds_url: str = "http://169.254.169.254"
    """Base URL of the instance metadata service; tests point it at a loopback fake."""
    imds_timeout_s: float = Field(default=1.0, gt=0)
    """Timeout of one IMDS request; the link-local endpoint answers in milliseconds."""
    poll_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between polls. AWS posts the notice two minutes ahead and
    recommends polling every 5 s."""
    notice_window_s: float = Field(default=120.0, gt=0)
    """Seconds between a notice and the instance going away (AWS Spot: 120).
    Requests placed on Spot must fit in it (`NoticeCapConfig`); also the deadline
    used when a drain arrives without one."""
    drain_margin_s: float = Field(default=10.0, ge=0)
    """Seconds before the deadline at which a draining replica stops waiting for
    its in-flight requests and reports unhealthy."""


class NoticeCapConfig(StrictModel):
    """Which requests may run on Spot: those a stream decodes inside the notice
    window, at a conservative measured decode speed."""

    percentile: float = Field(default=10.0, gt=0, lt=100)
    """Percentile of recent per-stream decode speeds used as the pool's speed:
    low, so slow streams (large batches, long contexts) still fit."""
    max_samples: int = Field(default=256, gt=0)
    """Recent requests kept per pool; older ones age out as load changes."""
    min_samples: int = Field(default=8, gt=0)
    """Below this many samples a pool is cold and uses `default_tokens_per_s`."""
    default_tokens_per_s: float = Field(default=5.0, gt=0)
    """Per-stream decode speed assumed while a pool is cold: low on purpose, so a
    new pool starts with a small cap that grows as it measures itself."""
    min_sample_tokens: int = Field(default=8, ge=2)
    """Requests with fewer output tokens are not sampled (too short to time)."""
    prefill_allowance_s: float = Field(default=5.0, ge=0)
    """Seconds reserved for queueing and prefill before the first token."""
    min_tokens: int = Field(default=16, gt=0)
    """The cap never goes below this, however slow the pool measures."""
