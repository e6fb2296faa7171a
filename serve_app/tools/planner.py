"""Monthly cost plan: measured per-replica throughput x prices x a diurnal traffic profile.

    serve-app plan --benchmark results/throughput.json --requests-per-month 30e6 \\
        --mean-output-tokens 200 --instance-type g6e.xlarge --out results/plan

Five setups: on-demand FP16, then each of + quantization, + length batching and
+ Spot mix alone, and all combined. Each hour of the day gets whole replicas
(`ceil(rate / per-replica rate)`), each capacity type whole instances
(`ceil(replicas x instance share)`); a fluid estimate (fractional replicas,
what calculators that divide averages report) is shown beside it. Spot is billed
at an effective price that pays for preemptions: each interruption loses the
replica's in-flight work and bills its replacement while it starts, so a Spot
replica-hour delivers `1 - rate x (lost_work_s + replacement_s) / 3600` useful hours.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from serve_app.config import PriceTable, ReplicaShape

HOURS_PER_MONTH = 730.0
DIURNAL_SHAPE = (0.20, 0.15, 0.12, 0.11, 0.11, 0.13, 0.20, 0.35, 0.50, 0.60, 0.65, 0.70,
                 0.72, 0.70, 0.68, 0.70, 0.75, 0.85, 0.95, 1.00, 0.98, 0.85, 0.60, 0.35)
"""Request rate per hour of day as a share of the peak (19:00); peak/trough ~9x."""

QUANTIZATION_MULTIPLIER = 1.6
"""Throughput of FP8 over FP16 weights: vLLM's FP8 docs quote up to 1.6x."""
BATCHING_MULTIPLIER = 1.86
"""Throughput of output-length bucketing over plain continuous batching: +86%
(Zheng et al. 2023, "Response Length Perception and Sequence Scheduling")."""


@dataclass(frozen=True)
class Throughput:
    """One replica at the SLO, from a benchmark."""

    output_tokens_per_s: float
    requests_per_s: float
    quantized: bool
    """The benchmark already ran a quantized engine (its FP16 figure is derived)."""
    source: str


def read_benchmark(path: Path, target: str | None, slo_p99_s: float | None) -> Throughput:
    """A `benchmarks/throughput.py` result (one target of its `results`), or
    `{"per_replica": {"requests_per_s", "output_tokens_per_s"}, "quantized": bool}`."""
    data = json.loads(path.read_text())
    if "per_replica" in data:
        per = data["per_replica"]
        return Throughput(per["output_tokens_per_s"], per["requests_per_s"], bool(data.get("quantized")), str(path))
    results = data["results"]
    chosen = next((r for r in results if r["target"] == target), None) if target else results[0]
    if chosen is None:
        raise ValueError(f"{path}: no target {target!r}; it has {[r['target'] for r in results]}")
    if chosen.get("failed"):
        raise ValueError(f"{path}: {chosen['failed']} requests failed in {chosen['target']}; not a throughput at the SLO")
    if slo_p99_s is not None and chosen["latency_p99_s"] > slo_p99_s:
        raise ValueError(f"{path}: {chosen['target']} p99 latency {chosen['latency_p99_s']}s is over the "
                         f"{slo_p99_s}s SLO; benchmark at a lower concurrency")
    quantized = bool((data.get("engine") or {}).get("quantization"))
    return Throughput(chosen["output_tok_per_s"], chosen["req_per_s"], quantized, f"{path}:{chosen['target']}")


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
    throughput_multiplier: float
    spot_share: float


@dataclass(frozen=True)
class SpotRisk:
    interruptions_per_hour: float
    """Interruptions per Spot instance-hour."""
    lost_work_s: float
    """Replica-seconds of work redone per interruption (in-flight requests)."""
    replacement_s: float
    """Seconds a replacement is billed before it serves (node + model load)."""

    def useful_fraction(self) -> float:
        return 1 - self.interruptions_per_hour * (self.lost_work_s + self.replacement_s) / 3600


def plan_setup(setup: Setup, per_replica_rps: float, rates: list[float], prices: PriceTable, shape: ReplicaShape,
               risk: SpotRisk, output_tokens: float) -> dict[str, Any]:
    rps = per_replica_rps * setup.throughput_multiplier
    share = prices.instance_share(shape)
    on_demand_price = prices.instance_hourly_usd(shape.instance_type, spot=False)
    spot_price = prices.instance_hourly_usd(shape.instance_type, spot=True) / risk.useful_fraction()
    day_usd = fluid_usd = 0.0
    replicas, instances = [], []
    for rate in rates:
        needed = max(1, math.ceil(rate / rps))
        on_demand = math.ceil(round((1 - setup.spot_share) * needed, 9))
        spot = needed - on_demand
        od_instances, spot_instances = math.ceil(on_demand * share), math.ceil(spot * share)
        day_usd += od_instances * on_demand_price + spot_instances * spot_price
        fluid = rate / rps * share
        fluid_usd += fluid * ((1 - setup.spot_share) * on_demand_price + setup.spot_share * spot_price)
        replicas.append(needed)
        instances.append(od_instances + spot_instances)
    days = HOURS_PER_MONTH / 24
    requests = sum(rates) * 3600 * days
    monthly = day_usd * days
    return {
        **asdict(setup),
        "per_replica_rps": round(rps, 4),
        "peak_replicas": max(replicas),
        "mean_replicas": round(sum(replicas) / 24, 2),
        "instance_hours_per_month": round(sum(instances) * days, 1),
        "monthly_usd": round(monthly, 2),
        "fluid_monthly_usd": round(fluid_usd * days, 2),
        "cost_per_1k_requests_usd": round(1000 * monthly / requests, 6),
        "cost_per_1m_output_tokens_usd": round(1e6 * monthly / (requests * output_tokens), 4),
        "hourly_replicas": replicas,
    }


def plan(throughput: Throughput, rates: list[float], prices: PriceTable, shape: ReplicaShape, risk: SpotRisk,
         output_tokens: float, quantization: float, batching: float, spot_share: float) -> dict[str, Any]:
    fp16_rps = throughput.output_tokens_per_s / output_tokens / (quantization if throughput.quantized else 1)
    setups = [Setup("on-demand FP16", 1.0, 0.0), Setup("+ quantization", quantization, 0.0),
              Setup("+ length batching", batching, 0.0), Setup("+ Spot mix", 1.0, spot_share),
              Setup("all combined", quantization * batching, spot_share)]
    return {
        "benchmark": asdict(throughput),
        "fp16_per_replica_rps": round(fp16_rps, 4),
        "traffic": {"hourly_rps": [round(r, 4) for r in rates], "mean_output_tokens": output_tokens,
                    "requests_per_month": round(sum(rates) * 3600 * HOURS_PER_MONTH / 24)},
        "replica": {**shape.model_dump(), "instance_share": prices.instance_share(shape)},
        "spot": {**asdict(risk), "useful_fraction": round(risk.useful_fraction(), 5),
                 "effective_hourly_usd": round(prices.instance_hourly_usd(shape.instance_type, spot=True)
                                               / risk.useful_fraction(), 4)},
        "multipliers": {"quantization": quantization, "batching": batching},
        "setups": [plan_setup(s, fp16_rps, rates, prices, shape, risk, output_tokens) for s in setups],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = result["setups"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(setups))
    bars = ax.bar(xs, [s["monthly_usd"] for s in setups], color="tab:blue", label="with ceilings")
    ax.scatter(xs, [s["fluid_monthly_usd"] for s in setups], color="black", marker="_", s=600, zorder=3,
               label="fluid estimate")
    for bar, setup in zip(bars, setups, strict=True):
        ax.annotate(f"${setup['cost_per_1k_requests_usd']:.4f}/1k req", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [s["name"] for s in setups])
    ax.set_ylabel("USD per month")
    ax.set_title(f"{result['traffic']['requests_per_month']:,} requests/month on {result['replica']['instance_type']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve-app plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", type=Path, required=True, help="throughput JSON (benchmarks/throughput.py)")
    parser.add_argument("--target", help="which result of the benchmark (default: the first)")
    parser.add_argument("--slo-p99-s", type=float, help="refuse a benchmark whose p99 latency is over this")
    traffic = parser.add_mutually_exclusive_group(required=True)
    traffic.add_argument("--requests-per-month", type=float)
    traffic.add_argument("--peak-rps", type=float)
    parser.add_argument("--offpeak-rps", type=float, help="with --peak-rps (default: the profile's ~9x trough)")
    parser.add_argument("--mean-output-tokens", type=float, help="default: the benchmark's max_tokens")
    parser.add_argument("--prices", type=Path, help="PriceTable YAML/JSON (default: the built-in list prices)")
    parser.add_argument("--instance-type", default="g6e.xlarge")
    parser.add_argument("--gpus-per-replica", type=float)
    parser.add_argument("--vcpus-per-replica", type=float)
    parser.add_argument("--quantization-multiplier", type=float, default=QUANTIZATION_MULTIPLIER)
    parser.add_argument("--batching-multiplier", type=float, default=BATCHING_MULTIPLIER)
    parser.add_argument("--spot-share", type=float, default=0.7)
    parser.add_argument("--spot-interruptions-per-day", type=float, default=0.5,
                        help="per Spot instance; conservative for GPU Spot (set from your own history)")
    parser.add_argument("--spot-lost-work-s", type=float, default=60.0)
    parser.add_argument("--spot-replacement-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("results/plan"))
    args = parser.parse_args(argv)

    prices = PriceTable.model_validate(yaml.safe_load(args.prices.read_text())) if args.prices else PriceTable()
    shape = ReplicaShape(instance_type=args.instance_type, gpus_per_replica=args.gpus_per_replica,
                         vcpus_per_replica=args.vcpus_per_replica)
    PriceTable(instances=prices.instances, replicas={"plan": shape})  # validates the shape against the instances
    throughput = read_benchmark(args.benchmark, args.target, args.slo_p99_s)
    output_tokens = args.mean_output_tokens
    if output_tokens is None:
        output_tokens = json.loads(args.benchmark.read_text()).get("workload", {}).get("max_tokens")
        if output_tokens is None:
            parser.error("--mean-output-tokens is needed: the benchmark does not say")
    risk = SpotRisk(args.spot_interruptions_per_day / 24, args.spot_lost_work_s, args.spot_replacement_s)
    rates = hourly_rates(args.requests_per_month, args.peak_rps, args.offpeak_rps)
    result = plan(throughput, rates, prices, shape, risk, output_tokens, args.quantization_multiplier,
                  args.batching_multiplier, args.spot_share)

    print(f"per replica (FP16, at the SLO): {result['fp16_per_replica_rps']} req/s of {output_tokens:g} output "
          f"tokens, from {throughput.source}{' (measured quantized)' if throughput.quantized else ''}")
    print(f"{result['traffic']['requests_per_month']:,} requests/month; Spot effective "
          f"${result['spot']['effective_hourly_usd']}/h ({result['spot']['useful_fraction']:.4f} useful)")
    print(f"\n{'setup':<20}{'peak repl':>10}{'mean repl':>10}{'USD/month':>12}{'fluid':>12}{'USD/1k req':>12}"
          f"{'USD/1M out':>12}")
    for s in result["setups"]:
        print(f"{s['name']:<20}{s['peak_replicas']:>10}{s['mean_replicas']:>10}{s['monthly_usd']:>12,.2f}"
              f"{s['fluid_monthly_usd']:>12,.2f}{s['cost_per_1k_requests_usd']:>12.4f}"
              f"{s['cost_per_1m_output_tokens_usd']:>12.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0
