"""What the benchmarks share: prompt topics and ratios to a baseline. Percentiles
come from `serve_app.quantile.quantile`, the project's one quantile helper."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

TOPICS = ["a lighthouse", "a robot chef", "the ocean", "a lost key", "mountains", "a city at night",
          "an old library", "a dragon", "the moon", "a train journey", "a garden", "winter"]
"""Story topics for long-output prompts."""


def ratio(mine: float | None, theirs: float | None, digits: int = 3) -> float | None:
    """mine / theirs; None where either is missing or NaN, or theirs is 0."""
    if mine is None or theirs is None or math.isnan(mine) or math.isnan(theirs) or theirs == 0:
        return None
    return round(mine / theirs, digits)


def ratios(ours: Mapping[str, float | None], baseline: Mapping[str, float | None],
           keys: Iterable[str]) -> dict[str, float | None]:
    """ours / baseline per key (>1 is better for throughput, <1 for latency)."""
    return {key: ratio(ours.get(key), baseline.get(key)) for key in keys}
