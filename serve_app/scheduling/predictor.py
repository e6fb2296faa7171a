"""Predict a request's output length from its limit and what its class produced before.

A prompt class is the template name when the request used one, else the endpoint
plus a coarse prompt-size bin. History is kept per tenant (API key; None without
keys) and class, so no tenant's outputs move another's predictions: each keeps a
window of the lengths of outputs that ended by themselves (`NATURAL_FINISH`);
once it has `min_samples`, the prediction is their `quantile`, capped by the
request's `max_tokens`. Before that (cold start) it is `max_tokens` when given,
else `cold_start_tokens`: a new class starts in a long bucket and earns its way
into a short one, so short answers are never stuck behind a wrong guess. At most
`max_histories` windows are kept, the least recently observed dropped first.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from serve_app.config import PredictorConfig
from serve_app.quantile import quantile

NATURAL_FINISH = "stop"
"""Finish reason of an output that ended by itself (end of sequence or a stop
string), the only kind learned: one cut at `max_tokens` says nothing of how
long it would have run."""


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
    """Output lengths per tenant and prompt class (see the module docstring)."""

    def __init__(self, config: PredictorConfig) -> None:
        self._config = config
        self._history: OrderedDict[tuple[str | None, str], deque[int]] = OrderedDict()
        """Observed lengths per (tenant, class key), least recently observed first."""

    def predict(self, prompt_class: PromptClass, max_tokens: int | None, tenant: str | None = None) -> Prediction:
        history = self._history.get((tenant, prompt_class.key()))
        if history is not None and len(history) >= self._config.min_samples:
            estimate = math.ceil(quantile(history, self._config.quantile))
            if max_tokens is not None and max_tokens < estimate:
                return Prediction(max_tokens, "max_tokens")
            return Prediction(estimate, "history")
        if max_tokens is not None:
            return Prediction(max_tokens, "max_tokens")
        return Prediction(self._config.cold_start_tokens, "cold_start")

    def observe(self, prompt_class: PromptClass, output_tokens: int, tenant: str | None = None) -> None:
        """Learn the length of an output that ended by itself."""
        key = (tenant, prompt_class.key())
        history = self._history.get(key)
        if history is None:
            history = self._history[key] = deque(maxlen=self._config.window)
            if len(self._history) > self._config.max_histories:
                self._history.popitem(last=False)
        else:
            self._history.move_to_end(key)
        history.append(output_tokens)

    def classes(self) -> dict[str, int]:
        """Observations held per class, summed over tenants (no tenant is named)."""
        counts: Counter[str] = Counter()
        for (_tenant, key), values in self._history.items():
            counts[key] += len(values)
        return dict(counts)
