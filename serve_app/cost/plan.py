"""Monthly cost of five setups from one replica's measured throughput, measured
factors and dated prices, over a diurnal traffic profile.

Setups: the on-demand baseline, then each of + quantization, + length-aware
scheduling and + Spot mix alone, and all combined. Every number that enters a
setup is a `PlanFactor` with a source: a benchmark file (measured, or derived
from a measurement under a stated assumption), or the words "not measured" (a
throughput factor then counts as 1.0 and the setups that use it say they are
unpriced by it) or "assumed" (an operator input). Published figures sit in their
own column and are never used. A factor or baseline measured on other hardware
(a CPU factor for a GPU instance type) is refused unless the caller allows it,
and then flagged on every line that shows it.

Ceilings: each hour of the day gets whole replicas (`ceil(rate / per-replica
rate)`), each capacity type whole instances (`ceil(replicas x instance share)`);
a fluid estimate (fractional replicas, what calculators that divide averages
report) is shown beside it. Spot is billed at an effective price that pays for
preemptions: a Spot replica-hour delivers `1 - rate x (lost_work_s +
replacement_s) / 3600` useful hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from serve_app.config.cost import HostedModelPrice, ReplicaShape
from serve_app.cost.measured import FACTORS, Baseline, Hardware, HardwareKind, MeasuredFactor
from serve_app.cost.prices import Prices

HOURS_PER_MONTH = 730.0
DIURNAL_SHAPE = (0.20, 0.15, 0.12, 0.11, 0.11, 0.13, 0.20, 0.35, 0.50, 0.60, 0.65, 0.70,
                 0.72, 0.70, 0.68, 0.70, 0.75, 0.85, 0.95, 1.00, 0.98, 0.85, 0.60, 0.35)
"""Request rate per hour of day as a share of the peak (19:00); peak/trough ~9x."""

PUBLISHED = {
    "+ quantization": {"figure": "up to 1.6x throughput (FP8 over FP16)", "source": "vLLM docs, FP8 quantization"},
    "+ length-aware scheduling": {
        "figure": "+86% throughput over static batching",
        "source": "Zheng et al. 2023, Response Length Perception and Sequence Scheduling (static batching; "
                  "under continuous batching gains appear only near saturation)"},
    "+ Spot mix": {"figure": "-43% cost", "source": "SkyServe (Mao et al. 2024)"},
}
"""Published figures, shown beside the plan as published; never used in it."""

SPOT_TERMS = ("spot_interruptions_per_hour", "spot_lost_work_s", "spot_replacement_s")


SPOT_LOST_WORK_ASSUMPTION = (
    "a lost replica's streams resume elsewhere, each this many seconds later, and they ran together in one batch, "
    "so the replica loses about this many replica-seconds of work per interruption")
"""How `spot_lost_work_s` is derived from the fault test's measured resume overhead."""


@dataclass(frozen=True)
class PlanFactor:
    """A number a setup uses, and where it came from."""

    value: float
    basis: Literal["measured", "derived", "simulated", "not measured", "assumed"]
    """Measured (in a benchmark file); derived (from a measured one, under `assumption`); simulated
    (the fleet simulator's, its calibration error in `assumption`); not measured (a ratio: 1.0, and
    the setup says so); assumed (an operator input)."""
    source: str
    """The benchmark file, or what "not measured" / "assumed" means here."""
    definition: str = ""
    measured_on: str = ""
    command: str = ""
    assumption: str = ""
    warning: str = ""
    """Set when the factor was measured on other hardware than the plan prices (or the file does not say)."""


def hardware_warning(measured: Hardware | None, target: HardwareKind, what: str, allow: bool) -> str:
    """'' when `measured` is the `target` kind; else a loud warning (with `allow`) or ValueError."""
    if measured is not None and measured.kind == target:
        return ""
    if measured is None:
        return f"{what}: hardware not recorded; priced as a {target} instance type"
    message = f"{what} was measured on {measured.kind} ({measured.model}), applied to a {target} instance type"
    if not allow:
        raise ValueError(f"{message}: measure it on {target}, or pass --allow-other-hardware to use it flagged")
    return message.upper()


def from_measurement(name: str, factor: MeasuredFactor, target: HardwareKind, allow: bool) -> PlanFactor:
    assumption = factor.assumption or ""
    if factor.basis == "simulated":
        assumption = (f"the simulator's calibration error, up to {factor.calibration_error:.0%} against measurement"
                      + (f"; {assumption}" if assumption else ""))
    return PlanFactor(factor.value, factor.basis, factor.source, factor.definition, factor.measured_on,
                      factor.command, assumption, hardware_warning(factor.hardware, target, name, allow))


def plan_factors(baseline: Baseline, measured: Mapping[str, MeasuredFactor], interruptions_per_day: float,
                 lost_work_s: float, replacement_s: float, target: HardwareKind = "cpu",
                 allow_other_hardware: bool = False) -> dict[str, PlanFactor]:
    """Every factor a setup may use: measured where a file gives it, else 1.0 (a
    ratio, "not measured") or the operator's input ("assumed"); each checked
    against the `target` hardware the plan prices."""
    factors = {"baseline_output_tokens_per_s": PlanFactor(
        baseline.output_tokens_per_s, "measured", baseline.source, "one replica's output tokens/s",
        warning=hardware_warning(baseline.hardware, target, "the baseline", allow_other_hardware))}
    for name, why in (("quantization", "FP8 needs a GPU"),
                      ("length_scheduling", "capacity at an SLO from the mixed-workload benchmark")):
        factors[name] = from_measurement(name, measured[name], target, allow_other_hardware) if name in measured \
            else PlanFactor(1.0, "not measured", f"UNMEASURED: no file gives factors.{name} ({why}); the setups "
                                                 "using it are priced as if it were 1.0", FACTORS[name].meaning)
    resume = measured.get("spot_resume_overhead_s")
    if "spot_lost_work_s" in measured:  # the fleet simulator's, before a single engine's fault test
        factors["spot_lost_work_s"] = from_measurement("spot_lost_work_s", measured["spot_lost_work_s"], target,
                                                       allow_other_hardware)
    else:
        factors["spot_lost_work_s"] = PlanFactor(
            resume.value, "derived", resume.source, "spot_resume_overhead_s as replica-seconds lost per interruption",
            resume.measured_on, resume.command, SPOT_LOST_WORK_ASSUMPTION,
            hardware_warning(resume.hardware, target, "spot_resume_overhead_s", allow_other_hardware),
        ) if resume else PlanFactor(lost_work_s, "assumed", f"--spot-lost-work-s {lost_work_s:g} (no file gives "
                                                              "a usable factors.spot_lost_work_s or spot_resume_overhead_s)")
    factors["spot_interruptions_per_hour"] = PlanFactor(
        interruptions_per_day / 24, "assumed", f"--spot-interruptions-per-day {interruptions_per_day:g}")
    factors["spot_replacement_s"] = PlanFactor(replacement_s, "assumed", f"--spot-replacement-s {replacement_s:g}")
    return factors


def hourly_rates(requests_per_month: float | None, peak_rps: float | None, offpeak_rps: float | None) -> list[float]:
    """Requests/s for each hour of the day, shaped by `DIURNAL_SHAPE`."""
    if requests_per_month is not None:
        mean = requests_per_month / (HOURS_PER_MONTH * 3600)
        scale = mean / (sum(DIURNAL_SHAPE) / 24)
        return [scale * share for share in DIURNAL_SHAPE]
    if peak_rps is None:
        raise ValueError("give requests per month or a peak rate")
    low, high = min(DIURNAL_SHAPE), max(DIURNAL_SHAPE)
    off = peak_rps * low if offpeak_rps is None else offpeak_rps
    return [off + (peak_rps - off) * (share - low) / (high - low) for share in DIURNAL_SHAPE]


@dataclass(frozen=True)
class Setup:
    name: str
    multipliers: tuple[str, ...]
    """Throughput factors it multiplies the baseline by."""
    spot: bool


SETUPS = (
    Setup("on-demand baseline", (), False),
    Setup("+ quantization", ("quantization",), False),
    Setup("+ length-aware scheduling", ("length_scheduling",), False),
    Setup("+ Spot mix", (), True),
    Setup("all combined", ("quantization", "length_scheduling"), True),
)


def useful_fraction(factors: Mapping[str, PlanFactor]) -> float:
    """Useful share of a Spot replica-hour after preemptions."""
    lost = factors["spot_lost_work_s"].value + factors["spot_replacement_s"].value
    return 1 - factors["spot_interruptions_per_hour"].value * lost / 3600


def plan_setup(setup: Setup, unquantized_rps: float, rates: list[float], prices: Prices, shape: ReplicaShape,
               factors: Mapping[str, PlanFactor], spot_share: float, output_tokens: float,
               baseline_quantized: bool) -> dict[str, Any]:
    rps = unquantized_rps * math.prod(factors[name].value for name in setup.multipliers)
    spot_share = spot_share if setup.spot else 0.0
    share = prices.instance_share(shape)
    on_demand_price = prices.instance_hourly_usd(shape.instance_type, spot=False)
    spot_price = prices.instance_hourly_usd(shape.instance_type, spot=True) / useful_fraction(factors)
    day_usd = fluid_usd = 0.0
    replicas, instances = [], []
    for rate in rates:
        needed = max(1, math.ceil(rate / rps))
        on_demand = math.ceil(round((1 - spot_share) * needed, 9))
        od_instances, spot_instances = math.ceil(on_demand * share), math.ceil((needed - on_demand) * share)
        day_usd += od_instances * on_demand_price + spot_instances * spot_price
        fluid_usd += rate / rps * share * ((1 - spot_share) * on_demand_price + spot_share * spot_price)
        replicas.append(needed)
        instances.append(od_instances + spot_instances)
    days = HOURS_PER_MONTH / 24
    requests = sum(rates) * 3600 * days
    monthly = day_usd * days
    used = ["baseline_output_tokens_per_s", *setup.multipliers]
    if baseline_quantized and "quantization" not in used:
        used.append("quantization")  # the unquantized throughput is derived with it
    used += SPOT_TERMS if setup.spot else ()
    quotes = [(shape.instance_type, False)] + ([(shape.instance_type, True)] if setup.spot else [])
    return {
        "name": setup.name,
        "spot_share": spot_share,
        "per_replica_rps": round(rps, 4),
        "peak_replicas": max(replicas),
        "mean_replicas": round(sum(replicas) / 24, 2),
        "instance_hours_per_month": round(sum(instances) * days, 1),
        "monthly_usd": round(monthly, 2),
        "fluid_monthly_usd": round(fluid_usd * days, 2),
        "cost_per_1k_requests_usd": round(1000 * monthly / requests, 6),
        "cost_per_1m_output_tokens_usd": round(1e6 * monthly / (requests * output_tokens), 4),
        "factors": {name: {"value": factors[name].value, "basis": factors[name].basis, "source": factors[name].source,
                           "warning": factors[name].warning} for name in used},
        "unmeasured": [name for name in used if factors[name].basis == "not measured"],
        "price_as_of": prices.provenance(quotes)["as_of"],
        "published": PUBLISHED.get(setup.name),
        "hourly_replicas": replicas,
    }


def plan(baseline: Baseline, factors: Mapping[str, PlanFactor], rates: list[float], prices: Prices,
         shape: ReplicaShape, output_tokens: float, spot_share: float,
         hosted: Mapping[str, HostedModelPrice]) -> dict[str, Any]:
    """The five setups, with every factor's source and every price's date, and
    hosted models' prices per 1M tokens beside them."""
    quantized = baseline.quantization is not None
    unquantized_rps = (baseline.output_tokens_per_s / output_tokens
                       / (factors["quantization"].value if quantized else 1.0))
    spot_hourly = prices.instance_hourly_usd(shape.instance_type, spot=True)
    return {
        "baseline": {**{k: v for k, v in asdict(baseline).items() if k not in ("curve", "hardware")},
                     "hardware": baseline.hardware.model_dump() if baseline.hardware else None,
                     "unquantized_per_replica_rps": round(unquantized_rps, 4)},
        "factors": {name: asdict(factor) for name, factor in factors.items()},
        "traffic": {"hourly_rps": [round(r, 4) for r in rates], "mean_output_tokens": output_tokens,
                    "requests_per_month": round(sum(rates) * 3600 * HOURS_PER_MONTH / 24)},
        "replica": {**shape.model_dump(), "instance_share": prices.instance_share(shape)},
        "prices": prices.provenance([(shape.instance_type, False), (shape.instance_type, True)]),
        "hosted_models": {name: price.model_dump() for name, price in hosted.items()},
        "spot": {"useful_fraction": round(useful_fraction(factors), 5),
                 "effective_hourly_usd": round(spot_hourly / useful_fraction(factors), 4)},
        "setups": [plan_setup(setup, unquantized_rps, rates, prices, shape, factors, spot_share, output_tokens,
                              quantized) for setup in SETUPS],
    }
