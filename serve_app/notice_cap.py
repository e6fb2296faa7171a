"""The `max_tokens` cap of Spot pools: what one stream can decode inside the notice window.

Fed with finished requests (output tokens, seconds of decoding after the first
token), it keeps a low percentile of recent per-stream decode speeds per pool and
caps `max_tokens` at `floor(speed * (window - margin - prefill allowance))`, so a
request admitted just before a Spot notice still finishes before the node goes.
"""

from __future__ import annotations

import math
from collections import deque

from pydantic import BaseModel, ConfigDict, Field


class NoticeCapConfig(BaseModel):
    """How conservatively the cap estimates decode speed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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


class NoticeCap:
    """Per-pool decode-speed estimate and the `max_tokens` cap it implies."""

    def __init__(self, config: NoticeCapConfig, window_s: float, margin_s: float) -> None:
        budget_s = window_s - margin_s - config.prefill_allowance_s
        if budget_s <= 0:
            raise ValueError(
                f"notice window {window_s}s leaves no decode time after the {margin_s}s margin "
                f"and {config.prefill_allowance_s}s prefill allowance"
            )
        self._config = config
        self._budget_s = budget_s
        self._samples: dict[str, deque[float]] = {}

    def observe(self, pool: str, output_tokens: int, decode_s: float) -> None:
        """A finished request: `decode_s` runs from its first token to its last."""
        if output_tokens < self._config.min_sample_tokens or decode_s <= 0:
            return
        samples = self._samples.setdefault(pool, deque(maxlen=self._config.max_samples))
        samples.append((output_tokens - 1) / decode_s)

    def tokens_per_s(self, pool: str) -> float:
        """The pool's conservative per-stream decode speed."""
        samples = self._samples.get(pool, ())
        if len(samples) < self._config.min_samples:
            return self._config.default_tokens_per_s
        ordered = sorted(samples)
        return ordered[math.floor(self._config.percentile / 100 * (len(ordered) - 1))]

    def cap(self, pool: str) -> int:
        return max(self._config.min_tokens, math.floor(self.tokens_per_s(pool) * self._budget_s))

    def limit(self, pool: str, max_tokens: int | None) -> int:
        """`max_tokens` for a request to `pool`: the client's, or the cap if lower."""
        cap = self.cap(pool)
        return cap if max_tokens is None else min(max_tokens, cap)
