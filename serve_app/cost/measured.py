"""What the planner and the diurnal simulation take from benchmark JSONs written in this repo.

Baseline (`benchmarks/throughput.py`'s JSON), one entry of `results` picked by
`target` (default: the first):
- `results[].output_tok_per_s`, `results[].req_per_s`: throughput over the run;
- `results[].failed` (must be 0), `results[].latency_p50_s`, `latency_p99_s`, `ttft_p50_s`;
- `results[].replicas` (optional, default 1): replicas that served the target;
  throughput and concurrency are divided by it to get one replica's;
- `results[].load_curve` (optional): `[{"concurrency": n, "output_tok_per_s": x}]`,
  one replica's output tok/s at n concurrent streams (more points: a better curve);
- `workload.concurrency`, `workload.max_tokens`; `engine.quantization` (not null:
  the engine ran quantized).

Factors (any benchmark JSON): a top-level `factors` object,
`{"<name>": {"value": float, "definition": str, "measured_on": str, "command": str}}`;
the planner uses the names in `FACTORS`.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

FACTORS = {
    "quantization": "throughput of the quantized engine over the unquantized one, same benchmark",
    "length_scheduling": "throughput with length-aware scheduling over none at the same latency target "
                         "(mixed-workload benchmark)",
    "spot_resume_overhead_s": "seconds of extra latency per stream resumed after a replica is lost (fault test)",
}
"""Factor names the planner reads, with what each means."""


class MeasuredFactor(BaseModel):
    """One entry of a benchmark JSON's `factors`, and the file it came from."""

    value: float = Field(ge=0)
    """The measured value (a ratio, or seconds for `*_s`)."""
    definition: str = Field(min_length=1)
    """What was divided by what, or what was timed."""
    measured_on: str = Field(min_length=1)
    """The CPU or GPU it ran on."""
    command: str = Field(min_length=1)
    """The command that measured it."""
    source: str
    """The JSON file it was read from."""


def read_factors(paths: Iterable[Path]) -> tuple[dict[str, MeasuredFactor], list[str]]:
    """The known factors in `paths` (each given by at most one file), and the
    unknown ones as `name (file)`."""
    found: dict[str, MeasuredFactor] = {}
    unknown: list[str] = []
    for path in dict.fromkeys(Path(p) for p in paths):
        for name, entry in (json.loads(path.read_text()).get("factors") or {}).items():
            if name not in FACTORS:
                unknown.append(f"{name} ({path})")
                continue
            if name in found:
                raise ValueError(f"factor {name!r} is in both {found[name].source} and {path}: pass one")
            factor = MeasuredFactor.model_validate({**entry, "source": str(path)})
            if factor.value == 0 and not name.endswith("_s"):
                raise ValueError(f"{path}: factor {name!r} is a throughput ratio and cannot be 0")
            found[name] = factor
    return found, unknown


@dataclass(frozen=True)
class LoadCurve:
    """One replica's output tokens/s by concurrent streams: linear from the origin
    to the first point (every stream at that point's per-stream speed, which is
    pessimistic at light load), piecewise linear between points, and flat past the
    last (saturated: more streams share the same throughput)."""

    points: tuple[tuple[float, float], ...]
    """(concurrent streams, output tokens/s), by streams."""
    source: str
    """The benchmark file and target, or what was assumed."""

    def per_stream_tok_s(self, streams: float) -> float:
        """Output tokens/s each of `streams` concurrent streams gets."""
        first_streams, first_tok_s = self.points[0]
        return first_tok_s / first_streams if streams <= first_streams else self.tokens_per_s(streams) / streams

    def tokens_per_s(self, streams: float) -> float:
        xs = [x for x, _ in self.points]
        if streams <= xs[0]:
            return self.points[0][1] * streams / xs[0]
        if streams >= xs[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(xs, streams)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (streams - x0) / (x1 - x0)


@dataclass(frozen=True)
class Baseline:
    """One replica's measured throughput (and latency) from a throughput benchmark."""

    output_tokens_per_s: float
    requests_per_s: float
    concurrency: float | None
    """Concurrent streams per replica during the run (None: not recorded)."""
    max_tokens: int | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    ttft_p50_s: float | None
    quantization: str | None
    """The engine's quantization (None: unquantized)."""
    curve: LoadCurve | None
    """Throughput by concurrency (None: the file gives no concurrency)."""
    source: str
    """`file:target`."""


def read_baseline(path: Path, target: str | None = None, slo_p99_s: float | None = None) -> Baseline:
    """The per-replica baseline of one target of a throughput benchmark JSON."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    results = data.get("results")
    if not results:
        raise ValueError(f"{path}: no `results`; not a throughput benchmark JSON")
    chosen = next((r for r in results if r["target"] == target), None) if target else results[0]
    if chosen is None:
        raise ValueError(f"{path}: no target {target!r}; it has {[r['target'] for r in results]}")
    if chosen.get("failed"):
        raise ValueError(f"{path}: {chosen['failed']} requests failed in {chosen['target']}; "
                         "not a throughput at the SLO")
    if slo_p99_s is not None and chosen["latency_p99_s"] > slo_p99_s:
        raise ValueError(f"{path}: {chosen['target']} p99 latency {chosen['latency_p99_s']}s is over the "
                         f"{slo_p99_s}s SLO; benchmark at a lower concurrency")
    replicas = chosen.get("replicas", 1)
    workload = data.get("workload") or {}
    concurrency = workload.get("concurrency") / replicas if workload.get("concurrency") else None
    source = f"{path}:{chosen['target']}"
    tok_s = chosen["output_tok_per_s"] / replicas
    points = [(p["concurrency"], p["output_tok_per_s"]) for p in chosen.get("load_curve") or []]
    if not points and concurrency:
        points = [(concurrency, tok_s)]
    return Baseline(
        output_tokens_per_s=tok_s,
        requests_per_s=chosen["req_per_s"] / replicas,
        concurrency=concurrency,
        max_tokens=workload.get("max_tokens"),
        latency_p50_s=chosen.get("latency_p50_s"),
        latency_p99_s=chosen.get("latency_p99_s"),
        ttft_p50_s=chosen.get("ttft_p50_s"),
        quantization=(data.get("engine") or {}).get("quantization"),
        curve=LoadCurve(tuple(sorted(points)), source) if points else None,
        source=source,
    )
