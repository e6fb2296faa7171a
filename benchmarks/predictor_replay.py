"""How well this app's length predictor did on the mixed workload.

The app does not expose per-request predictions, so the recorded requests are
replayed through `serve_app.scheduling.predictor.LengthPredictor` with the
app's own predictor config, exactly as the app's batcher uses it: each request
is predicted from its prompt class and `max_tokens` when it arrives, and each
completed request's output tokens are observed when it ends (events in time
order, one replay per server lifetime, since the app's history lives that long).
A request is long when its tokens (predicted or true) reach the app config's
`length_scheduling.long_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.metrics import RequestRecord
from benchmarks.workload import KINDS, PlannedRequest
from serve_app.config import PredictorConfig
from serve_app.quantile import quantile
from serve_app.scheduling.predictor import LengthPredictor, PromptClass
from serve_app.scheduling.prompt_features import SamplingSummary, describe

TEMPLATE = "capital"


def prompt_class(planned: PlannedRequest, as_template: bool) -> PromptClass:
    """The prompt class the app's ingress gives this request (`request_meta`)."""
    template = TEMPLATE if as_template and planned.kind == "short" else None
    sampling = SamplingSummary(max_tokens=planned.max_tokens, ignore_eos=planned.ignore_eos)
    return describe((("user", planned.prompt),), None, sampling, template=template)


@dataclass(frozen=True)
class Replayed:
    kind: str
    n: int
    """This request is the n-th of its class in the server's lifetime (1-based)."""
    max_tokens: int
    predicted: int
    source: str
    true_tokens: int | None
    """Output tokens of a completed request; None if it failed."""
    point: str = ""
    """Which run it was in (e.g. the load point)."""


def replay(runs: Sequence[tuple[Sequence[PlannedRequest], Sequence[RequestRecord]]], config: PredictorConfig,
           as_template: bool, labels: Sequence[str] | None = None) -> list[Replayed]:
    """Replay the runs of one server lifetime (in the order they ran) through a fresh predictor."""
    predictor = LengthPredictor(config)
    counts = dict.fromkeys(KINDS, 0)
    out: list[Replayed] = []
    for number, (plan, records) in enumerate(runs):
        events = []
        for planned, record in zip(plan, records, strict=True):
            events.append((record.start_s, 1, planned, record))
            if record.ok:
                events.append((record.start_s + record.e2el_s, 0, planned, record))
        for _, is_arrival, planned, record in sorted(events, key=lambda e: (e[0], e[1], e[2].index)):
            cls = prompt_class(planned, as_template)
            if not is_arrival:
                predictor.observe(cls, record.output_tokens)
                continue
            counts[planned.kind] += 1
            prediction = predictor.predict(cls, planned.max_tokens)
            out.append(Replayed(planned.kind, counts[planned.kind], planned.max_tokens, prediction.tokens,
                                prediction.source, record.output_tokens if record.ok else None,
                                labels[number] if labels else str(number)))
    return out


def accuracy(items: Iterable[Replayed], long_tokens: int) -> dict[str, Any]:
    """Bucket accuracy (predicted long/short == true long/short) and mean absolute
    error over completed requests."""
    done = [i for i in items if i.true_tokens is not None]
    if not done:
        return {"requests": 0, "bucket_accuracy": None, "mae_tokens": None}
    right = sum((i.predicted >= long_tokens) == (i.true_tokens >= long_tokens) for i in done)
    true = [i.true_tokens for i in done]
    return {"requests": len(done), "bucket_accuracy": right / len(done),
            "true_tokens_p10": quantile(true, 0.1), "true_tokens_p50": quantile(true, 0.5),
            "true_tokens_p90": quantile(true, 0.9),
            "mae_tokens": sum(abs(i.predicted - i.true_tokens) for i in done) / len(done),
            "mean_true_tokens": sum(i.true_tokens for i in done) / len(done),
            "mean_predicted_tokens": sum(i.predicted for i in done) / len(done),
            "true_long_share": sum(i.true_tokens >= long_tokens for i in done) / len(done),
            "predicted_long_share": sum(i.predicted >= long_tokens for i in done) / len(done)}


def bin_of(n: int) -> tuple[int, int]:
    """Learning-curve bins of the n-th request: 1-8, 9-16, 17-32, 33-64, ..."""
    if n <= 8:
        return 1, 8
    high = 2 ** math.ceil(math.log2(n))
    return high // 2 + 1, high


def report(items: list[Replayed], long_tokens: int) -> dict[str, Any]:
    """Accuracy overall and per class, and per class as a learning curve over n."""
    curve: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        mine = [i for i in items if i.kind == kind]
        bins = sorted({bin_of(i.n) for i in mine})
        curve[kind] = [{"n_from": lo, "n_to": hi, **accuracy([i for i in mine if lo <= i.n <= hi], long_tokens)}
                       for lo, hi in bins]
    return {"long_tokens": long_tokens, "overall": accuracy(items, long_tokens),
            "by_class": {kind: accuracy([i for i in items if i.kind == kind], long_tokens) for kind in KINDS},
            "learning_curve": curve}
