"""How much one stream decodes inside a Spot notice window, measured per deployment.

Fed with finished attempts (output tokens, seconds of decoding after the first
token), it keeps a low percentile of recent per-stream decode speeds per
deployment. `cap()` is `floor(speed * (window - margin - prefill allowance))`:
the longest output that, admitted just before a Spot notice, still finishes
before the node goes. The chooser sends longer requests on-demand.
"""

from __future__ import annotations

import math
from collections import deque

from serve_app.config import NoticeCapConfig
from serve_app.quantile import quantile


class DecodeSpeed:
    """Per-deployment conservative decode speed and the Spot output cap it implies."""

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

    def observe(self, deployment: str, output_tokens: int, decode_s: float) -> None:
        """A finished attempt: `decode_s` runs from its first token to its last."""
        if output_tokens < self._config.min_sample_tokens or decode_s <= 0:
            return
        samples = self._samples.setdefault(deployment, deque(maxlen=self._config.max_samples))
        samples.append((output_tokens - 1) / decode_s)

    def tokens_per_s(self, deployment: str) -> float:
        """The deployment's conservative per-stream decode speed."""
        samples = self._samples.get(deployment, ())
        if len(samples) < self._config.min_samples:
            return self._config.default_tokens_per_s
        return quantile(samples, self._config.percentile / 100)

    def cap(self, deployment: str) -> int:
        """Most output tokens a request placed on `deployment` may have."""
        return max(self._config.min_tokens, math.floor(self.tokens_per_s(deployment) * self._budget_s))
