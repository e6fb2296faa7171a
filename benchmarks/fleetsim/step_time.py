"""How long one engine step takes: the one interface the simulated engine asks.

A step of vLLM's continuous batching runs every scheduled request once: each
decoding request adds one token, each prefilling one a chunk of its prompt.
`LinearStepTime` is the usual first-order model (BLIS's published one is it
without the last two terms): a fixed cost per step, a cost per decoding
request, per prompt token prefilled, per token of context the step's decode
attention reads, and per query-key pair of prefill attention (which grows with
the square of a prompt: one long prompt costs more per token than many short ones). Its
coefficients are fitted by non-negative least squares from profiled steps
(`benchmarks/fleetsim/profile_engine.py` on this machine), or taken from a
published source, which the coefficients' `source` names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes."""

    decode_seqs: int
    """Requests adding one output token."""
    prefill_tokens: int
    """Prompt tokens computed this step (chunked prefill), over all prefilling requests."""
    context_tokens: int
    """Tokens already in the KV cache that the step's attention reads, over all scheduled requests."""
    prefill_pairs: int = 0
    """Query-key pairs the step's prefill attention computes: per prefilling request, its
    new tokens times the tokens each attends to on average (those before it, half its own)."""


class StepTimeModel(Protocol):
    def step_s(self, shape: StepShape) -> float:
        """Seconds the step takes."""
        ...


FEATURES = ("base_us", "per_decode_seq_us", "per_prefill_token_us", "per_context_token_us", "per_prefill_pair_us")


@dataclass(frozen=True)
class LinearStepTime:
    """Microseconds per step, per decoding request, per prompt token prefilled, per
    token of context read and per prefill attention pair (microseconds keep a result
    file's rounding exact)."""

    base_us: float
    per_decode_seq_us: float
    per_prefill_token_us: float
    per_context_token_us: float
    per_prefill_pair_us: float = 0.0
    source: str = ""
    """Where the coefficients come from: a profile's file and machine, or a citation."""

    def step_s(self, shape: StepShape) -> float:
        return sum(c * x for c, x in zip(self.coefficients(), self.row(shape), strict=True)) / 1e6

    def coefficients(self) -> list[float]:
        return [getattr(self, name) for name in FEATURES]

    @staticmethod
    def row(shape: StepShape) -> list[float]:
        return [1.0, shape.decode_seqs, shape.prefill_tokens, shape.context_tokens, shape.prefill_pairs]

    @classmethod
    def fit(cls, shapes: list[StepShape], seconds: list[float], source: str = "") -> LinearStepTime:
        """Least squares over profiled steps, every coefficient kept non-negative, then
        again without the outliers: steps more than `OUTLIER_MADS` robust deviations
        from the first fit (a pause of the machine, not a cost of the step's shape)."""
        import numpy as np

        rows, target = np.array([cls.row(s) for s in shapes]), np.array(seconds) * 1e6
        first = _nonnegative_lstsq(rows, target)
        residual = target - rows @ first
        spread = 1.4826 * np.median(np.abs(residual - np.median(residual)))
        kept = np.abs(residual) <= OUTLIER_MADS * spread if spread > 0 else np.ones(len(target), dtype=bool)
        return cls(*(float(c) for c in _nonnegative_lstsq(rows[kept], target[kept])), source=source)

    @classmethod
    def load(cls, path: Path) -> LinearStepTime:
        """The `model` block of a fitted profile (`profile_engine.py`'s result)."""
        return cls(**json.loads(Path(path).read_text())["model"])


OUTLIER_MADS = 3.0
"""Profiled steps further than this many robust standard deviations (1.4826 x the
median absolute deviation) from the first fit are left out of the final one."""


def _nonnegative_lstsq(rows, target):
    """Least squares with every coefficient >= 0: a feature whose cost comes out
    negative (it only fits the noise) is dropped, the most negative first."""
    import numpy as np

    kept = list(range(rows.shape[1]))
    while True:
        solution, *_ = np.linalg.lstsq(rows[:, kept], target, rcond=None)
        if solution.min() >= 0 or len(kept) == 1:
            break
        del kept[int(solution.argmin())]
    coefficients = np.zeros(rows.shape[1])
    coefficients[kept] = np.maximum(solution, 0.0)
    return coefficients
