"""The one quantile convention of the project: linear interpolation between the
closest ranks (numpy's default, which `vllm bench serve` uses for its percentiles)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The `q` quantile (0 <= q <= 1) of `values`; NaN when there are none."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be within [0, 1], got {q}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
