"""What the benchmarks share: prompt topics, percentiles, ratios to a baseline."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

TOPICS = ["a lighthouse", "a robot chef", "the ocean", "a lost key", "mountains", "a city at night",
          "an old library", "a dragon", "the moon", "a train journey", "a garden", "winter"]
"""Story topics for long-output prompts."""


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-100) of `values`; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def ratios(ours: Mapping[str, float], baseline: Mapping[str, float], keys: Iterable[str]) -> dict[str, float | None]:
    """ours / baseline per key (>1 is better for throughput, <1 for latency);
    None where either side is missing, NaN, or the baseline is 0."""
    result: dict[str, float | None] = {}
    for key in keys:
        mine, theirs = ours.get(key), baseline.get(key)
        valid = mine is not None and theirs is not None and not math.isnan(mine) and not math.isnan(theirs)
        result[key] = round(mine / theirs, 3) if valid and theirs != 0 else None
    return result
