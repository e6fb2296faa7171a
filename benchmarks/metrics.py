"""Per-request timings and their summary, defined as `vllm bench serve` defines them.

Read from vLLM 0.32's `vllm/benchmarks/lib/endpoint_request_func.py`
(`async_request_openai_chat_completions`) and `vllm/benchmarks/serve.py`
(`calculate_metrics`):

- TTFT: send to the first SSE chunk that has `choices` (for a chat stream that
  is the chunk with the assistant role, which servers send with the first token);
- ITL: the gaps between successive chunks with `choices`, one per chunk however
  many tokens it carries;
- E2EL: send to the last chunk with `choices` (the usage-only chunk and
  `[DONE]` do not extend it);
- TPOT: (E2EL - TTFT) / (output tokens - 1) for requests with more than one
  output token, the output tokens read from the usage chunk; for goodput a
  request with one token counts as TPOT 0;
- percentiles: numpy's linear interpolation (`serve_app.quantile.quantile`);
- request and output throughput: completed requests and their output tokens
  over the benchmark's duration;
- goodput: completed requests meeting every given SLO (each metric <= its SLO)
  per second of the duration.

Where this differs: vLLM reads usage only from chunks without `choices`; here
any chunk's usage counts (the last one wins). A stream that ends without usage
is a failure (`no_usage`) instead of being counted by a tokenizer. A
distribution with no values is None here, 0 in vLLM's report. Failures are
counted by status and never dropped from `requests`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from serve_app.quantile import quantile

PERCENTILES = (50, 90, 99)
OK = "ok"
REFUSED = ("http_429", "http_503")
"""Statuses of refusals that should carry `Retry-After`."""


@dataclass
class RequestRecord:
    """What happened to one request."""

    status: str = OK
    """`ok`, `http_<code>`, `stream_error` (an SSE error event), `connection_error`,
    `timeout`, `bad_stream` (a data line that is not JSON), `no_first_chunk` (the
    stream ended before any chunk with `choices`) or `no_usage`."""
    kind: str = "all"
    """The request's class (the mixed workload's short/other/long)."""
    start_s: float = 0.0
    """When it was sent, seconds after the run's origin."""
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    retry_after: str | None = None
    """The `Retry-After` header of a refused request."""
    error: str | None = None
    text: str = ""
    """The generated text (kept only when asked for)."""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1); None unless completed with more than one token."""
        if not self.ok or not self.output_tokens or self.output_tokens <= 1:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


class StreamTimer:
    """Builds a `RequestRecord` from a stream's decoded SSE data, chunk by chunk."""

    def __init__(self, sent_at: float, origin: float = 0.0, keep_text: bool = False) -> None:
        self.sent_at = sent_at
        self.record = RequestRecord(start_s=sent_at - origin)
        self._first: float | None = None
        self._last: float | None = None
        self._keep_text = keep_text
        self._parts: list[str] = []

    def feed(self, data: dict[str, Any], at: float) -> bool:
        """Take one data chunk received at `at`; False if it was an error event."""
        if data.get("error"):
            self.record.status = "stream_error"
            self.record.error = str(data["error"])[:300]
            return False
        choices = data.get("choices")
        if choices:
            if self._first is None:
                self._first = at
            else:
                self.record.itl_s.append(at - self._last)
            self._last = at
            if self._keep_text:
                choice = choices[0]
                self._parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        usage = data.get("usage")
        if usage:
            self.record.output_tokens = usage.get("completion_tokens")
            self.record.prompt_tokens = usage.get("prompt_tokens")
        return True

    def finish(self) -> RequestRecord:
        """The record of a stream that ended normally."""
        record = self.record
        record.text = "".join(self._parts)
        if record.status != OK:
            return record
        if self._first is None:
            record.status = "no_first_chunk"
        elif record.output_tokens is None:
            record.status = "no_usage"
        if self._first is not None:
            record.ttft_s = self._first - self.sent_at
            record.e2el_s = self._last - self.sent_at
        return record


def failed(status: str, start_s: float = 0.0, retry_after: str | None = None, error: str | None = None) -> RequestRecord:
    return RequestRecord(status=status, start_s=start_s, retry_after=retry_after, error=error)


@dataclass(frozen=True)
class Slo:
    """Per-request service-level objectives in seconds; None: not judged."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def met_by(self, record: RequestRecord) -> bool:
        """Completed and every given metric <= its SLO (TPOT 0 for one token, as vLLM)."""
        if not record.ok:
            return False
        checks = ((self.ttft_s, record.ttft_s), (self.tpot_s, record.tpot_s or 0.0), (self.e2el_s, record.e2el_s))
        return all(value <= slo for slo, value in checks if slo is not None)

    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2el_s))


def distribution(values: Iterable[float], percentiles: Iterable[int] = PERCENTILES) -> dict[str, float | None]:
    """Mean and percentiles (numpy's linear interpolation); None when empty."""
    values = list(values)
    result: dict[str, float | None] = {"mean": sum(values) / len(values) if values else None}
    for p in percentiles:
        result[f"p{p}"] = quantile(values, p / 100) if values else None
    return result


def summarize(records: Iterable[RequestRecord], duration_s: float,
              slo: Slo | Callable[[RequestRecord], Slo] | None = None) -> dict[str, Any]:
    """`vllm bench serve`'s summary of `records` over a run of `duration_s`."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    records = list(records)
    done = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    slo_of = slo if callable(slo) else (lambda _record: slo)
    judged = slo is not None and (callable(slo) or slo.given())
    good = sum(slo_of(r).met_by(r) for r in done) if judged else None
    failures = Counter(r.status for r in records if not r.ok)
    return {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "failures": dict(sorted(failures.items())),
        "refused_without_retry_after": sum(r.status in REFUSED and r.retry_after is None for r in records),
        "duration_s": duration_s,
        "output_tokens": tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": tokens / duration_s,
        "good_requests": good,
        "goodput": None if good is None else good / duration_s,
        "ttft_s": distribution(r.ttft_s for r in done),
        "tpot_s": distribution(t for r in done if (t := r.tpot_s) is not None),
        "itl_s": distribution(gap for r in done for gap in r.itl_s),
        "e2el_s": distribution(r.e2el_s for r in done),
    }


def rounded(value: Any, digits: int = 4) -> Any:
    """`value` with every float rounded (NaN to None), for JSON."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value
