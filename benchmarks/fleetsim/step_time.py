"""How long one engine step takes: the one interface the simulated engine asks.

A step of vLLM's continuous batching runs every scheduled request once: each
decoding request adds one token, each prefilling one a chunk of its prompt.
`LinearStepTime` is the usual first-order model (Vidur's and BLIS's are richer
forms of it): a fixed cost per step, a cost per decoding request, per prompt
token prefilled and per token of context the step's attention reads. Its
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


class StepTimeModel(Protocol):
    def step_s(self, shape: StepShape) -> float:
        """Seconds the step takes."""
        ...


FEATURES = ("base_us", "per_decode_seq_us", "per_prefill_token_us", "per_context_token_us")


@dataclass(frozen=True)
class LinearStepTime:
    """Microseconds per step, per decoding request, per prompt token prefilled and
    per token of context read (microseconds keep a result file's rounding exact)."""

    base_us: float
    per_decode_seq_us: float
    per_prefill_token_us: float
    per_context_token_us: float
    source: str = ""
    """Where the coefficients come from: a profile's file and machine, or a citation."""

    def step_s(self, shape: StepShape) -> float:
        return sum(c * x for c, x in zip(self.coefficients(), self.row(shape), strict=True)) / 1e6

    def coefficients(self) -> list[float]:
        return [getattr(self, name) for name in FEATURES]

    @staticmethod
    def row(shape: StepShape) -> list[float]:
        return [1.0, shape.decode_seqs, shape.prefill_tokens, shape.context_tokens]

    @classmethod
    def fit(cls, shapes: list[StepShape], seconds: list[float], source: str = "") -> LinearStepTime:
        """Least squares over profiled steps with every coefficient kept non-negative:
        a feature whose cost comes out negative (it only fits the profile's noise)
        is dropped, the most negative first, and the rest refitted."""
        import numpy as np

        rows, target = np.array([cls.row(s) for s in shapes]), np.array(seconds) * 1e6
        kept = list(range(len(FEATURES)))
        while True:
            solution, *_ = np.linalg.lstsq(rows[:, kept], target, rcond=None)
            if solution.min() >= 0 or len(kept) == 1:
                break
            del kept[int(solution.argmin())]
        coefficients = [0.0] * len(FEATURES)
        for index, value in zip(kept, solution, strict=True):
            coefficients[index] = max(0.0, float(value))
        return cls(*coefficients, source=source)

    @classmethod
    def load(cls, path: Path) -> LinearStepTime:
        """The `model` block of a fitted profile (`profile_engine.py`'s result)."""
        return cls(**json.loads(Path(path).read_text())["model"])
