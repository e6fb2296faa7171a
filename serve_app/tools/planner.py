"""`serve-app plan`: monthly cost of five setups from measured throughput and dated prices.

    serve-app plan --baseline results/throughput.json --measured results/mixed_workload.json \\
        --measured results/fault_spot.json --requests-per-month 30e6 --mean-output-tokens 200 \\
        --instance-type m7i.2xlarge --out results/plan

The baseline is one replica's throughput from `benchmarks/throughput.py`'s JSON;
throughput factors and the Spot resume overhead come from the `factors` of any
benchmark JSON given (the baseline's included); a factor no file gives is shown
as UNMEASURED and counts as 1.0, and so do the setups that use it. A baseline
or factor measured on a CPU is refused for a GPU instance type (and the other
way round) unless `--allow-other-hardware`, which flags it on every line. A CPU
replica is priced at the vCPUs the benchmark's replica held
(`results[].vcpus_per_replica`), never fewer. Prices come from the built-in
price book or `--prices`, with their dates. The arithmetic is `serve_app.cost.plan`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from serve_app.config.cost import PriceTable, ReplicaShape
from serve_app.cost.measured import Baseline, read_baseline, read_factors
from serve_app.cost.plan import hourly_rates, plan, plan_factors
from serve_app.cost.prices import PRICE_BOOK, Prices, load_price_book


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", "--benchmark", type=Path, required=True,
                        help="throughput JSON (benchmarks/throughput.py): one replica's output tok/s")
    parser.add_argument("--target", help="which result of the baseline (default: the first)")
    parser.add_argument("--slo-p99-s", type=float, help="refuse a baseline whose p99 latency is over this")
    parser.add_argument("--measured", type=Path, action="append", default=[],
                        help="benchmark JSON with a top-level `factors` object (repeatable)")
    traffic = parser.add_mutually_exclusive_group(required=True)
    traffic.add_argument("--requests-per-month", type=float)
    traffic.add_argument("--peak-rps", type=float)
    parser.add_argument("--offpeak-rps", type=float, help="with --peak-rps (default: the profile's ~9x trough)")
    parser.add_argument("--mean-output-tokens", type=float, help="default: the baseline's max_tokens")
    parser.add_argument("--prices", type=Path, default=PRICE_BOOK, help="price book YAML (default: the built-in)")
    parser.add_argument("--instance-type", default="m7i.2xlarge")
    parser.add_argument("--gpus-per-replica", type=float)
    parser.add_argument("--vcpus-per-replica", type=float,
                        help="CPU instance types: default (and least) the vCPUs the baseline's replica held")
    parser.add_argument("--allow-other-hardware", action="store_true",
                        help="use a baseline or factor measured on other hardware (CPU for a GPU type), flagged")
    parser.add_argument("--spot-share", type=float, default=0.7)
    parser.add_argument("--spot-interruptions-per-day", type=float, default=0.5,
                        help="per Spot instance; conservative for GPU Spot (set from your own history)")
    parser.add_argument("--spot-lost-work-s", type=float, default=60.0,
                        help="replica-seconds lost per interruption when no file measures spot_resume_overhead_s")
    parser.add_argument("--spot-replacement-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("results/plan"))


def run(args: argparse.Namespace) -> int:
    """Plan, print, write JSON + PNG; a bad input is one line on stderr and exit 1."""
    try:
        result = make_plan(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"serve-app plan: {exc}", file=sys.stderr)
        return 1
    print_plan(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0


def replica_vcpus(given: float | None, baseline: Baseline, gpu: bool) -> float | None:
    """The vCPUs a CPU replica is priced at: what the benchmark's replica held, or more."""
    if gpu or baseline.vcpus_per_replica is None:
        return given
    if given is not None and given < baseline.vcpus_per_replica:
        raise ValueError(f"--vcpus-per-replica {given:g} is below the {baseline.vcpus_per_replica:g} vCPUs the "
                         f"measured replica held ({baseline.source}): that would understate its cost")
    return baseline.vcpus_per_replica if given is None else given


def make_plan(args: argparse.Namespace) -> dict[str, Any]:
    book = load_price_book(args.prices)
    baseline = read_baseline(args.baseline, args.target, args.slo_p99_s)
    instance = book.instances.get(args.instance_type)
    gpu = instance is not None and instance.gpus > 0
    shape = ReplicaShape(instance_type=args.instance_type, gpus_per_replica=args.gpus_per_replica,
                         vcpus_per_replica=replica_vcpus(args.vcpus_per_replica, baseline, gpu))
    prices = Prices.resolve(PriceTable(replicas={"plan": shape}), book)
    measured, unknown = read_factors([args.baseline, *args.measured])
    output_tokens = args.mean_output_tokens or baseline.max_tokens
    if output_tokens is None:
        raise ValueError("--mean-output-tokens is needed: the baseline does not say its max_tokens")
    factors = plan_factors(baseline, measured, args.spot_interruptions_per_day, args.spot_lost_work_s,
                           args.spot_replacement_s, "gpu" if gpu else "cpu", args.allow_other_hardware)
    rates = hourly_rates(args.requests_per_month, args.peak_rps, args.offpeak_rps)
    return {**plan(baseline, factors, rates, prices, shape, output_tokens, args.spot_share, book.hosted_models),
            "unused_factors": unknown}


def print_plan(result: dict[str, Any]) -> None:
    base = result["baseline"]
    print(f"baseline: {base['output_tokens_per_s']:g} output tok/s per replica from {base['source']}"
          f"{' (quantized: ' + base['quantization'] + ')' if base['quantization'] else ''}; "
          f"{result['traffic']['requests_per_month']:,} requests/month of {result['traffic']['mean_output_tokens']:g} "
          "output tokens")
    print("\nfactors (value, source):")
    for name, factor in result["factors"].items():
        basis = "" if factor["basis"] == "measured" else f"{factor['basis'].upper()}: "
        print(f"  {name:<30}{factor['value']:>10.4g}  {basis}{factor['source']}")
        if factor["assumption"]:
            print(f"  {'':<30}{'':>10}  assuming {factor['assumption']}")
        if factor["warning"]:
            print(f"  {'':<30}{'':>10}  !!! {factor['warning']}")
    for instance_type, quotes in result["prices"]["quotes"].items():
        for kind, quote in quotes.items():
            print(f"price: {instance_type} {kind} ${quote['hourly_usd']}/h, {quote['region']}, as of "
                  f"{quote['as_of']}, {quote['source']}")
    print(f"Spot effective ${result['spot']['effective_hourly_usd']}/h ({result['spot']['useful_fraction']:.4f} "
          "useful)")
    print(f"\n{'setup':<27}{'peak repl':>10}{'USD/month':>12}{'fluid':>12}{'USD/1k req':>12}{'USD/1M out':>12}"
          f"  {'price as of':<12} published (not used)")
    for s in result["setups"]:
        published = f"{s['published']['figure']} ({s['published']['source'].split(' (')[0]})" if s["published"] else ""
        print(f"{s['name']:<27}{s['peak_replicas']:>10}{s['monthly_usd']:>12,.2f}{s['fluid_monthly_usd']:>12,.2f}"
              f"{s['cost_per_1k_requests_usd']:>12.4f}{s['cost_per_1m_output_tokens_usd']:>12.2f}"
              f"  {','.join(s['price_as_of']):<12} {published}"
              + (f"  [UNMEASURED: {', '.join(s['unmeasured'])} taken as 1.0]" if s["unmeasured"] else ""))
    for name, hosted in result["hosted_models"].items():
        print(f"hosted {name}: ${hosted['usd_per_1m_output_tokens']}/1M output tokens "
              f"(+${hosted['usd_per_1m_input_tokens']}/1M input), as of {hosted['as_of']}, {hosted['source']}")
    if result["unused_factors"]:
        print("factors in the files the plan does not use:\n  " + "\n  ".join(result["unused_factors"]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = result["setups"]
    names = [s["name"].replace(" scheduling", "\nscheduling") for s in setups]
    xs = range(len(setups))
    fig, (monthly, per_token) = plt.subplots(1, 2, figsize=(14, 5.5))
    bars = monthly.bar(xs, [s["monthly_usd"] for s in setups], color="tab:blue", label="with ceilings")
    monthly.scatter(xs, [s["fluid_monthly_usd"] for s in setups], color="black", marker="_", s=600, zorder=3,
                    label="fluid estimate")
    for bar, setup in zip(bars, setups, strict=True):
        monthly.annotate(f"${setup['cost_per_1k_requests_usd']:.4f}/1k req", (bar.get_x() + bar.get_width() / 2,
                         bar.get_height()), ha="center", va="bottom", fontsize=8)
    monthly.set_xticks(list(xs), names, fontsize=8)
    monthly.set_ylabel("USD per month")
    monthly.set_title(f"{result['traffic']['requests_per_month']:,} requests/month on "
                      f"{result['replica']['instance_type']}")
    monthly.legend()
    per_token.bar(xs, [s["cost_per_1m_output_tokens_usd"] for s in setups], color="tab:green")
    for name, hosted in result["hosted_models"].items():
        per_token.axhline(hosted["usd_per_1m_output_tokens"], color="tab:red", linestyle="--",
                          label=f"hosted {name} (as of {hosted['as_of']})")
    per_token.set_xticks(list(xs), names, fontsize=8)
    per_token.set_ylabel("USD per 1M output tokens")
    per_token.set_title("self-hosted cost per 1M output tokens")
    if result["hosted_models"]:
        per_token.legend()
    lines = [f"{name}: {f['value']:.4g} ({f['basis']}) {f['source']}" + (f" !!! {f['warning']}" if f["warning"] else "")
             for name, f in result["factors"].items()]
    lines.append(f"prices as of {', '.join(result['prices']['as_of'])}")
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.03 + 0.025 * len(lines), 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve-app plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
