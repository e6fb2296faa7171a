"""The mixed workload: a seeded sequence of three request classes with Poisson
arrivals, and the closed-loop figures that calibrate its rate.

- short: "What is the capital of <country>? ..." (this app's `capital` template),
  `max_tokens` 128, the model ends it (~10-30 tokens);
- other: "List <n> facts about <topic>, ...", `max_tokens` 256, the model ends
  it (a wider, longer real distribution);
- long: "Write a long story about <topic>. ...", `max_tokens` 256-384, `ignore_eos`.

The three prompts fall in different prompt classes of this app's length
predictor (short: a template, or 32-63 characters as plain text; other: 64-127;
long: 128-255), so it learns each class's own distribution. Pure: no network, no clock; the same
`WorkloadSpec` always gives the same requests.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from benchmarks.common import TOPICS
from benchmarks.metrics import RequestRecord
from serve_app.config import StrictModel

Kind = Literal["short", "other", "long"]
KINDS: tuple[Kind, ...] = ("short", "other", "long")
CLASSES = (*KINDS, "all")
TRUE_PRIORITY = {"short": 0, "other": 1, "long": 2}
"""vLLM `priority` from a request's true class (lower first)."""
COUNTRIES = ["France", "Italy", "Japan", "Kenya", "Peru", "Canada", "Norway", "Egypt", "India", "Chile",
             "Spain", "Vietnam", "Ghana", "Poland", "Mexico", "Greece", "Turkey", "Brazil", "Sweden", "Nepal"]


class WorkloadSpec(StrictModel):
    """What to send: how many requests, how fast, and the class mix."""

    requests: int = Field(gt=0)
    rate_per_s: float = Field(gt=0)
    """Mean arrival rate of the Poisson process (requests per second)."""
    seed: int = 0
    """Seeds arrivals and the mix: the same seed gives the same sequence."""
    short_share: float = Field(default=0.8, ge=0, le=1)
    other_share: float = Field(default=0.1, ge=0, le=1)
    """The rest (1 - short - other) is long."""
    short_max_tokens: tuple[int, int] = (128, 128)
    """Inclusive range each class's `max_tokens` is drawn from."""
    other_max_tokens: tuple[int, int] = (256, 256)
    long_max_tokens: tuple[int, int] = (256, 384)
    short_ignore_eos: bool = False
    other_ignore_eos: bool = False
    long_ignore_eos: bool = True
    other_counts: tuple[int, int] = (3, 12)
    """Inclusive range of the number of facts asked for."""
    short_prompt: str = "What is the capital of {country}? Answer in one sentence."
    other_prompt: str = "List {count} facts about {topic}, one per line, each a complete sentence."
    long_prompt: str = (
        "Write a long story about {topic}. Give it a beginning, a middle and an end, named characters, dialogue "
        "and vivid descriptions of the places they visit.")

    @model_validator(mode="after")
    def _valid(self) -> WorkloadSpec:
        for name in ("short_max_tokens", "other_max_tokens", "long_max_tokens", "other_counts"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be 0 < low <= high, got {(low, high)}")
        if self.short_share + self.other_share > 1 + 1e-9:
            raise ValueError("short_share + other_share must not exceed 1")
        return self

    def shares(self) -> dict[str, float]:
        return {"short": self.short_share, "other": self.other_share,
                "long": max(0.0, 1 - self.short_share - self.other_share)}

    def mean_max_tokens(self) -> float:
        """Expected `max_tokens` per request: an upper bound on mean output length."""
        ranges = {"short": self.short_max_tokens, "other": self.other_max_tokens, "long": self.long_max_tokens}
        return sum(share * sum(ranges[kind]) / 2 for kind, share in self.shares().items())


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
        draw = mix.random()
        if draw < spec.short_share:
            kind: Kind = "short"
            params = {"country": mix.choice(COUNTRIES)}
            tokens, eos, prompt = spec.short_max_tokens, spec.short_ignore_eos, spec.short_prompt
        elif draw < spec.short_share + spec.other_share:
            kind = "other"
            params = {"count": str(mix.randint(*spec.other_counts)), "topic": mix.choice(TOPICS)}
            tokens, eos, prompt = spec.other_max_tokens, spec.other_ignore_eos, spec.other_prompt
        else:
            kind = "long"
            params = {"topic": mix.choice(TOPICS)}
            tokens, eos, prompt = spec.long_max_tokens, spec.long_ignore_eos, spec.long_prompt
        planned.append(PlannedRequest(index, kind, clock, mix.randint(*tokens), eos, prompt.format(**params), params))
    return planned


def saturated_output_tok_per_s(records: Iterable[RequestRecord]) -> float:
    """Output tokens per second of a closed-loop run while it was saturated, i.e.
    until its last request was sent (after that it only drains). Each completed
    request's tokens are spread evenly from its first token to its end."""
    records = list(records)
    until = max(r.start_s for r in records)
    if until <= 0:
        raise ValueError("a closed-loop run needs more requests than its concurrency")
    tokens = 0.0
    for r in (r for r in records if r.ok):
        first, end = r.start_s + r.ttft_s, r.start_s + r.e2el_s
        if end <= until:
            tokens += r.output_tokens
        elif first < until:
            tokens += r.output_tokens * (until - first) / (end - first)
    return tokens / until


def mean_output_tokens(records: Iterable[RequestRecord], shares: dict[str, float]) -> float:
    """Mean output tokens per request of a mix with `shares` per class, from the
    completed requests of each class."""
    records = list(records)
    total = 0.0
    for kind, share in shares.items():
        tokens = [r.output_tokens for r in records if r.kind == kind and r.ok]
        total += share * (sum(tokens) / len(tokens) if tokens else 0.0)
    return total
