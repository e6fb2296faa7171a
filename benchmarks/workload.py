"""The mixed workload: a seeded sequence of short answers and long stories with
Poisson arrivals, and the per-class statistics of what a system made of it.

Pure: no network, no clock. The same `WorkloadSpec` always gives the same
requests, so every system is sent the same sequence.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import Field, model_validator

from benchmarks.common import TOPICS, percentile, ratios
from serve_app.config import StrictModel

Kind = Literal["short", "long"]
CLASSES = ("short", "long", "all")
RATIO_KEYS = ("output_tok_per_s", "req_per_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s")
COUNTRIES = ["France", "Italy", "Japan", "Kenya", "Peru", "Canada", "Norway", "Egypt", "India", "Chile",
             "Spain", "Vietnam", "Ghana", "Poland", "Mexico", "Greece", "Turkey", "Brazil", "Sweden", "Nepal"]


class WorkloadSpec(StrictModel):
    """What to send: how many requests, how fast, and the short/long mix."""

    requests: int = Field(gt=0)
    """Requests in the sequence."""
    rate_per_s: float = Field(gt=0)
    """Mean arrival rate of the Poisson process (requests per second)."""
    seed: int = 0
    """Seeds arrivals and the mix: the same seed gives the same sequence."""
    short_share: float = Field(default=0.8, ge=0, le=1)
    """Probability that a request is a short answer."""
    short_max_tokens: tuple[int, int] = (16, 32)
    """Inclusive range `max_tokens` of a short request is drawn from."""
    long_max_tokens: tuple[int, int] = (256, 384)
    """Inclusive range `max_tokens` of a long request is drawn from."""
    short_ignore_eos: bool = False
    """Short answers stop where the model ends them (at most `max_tokens`)."""
    long_ignore_eos: bool = True
    """Long requests run to `max_tokens`, so their lengths are known."""
    short_prompt: str = "What is the capital of {country}? Answer in one sentence."
    """Short prompt; `{country}` is filled in (the `capital` template's text)."""
    long_prompt: str = "Write a long story about {topic}."
    """Long prompt; `{topic}` is filled in."""

    @model_validator(mode="after")
    def _ranges_ordered(self) -> WorkloadSpec:
        for name in ("short_max_tokens", "long_max_tokens"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be 0 < low <= high, got {(low, high)}")
        return self

    def mean_max_tokens(self) -> float:
        """Expected `max_tokens` per request: an upper bound on mean output length."""
        short, long = (sum(self.short_max_tokens) / 2, sum(self.long_max_tokens) / 2)
        return self.short_share * short + (1 - self.short_share) * long


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    kind: Kind
    arrival_s: float
    """Send time, seconds after the run starts."""
    max_tokens: int
    ignore_eos: bool
    prompt: str
    """The user message."""
    params: dict[str, str]
    """What was filled into the prompt (the `capital` template's params for short ones)."""


def generate(spec: WorkloadSpec) -> list[PlannedRequest]:
    """The request sequence of `spec`. Arrivals and the mix use separate random
    streams, so changing the rate moves the arrivals but keeps the same requests."""
    arrivals = random.Random(f"{spec.seed}-arrivals")
    mix = random.Random(f"{spec.seed}-mix")
    planned, clock = [], 0.0
    for index in range(spec.requests):
        clock += arrivals.expovariate(spec.rate_per_s)
        if mix.random() < spec.short_share:
            params = {"country": mix.choice(COUNTRIES)}
            kind, tokens, eos, prompt = "short", spec.short_max_tokens, spec.short_ignore_eos, spec.short_prompt
        else:
            params = {"topic": mix.choice(TOPICS)}
            kind, tokens, eos, prompt = "long", spec.long_max_tokens, spec.long_ignore_eos, spec.long_prompt
        planned.append(PlannedRequest(index, kind, clock, mix.randint(*tokens), eos, prompt.format(**params), params))
    return planned


@dataclass(frozen=True)
class Outcome:
    """What happened to one request."""

    index: int
    kind: Kind
    status: str
    """`ok`, an HTTP status (`429`, `503`, ...), `stream_error` (an SSE error event),
    `connection_error`, `timeout`, `bad_stream` (a chunk that is not JSON) or
    `no_usage` (the stream ended without a usage chunk)."""
    sent_s: float
    """When it was sent, seconds after the run started."""
    latency_s: float | None = None
    ttft_s: float | None = None
    output_tokens: int = 0
    retry_after: str | None = None
    """The `Retry-After` header of a refused request."""


@dataclass(frozen=True)
class ClassStats:
    requests: int
    ok: int
    errors: dict[str, int]
    """Failed requests by status; none are dropped from `requests`."""
    refused_without_retry_after: int
    """429/503 answers that carried no `Retry-After`."""
    output_tokens: int
    output_tok_per_s: float
    req_per_s: float
    """Completed requests per second of the whole run."""
    latency_p50_s: float | None
    """None when no request of the class completed (also for the others below)."""
    latency_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None


def _percentile(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 3) if values else None


def class_stats(outcomes: Iterable[Outcome], wall_s: float) -> ClassStats:
    """Statistics of `outcomes` over a run of `wall_s` seconds; latency and TTFT
    percentiles are over completed requests only."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be positive, got {wall_s}")
    outcomes = list(outcomes)
    done = [o for o in outcomes if o.status == "ok"]
    refused = [o for o in outcomes if o.status in ("429", "503")]
    tokens = sum(o.output_tokens for o in done)
    return ClassStats(
        requests=len(outcomes),
        ok=len(done),
        errors=dict(sorted(Counter(o.status for o in outcomes if o.status != "ok").items())),
        refused_without_retry_after=sum(o.retry_after is None for o in refused),
        output_tokens=tokens,
        output_tok_per_s=round(tokens / wall_s, 1),
        req_per_s=round(len(done) / wall_s, 3),
        latency_p50_s=_percentile([o.latency_s for o in done], 50),
        latency_p99_s=_percentile([o.latency_s for o in done], 99),
        ttft_p50_s=_percentile([o.ttft_s for o in done], 50),
        ttft_p99_s=_percentile([o.ttft_s for o in done], 99),
    )


def saturated_output_tok_per_s(outcomes: Iterable[Outcome]) -> float:
    """Output tokens per second of a closed-loop run while it was saturated, i.e.
    until its last request was sent (after that it only drains). Each completed
    request's tokens are spread evenly from its first token to its end."""
    outcomes = list(outcomes)
    until = max(o.sent_s for o in outcomes)
    if until <= 0:
        raise ValueError("a closed-loop run needs more requests than its concurrency")
    tokens = 0.0
    for o in (o for o in outcomes if o.status == "ok"):
        first, end = o.sent_s + o.ttft_s, o.sent_s + o.latency_s
        if end <= until:
            tokens += o.output_tokens
        elif first < until:
            tokens += o.output_tokens * (until - first) / (end - first)
    return tokens / until


def mean_output_tokens(outcomes: Iterable[Outcome], short_share: float) -> float:
    """Mean output tokens per request of a mix with `short_share` short requests,
    from the completed requests of each class."""
    outcomes = list(outcomes)
    means = {}
    for kind in ("short", "long"):
        tokens = [o.output_tokens for o in outcomes if o.kind == kind and o.status == "ok"]
        means[kind] = sum(tokens) / len(tokens) if tokens else 0.0
    return short_share * means["short"] + (1 - short_share) * means["long"]


def stats_by_class(outcomes: Iterable[Outcome], wall_s: float) -> dict[str, ClassStats]:
    """`class_stats` for short requests, long requests and all of them."""
    outcomes = list(outcomes)
    return {kind: class_stats([o for o in outcomes if kind in ("all", o.kind)], wall_s) for kind in CLASSES}


def ratios_by_class(ours: dict[str, ClassStats], baseline: dict[str, ClassStats]) -> dict[str, dict[str, float | None]]:
    """ours / baseline for each class and each of `RATIO_KEYS`."""
    return {kind: ratios(asdict(ours[kind]), asdict(baseline[kind]), RATIO_KEYS) for kind in CLASSES}
