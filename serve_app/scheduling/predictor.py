"""Predict a request's output length from its limit and what its class produced before.

A prompt class is the template name when the request used one, else the endpoint
plus a coarse prompt-size bin. Each class keeps a window of observed output
lengths; once it has `min_samples`, the prediction is their `quantile`, capped by
the request's `max_tokens`. Before that (cold start) it is `max_tokens` when
given, else `cold_start_tokens`: a new class starts in a long bucket and earns
its way into a short one, so short answers are never stuck behind a wrong guess.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from serve_app.config import PredictorConfig
from serve_app.quantile import quantile


@dataclass(frozen=True)
class PromptClass:
    """What the predictor keys its history on."""

    kind: str
    """`chat` or `completion`."""
    template: str | None
    prompt_chars: int

    def key(self) -> str:
        if self.template is not None:
            return f"template:{self.template}"
        size_bin = 0 if self.prompt_chars <= 0 else int(math.log2(self.prompt_chars))
        return f"{self.kind}:2^{size_bin}"


@dataclass(frozen=True)
class Prediction:
    tokens: int
    source: str
    """`history`, `max_tokens` or `cold_start`: what the number came from."""


class LengthPredictor:
    def __init__(self, config: PredictorConfig) -> None:
        self._config = config
        self._history: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=config.window))

    def predict(self, prompt_class: PromptClass, max_tokens: int | None) -> Prediction:
        history = self._history.get(prompt_class.key())
        if history is not None and len(history) >= self._config.min_samples:
            estimate = math.ceil(quantile(history, self._config.quantile))
            if max_tokens is not None and max_tokens < estimate:
                return Prediction(max_tokens, "max_tokens")
            return Prediction(estimate, "history")
        if max_tokens is not None:
            return Prediction(max_tokens, "max_tokens")
        return Prediction(self._config.cold_start_tokens, "cold_start")

    def observe(self, prompt_class: PromptClass, output_tokens: int) -> None:
        self._history[prompt_class.key()].append(output_tokens)

    def classes(self) -> dict[str, int]:
        """Observations held per class."""
        return {key: len(values) for key, values in self._history.items()}
