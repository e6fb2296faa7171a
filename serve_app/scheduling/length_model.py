"""An online linear model of log output length over hashed prompt features.

Unregularised least squares on `log1p(tokens)`, fitted one observation at a time by
AdaGrad: each request's feature hashes fold into a fixed `2**hash_bits` weight
vector (collisions shared), the feature vector is scaled to unit length, the
error is clipped to +-`MAX_ERROR` (one outlier moves the weights a bounded
step) and the prediction to `[0, MAX_LOG]`. Memory is two float32 vectors of
`2**hash_bits` whatever it sees; a prediction is one gather and a sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_ERROR = 3.0
"""Largest log-length error one observation learns from (a factor of e**3)."""
MAX_LOG = 12.0
"""Largest log1p length predicted (about 160k tokens)."""


class OnlineLengthModel:
    """Predicts output tokens from feature hashes (see the module docstring)."""

    def __init__(self, hash_bits: int, learning_rate: float, prior_tokens: int) -> None:
        self._mask = (1 << hash_bits) - 1
        self._rate = learning_rate
        self._weights = np.zeros(1 << hash_bits, dtype=np.float32)
        self._squares = np.full(1 << hash_bits, 1e-6, dtype=np.float32)
        """Sum of squared gradients per weight (AdaGrad)."""
        self._bias = math.log1p(prior_tokens)
        self._bias_squares = 1e-6
        self.samples = 0
        """Observations learned."""

    def _index(self, features: Sequence[int]) -> np.ndarray:
        return np.unique(np.fromiter(features, dtype=np.int64, count=len(features)) & self._mask)

    def _log_length(self, index: np.ndarray) -> float:
        total = float(self._weights[index].sum()) / math.sqrt(len(index)) if len(index) else 0.0
        return min(max(self._bias + total, 0.0), MAX_LOG)

    def predict(self, features: Sequence[int]) -> float:
        """Expected output tokens (geometric mean) of a request with these features."""
        return math.expm1(self._log_length(self._index(features)))

    def observe(self, features: Sequence[int], output_tokens: int) -> None:
        """Learn one finished request's output length."""
        index = self._index(features)
        error = self._log_length(index) - math.log1p(output_tokens)
        error = min(max(error, -MAX_ERROR), MAX_ERROR)
        if len(index):
            gradient = np.float32(error / math.sqrt(len(index)))
            self._squares[index] += gradient * gradient
            self._weights[index] -= self._rate * gradient / np.sqrt(self._squares[index])
        self._bias_squares += error * error
        self._bias -= self._rate * error / math.sqrt(self._bias_squares)
        self.samples += 1

    def nbytes(self) -> int:
        return self._weights.nbytes + self._squares.nbytes
