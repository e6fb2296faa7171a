"""Predict a request's output length from what it carries and what came before.

Three sources, per tenant (API key; None without keys), first that applies:

1. history: the request's history key (its template, else its instruction
   fingerprint, `PromptClass.history_key`) has `min_samples` observed lengths;
   the prediction is their `quantile`. Cheap and sharp where instructions recur.
2. model: the tenant's `OnlineLengthModel` over the request's hashed features
   has learned `model_min_samples` outputs; the prediction is its estimate.
3. cold start: `max_tokens` when given, else `cold_start_tokens`. A new tenant
   or class starts in a long bucket and earns its way into a short one.

Every prediction is capped by `max_tokens`. Outputs that ended by themselves
(`NATURAL_FINISH`) are learned, and so are outputs predicted short that ran past
the long edge before they were cut (`worth_learning`). Tenants never share histories or
models, so one tenant's flood cannot move another's predictions (a shared model
would let a flood shift everyone's weights). Memory is bounded: at most
`max_histories` windows of `window` lengths and `max_models` models of
`2**hash_bits` weights, the least recently observed dropped first.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from serve_app.config import PredictorConfig
from serve_app.quantile import quantile
from serve_app.scheduling.length_model import OnlineLengthModel
from serve_app.scheduling.prompt_features import PromptClass

__all__ = ["NATURAL_FINISH", "LengthPredictor", "Prediction", "PromptClass", "worth_learning"]

NATURAL_FINISH = "stop"
"""Finish reason of an output that ended by itself (end of sequence or a stop
string): its length is the answer's length."""


def worth_learning(finish_reason: str | None, output_tokens: int, predicted_tokens: int,
                   long_tokens: int | None) -> bool:
    """Whether a finished output teaches the predictor: one that ended by itself, or
    one predicted short (under `long_tokens`; None: no length classes) that ran to
    the long edge and was then cut short (at `max_tokens`). The second's length is
    only a lower bound of the answer's, but one past the class edge it was predicted
    under, so learning it corrects that mistake. Other cuts are not learned: one at a
    small `max_tokens` says nothing of how long the answer would have run, and
    learning every cut past its prediction made this model's own outputs
    (benchmarks/results/predictor_smollm2.json, 37% cut at 512) all predicted long."""
    crossed = long_tokens is not None and predicted_tokens < long_tokens <= output_tokens
    return finish_reason == NATURAL_FINISH or crossed


@dataclass(frozen=True)
class Prediction:
    tokens: int
    source: str
    """`history`, `model`, `max_tokens` or `cold_start`: what the number came from."""


class LengthPredictor:
    """Output lengths per tenant, from histories and online models (see the module docstring)."""

    def __init__(self, config: PredictorConfig) -> None:
        self._config = config
        self._history: OrderedDict[tuple[str | None, str], deque[int]] = OrderedDict()
        """Observed lengths per (tenant, history key), least recently observed first."""
        self._models: OrderedDict[str | None, OnlineLengthModel] = OrderedDict()
        """One model per tenant, least recently observed first."""

    def predict(self, prompt_class: PromptClass, max_tokens: int | None, tenant: str | None = None) -> Prediction:
        estimate, source = self._estimate(prompt_class, tenant)
        if estimate is None:
            if max_tokens is not None:
                return Prediction(max_tokens, "max_tokens")
            return Prediction(self._config.cold_start_tokens, "cold_start")
        if max_tokens is not None and max_tokens < estimate:
            return Prediction(max_tokens, "max_tokens")
        return Prediction(estimate, source)

    def _estimate(self, prompt_class: PromptClass, tenant: str | None) -> tuple[int | None, str]:
        history = self._history.get((tenant, prompt_class.history_key()))
        if history is not None and len(history) >= self._config.min_samples:
            return math.ceil(quantile(history, self._config.quantile)), "history"
        model = self._models.get(tenant)
        if model is not None and prompt_class.features and model.samples >= self._config.model_min_samples:
            return max(1, round(model.predict(prompt_class.features))), "model"
        return None, ""

    def observe(self, prompt_class: PromptClass, output_tokens: int, tenant: str | None = None) -> None:
        """Learn the length of an output that ended by itself."""
        key = (tenant, prompt_class.history_key())
        history = self._history.get(key)
        if history is None:
            history = self._history[key] = deque(maxlen=self._config.window)
            if len(self._history) > self._config.max_histories:
                self._history.popitem(last=False)
        else:
            self._history.move_to_end(key)
        history.append(output_tokens)
        if prompt_class.features and self._config.max_models > 0:
            self._model(tenant).observe(prompt_class.features, output_tokens)

    def _model(self, tenant: str | None) -> OnlineLengthModel:
        model = self._models.get(tenant)
        if model is None:
            config = self._config
            model = self._models[tenant] = OnlineLengthModel(config.hash_bits, config.learning_rate,
                                                             config.cold_start_tokens)
            if len(self._models) > config.max_models:
                self._models.popitem(last=False)
        else:
            self._models.move_to_end(tenant)
        return model

    def classes(self) -> dict[str, int]:
        """Observations held per history key, summed over tenants (no tenant is named);
        all fingerprints' together as `fp:*`, so the view stays short."""
        counts: Counter[str] = Counter()
        for (_tenant, key), values in self._history.items():
            counts["fp:*" if key.startswith("fp:") else key] += len(values)
        return dict(counts)

    def nbytes(self) -> int:
        """Memory held by the models' weights (histories: at most `max_histories` x `window` ints)."""
        return sum(model.nbytes() for model in self._models.values())
