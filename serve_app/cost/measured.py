"""What the planner and the diurnal simulation take from benchmark JSONs written in this repo.

Baseline (`benchmarks/throughput.py`'s JSON), one entry of `results` picked by
`target` (default: the first):
- `results[].output_tok_per_s`, `results[].req_per_s`: throughput over the run;
- `results[].failed` (must be 0), `results[].latency_p50_s`, `latency_p99_s`, `ttft_p50_s`;
- `results[].replicas` (optional, default 1): replicas that served the target;
  throughput and concurrency are divided by it to get one replica's;
- `results[].load_curve` (optional): `[{"concurrency": n, "output_tok_per_s": x}]`,
  one replica's output tok/s at n concurrent streams (more points: a better curve);
- `results[].quantization` (not null: that target's engine ran quantized; read
  per result, never from the file's top level);
- `results[].vcpus_per_replica` (optional): the vCPUs one replica of the target
  held while it was measured (the planner prices a CPU replica by it);
- `workload.concurrency`, `workload.max_tokens`; `provenance.cpu` (or `machine`):
  the hardware it ran on.

Factors (any benchmark JSON): a top-level `factors` object of `MeasuredFactor`s
(without `source`); the planner uses the names in `FACTORS`, each only with the
metric its entry names and from at least its `min_runs` runs.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

HardwareKind = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class FactorSpec:
    """What the planner accepts under one factor name."""

    meaning: str
    metric: str
    """The `metric` a file's entry must name (another measurement under the same name is refused)."""
    ratio: bool
    """A ratio of throughputs or capacities (must be > 0); else seconds (any sign, never clamped)."""
    min_runs: int
    """Fewest runs the value may rest on."""


FACTORS = {
    "quantization": FactorSpec(
        "output tok/s of the quantized engine over the unquantized one, in configs that differ only in "
        "quantization (same benchmark)", "throughput_ratio", True, 1),
    "length_scheduling": FactorSpec(
        "capacity at an SLO with length-aware scheduling over without: the highest offered rate at which each "
        "system meets the stated goodput (mixed-workload benchmark)", "capacity_at_slo_ratio", True, 1),
    "spot_resume_overhead_s": FactorSpec(
        "extra end-to-end seconds per stream resumed or re-sent after a Spot node is lost under load, over an "
        "uninterrupted run of the same streams (fault test), over several runs", "extra_e2el_s_per_resumed_stream",
        False, 3),
    "spot_lost_work_s": FactorSpec(
        "replica-seconds of work computed again per Spot interruption (tokens a lost node had computed, redone "
        "elsewhere), on a fleet under load, over an uninterrupted run of the same requests (fleet simulator)",
        "replica_s_lost_per_interruption", False, 1),
}
"""Factor names the planner reads, with what each means and must be."""


class Hardware(BaseModel):
    """What a measurement ran on."""

    kind: HardwareKind
    """CPU or GPU: a factor measured on one is not evidence for the other."""
    model: str = Field(min_length=1)
    """The CPU or GPU model."""


class MeasuredFactor(BaseModel):
    """One entry of a benchmark JSON's `factors`, and the file it came from."""

    value: float
    """The measured value (a ratio, or seconds for `*_s`)."""
    metric: str
    """Which measurement this is (`FACTORS[name].metric`)."""
    definition: str = Field(min_length=1)
    """What was divided by what, or what was timed."""
    measured_on: str = Field(min_length=1)
    """The CPU or GPU it ran on, with its flags, in words."""
    hardware: Hardware
    """The CPU or GPU it ran on."""
    command: str = Field(min_length=1)
    """The command that measured it."""
    runs: int = Field(ge=1)
    """Runs (repeats) the value rests on."""
    basis: Literal["measured", "derived", "simulated"] = "measured"
    """Measured as named; derived from a measurement under `assumption`; or simulated
    (the fleet simulator on `hardware` it cannot measure, with its `calibration_error`)."""
    assumption: str | None = None
    """What a derived value assumes (required for `derived`)."""
    calibration_error: float | None = Field(default=None, ge=0)
    """A simulated value's simulator error against measurement, worst over the
    metrics its validation compares (0.1: 10%); required for `simulated`."""
    source: str
    """The JSON file it was read from."""

    @model_validator(mode="after")
    def _derived_says_why(self) -> MeasuredFactor:
        if self.basis == "derived" and not self.assumption:
            raise ValueError("a derived factor states its assumption")
        if self.basis == "simulated" and self.calibration_error is None:
            raise ValueError("a simulated factor states its calibration error")
        return self


def read_factors(paths: Iterable[Path]) -> tuple[dict[str, MeasuredFactor], list[str]]:
    """The usable factors in `paths` (each given by at most one file), and the
    others as `name (file): why not used`."""
    found: dict[str, MeasuredFactor] = {}
    unused: list[str] = []
    for path in dict.fromkeys(Path(p) for p in paths):
        for name, entry in (json.loads(path.read_text()).get("factors") or {}).items():
            spec = FACTORS.get(name)
            if spec is None:
                unused.append(f"{name} ({path}): not a factor the planner knows")
                continue
            if name in found:
                raise ValueError(f"factor {name!r} is in both {found[name].source} and {path}: pass one")
            try:
                factor = MeasuredFactor.model_validate({**entry, "source": str(path)})
            except ValidationError as exc:  # an older or foreign entry: said, not used
                fields = ", ".join(".".join(map(str, e["loc"])) or e["msg"] for e in exc.errors())
                unused.append(f"{name} ({path}): not a factor entry this planner reads ({fields})")
                continue
            if spec.ratio and factor.value <= 0:
                raise ValueError(f"{path}: factor {name!r} is a ratio and must be > 0, not {factor.value}")
            if factor.metric != spec.metric:
                unused.append(f"{name} ({path}): measures {factor.metric}, not {spec.metric}")
            elif factor.runs < spec.min_runs:
                unused.append(f"{name} ({path}): {factor.runs} run(s), fewer than {spec.min_runs}")
            else:
                found[name] = factor
    return found, unused


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
    """The target's engine quantization (None: unquantized)."""
    curve: LoadCurve | None
    """Throughput by concurrency (None: the file gives no concurrency)."""
    source: str
    """`file:target`."""
    hardware: Hardware | None = None
    """What it ran on (None: the file does not say)."""
    vcpus_per_replica: float | None = None
    """vCPUs one replica held while measured (None: not recorded)."""


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
        quantization=chosen.get("quantization"),
        curve=LoadCurve(tuple(sorted(points)), source) if points else None,
        source=source,
        hardware=hardware_of(data),
        vcpus_per_replica=chosen.get("vcpus_per_replica"),
    )


def hardware_of(data: dict[str, Any]) -> Hardware | None:
    """The CPU a benchmark JSON says it ran on (`provenance.cpu`, or the older `machine`)."""
    cpu = (data.get("provenance") or {}).get("cpu") or {}
    model = cpu.get("model") or (data.get("machine") or {}).get("cpu")
    return Hardware(kind="cpu", model=model) if model else None
