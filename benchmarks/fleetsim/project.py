"""Routing on a GPU fleet, projected: the app's scheduling against Serve's defaults.

    .venv/bin/python -m benchmarks.fleetsim.project    # a few minutes; writes benchmarks/results/fleetsim_routing.{json,png}

Every figure this writes is PROJECTED, not measured: the engines' step time
and KV cache come from a published source (`published.PUBLISHED[--engine]`:
BLIS's trained coefficients for H100, its roofline for L40S), the replicas
are `configs/prod.yaml`'s first model's, `--replicas` of them in one pool
(`max_num_seqs` 256) or its pools, and the traffic is
the Splitwise production trace (`traces.py`: no text, so the predictor sees
only each prompt's size). The app's own batcher runs in every system:

- `app`: length-aware ordering and long-request cap (the app's default), its
  least-loaded replica choice;
- `fcfs`: the same without length awareness;
- `serve-default`: no length awareness, Serve's power-of-two replica choice;
- `app-pools`: `app` with prod.yaml's pools per length class (short answers on
  replicas of their own), the replicas split as `pool_replicas` sizes them.

Capacity is the `fcfs` fleet's closed-loop throughput on the window's requests
(every slot busy); each load offers that share of it as the trace's own
arrivals, time-scaled. Metrics are `vllm bench serve`'s; short requests are
those whose answer runs at most `SHORT_TOKENS`, grouped by actual length. Each
run is priced as the fixed fleet on demand (the price book's instance type for
the GPU) over the output tokens it served. The file's `factors` give the
planner (`serve-app plan --measured`) the length factor as simulated here:
capacity at the SLO of `app` over `fcfs`, with the simulator's calibration error.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import metrics
from benchmarks.fleetsim import virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter, PowerOfTwoRouter, Router
from benchmarks.fleetsim.published import PUBLISHED, PublishedEngine, cross_check
from benchmarks.fleetsim.simulate import SimApp, SimRequest, closed_loop, open_loop
from benchmarks.fleetsim.traces import SPLITWISE, splitwise_requests
from benchmarks.provenance import REPO, command_line
from benchmarks.report import write_json
from serve_app.config import AppConfig
from serve_app.config.app import load_serve_config
from serve_app.cost.prices import load_price_book

SHORT_TOKENS = 64
SLO = metrics.Slo(ttft_s=1.0, tpot_s=0.05)
"""Goodput's SLO: first token within a second, then 20 tokens/s or better."""
SLO_ATTAINMENT = 0.9
"""A load is served within the SLO when this share of its requests meets it."""
VALIDATION = REPO / "benchmarks" / "results" / "fleetsim_validation.json"


@dataclass(frozen=True)
class FleetSystem:
    length_aware: bool
    router: type
    """The replica choice (a `Router` class)."""
    pools: bool = False
    """prod.yaml's pools per length class, else one pool of every replica."""


SYSTEMS = {"app": FleetSystem(True, LeastLoadedRouter), "app-pools": FleetSystem(True, LeastLoadedRouter, pools=True),
           "fcfs": FleetSystem(False, LeastLoadedRouter), "serve-default": FleetSystem(False, PowerOfTwoRouter)}


def fleet_config(system: FleetSystem, replicas_config: Path = REPO / "configs" / "prod.yaml") -> AppConfig:
    """prod.yaml's first model, with its pools or as one pool, each queue holding a whole burst."""
    args = load_serve_config(replicas_config)["applications"][0]["args"]
    model = {**args["models"][0], "length_scheduling": {"enabled": system.length_aware}}
    pools = model["pools"] if system.pools else [{"name": "default"}]
    model["pools"] = [{"name": pool["name"], "max_output_tokens": pool.get("max_output_tokens"),
                       "engine": pool.get("engine", {}), "queue_size": 100_000} for pool in pools]
    model["deployment"] = {"num_replicas": 1, "max_ongoing_requests": model["engine"]["max_num_seqs"]}
    for pool in model["pools"]:
        seqs = pool["engine"].get("max_num_seqs")
        pool["deployment"] = {"num_replicas": 1, "max_ongoing_requests": seqs} if seqs else None
    return AppConfig.model_validate({"models": [model], "ingress": {"queue_timeout_s": 3600, "request_timeout_s": 7200}})


def pool_replicas(config: AppConfig, replicas: int, requests: list[SimRequest]) -> dict[str, int]:
    """`replicas` split between the pools as the output tokens of the answers each
    pool's bucket holds (how an operator sizes pools from past traffic), one at least."""
    pools = config.models[0].pools
    edges = [pool.max_output_tokens or math.inf for pool in pools]
    tokens = [sum(r.answer_tokens for r in requests if lower < r.answer_tokens <= upper)
              for lower, upper in zip([0, *edges[:-1]], edges, strict=True)]
    counts = [max(1, round(replicas * share / sum(tokens))) for share in tokens]
    counts[-1] = max(1, replicas - sum(counts[:-1]))
    return {pool.name: count for pool, count in zip(pools, counts, strict=True)}


def run(config: AppConfig, router: Router, engine: PublishedEngine, replicas: int | dict[str, int],
        requests: list[SimRequest], concurrency: int | None = None) -> dict[str, Any]:
    """One simulated run: closed loop at `concurrency`, else open loop at the requests' arrivals."""
    async def main():
        app = SimApp(config, engine.step_time, router, replicas, engine.kv_cache_tokens)
        if concurrency is not None:
            return await closed_loop(app, requests, concurrency)
        return await open_loop(app, requests)

    records, duration = virtual_time.run(main())
    summary = metrics.summarize(records, duration, SLO)
    short = [r.e2el_s for r in records if r.ok and r.kind == "short"]
    summary["short_e2el_s"] = metrics.distribution(short)
    return summary


def at_load(requests: list[SimRequest], rate: float) -> list[SimRequest]:
    """The same requests, their arrivals scaled to `rate` requests per second."""
    span = max(r.arrival_s for r in requests) or 1.0
    factor = (len(requests) / rate) / span
    return [replace(r, arrival_s=r.arrival_s * factor) for r in requests]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="llama-3.1-8b-h100", choices=sorted(PUBLISHED))
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--loads", default="0.5,0.7,0.9,1.0")
    parser.add_argument("--window-s", type=float, default=900.0, help="seconds of the trace from its start")
    parser.add_argument("--trace", type=Path, default=SPLITWISE)
    parser.add_argument("--out", default="benchmarks/results/fleetsim_routing")
    args = parser.parse_args(argv)
    engine = PUBLISHED[args.engine]
    requests = [replace(r, kind="short" if r.answer_tokens <= SHORT_TOKENS else "other")
                for r in splitwise_requests(args.trace, duration_s=args.window_s)]
    configs = {name: fleet_config(system) for name, system in SYSTEMS.items()}
    split = {name: pool_replicas(config, args.replicas, requests) for name, config in configs.items()}
    slots = args.replicas * configs["fcfs"].models[0].engine.max_num_seqs
    capacity = run(configs["fcfs"], LeastLoadedRouter(), engine, args.replicas, requests, slots)["request_throughput"]
    print(f"[project] {args.replicas} x {args.engine}: capacity {capacity:.1f} req/s ({len(requests)} requests)",
          flush=True)
    loads = [float(load) for load in args.loads.split(",")]
    results: dict[str, dict[str, Any]] = {name: {} for name in SYSTEMS}
    for load in loads:
        offered = at_load(requests, load * capacity)
        for name, system in SYSTEMS.items():
            summary = run(configs[name], system.router(), engine, split[name], offered)
            results[name][str(load)] = summary
            print(f"[project] load {load}: {name:13} short E2E p99 {fmt_s(summary['short_e2el_s']['p99'])}, "
                  f"E2E p50 {fmt_s(summary['e2el_s']['p50'])}, goodput {summary['goodput']:.1f} req/s", flush=True)
    price = gpu_hour_price(engine)
    if price is not None:
        for by_load in results.values():
            for summary in by_load.values():
                summary["usd_per_1m_output_tokens"] = round(
                    args.replicas * price["usd_per_gpu_hour"] / 3600 / summary["output_throughput"] * 1e6, 4)
    result = {
        "benchmark": "fleetsim_routing", "projected": True, "command": command_line(), "price": price,
        "engine": {"name": args.engine, "step_time": {**asdict(engine.step_time), "source": engine.step_time.source},
                   "kv_cache_tokens": engine.kv_cache_tokens},
        "h100_trained_vs_roofline": cross_check(),
        "replicas": args.replicas, "capacity_req_per_s": capacity, "loads": loads,
        "trace": {"file": "../shared/traces/splitwise_conv.csv", "window_s": args.window_s, "requests": len(requests)},
        "short_tokens": SHORT_TOKENS, "slo": vars(SLO), "results": results,
        "factors": length_factor(results, capacity, engine, args.replicas, loads),
    }
    settings = {name: {"length_awareness": "on" if system.length_aware else "off",
                       "replica_choice": system.router.__name__,
                       "replicas_per_pool": ", ".join(f"{pool} {count}" for pool, count in split[name].items()),
                       "dtype": "bfloat16 (the published coefficients')"}
                for name, system in SYSTEMS.items()}
    write_json(Path(f"{args.out}.json"), result, settings)
    plot(results, loads, Path(f"{args.out}.png"), f"{args.replicas} x {args.engine} (projected)")
    return result


def capacity_at_slo(by_load: dict[str, dict[str, Any]], capacity: float) -> float | None:
    """The highest offered rate (req/s) among the runs' loads at which `SLO_ATTAINMENT`
    of the requests met the SLO; None if none did."""
    met = [float(load) * capacity for load, run in by_load.items()
           if run["good_requests"] >= SLO_ATTAINMENT * run["requests"]]
    return max(met, default=None)


def length_factor(results: dict[str, dict[str, Any]], capacity: float, engine: PublishedEngine, replicas: int,
                  loads: list[float]) -> dict[str, Any]:
    """The planner's `length_scheduling` factor, simulated: capacity at the SLO with
    length awareness (`app`) over without (`fcfs`, the same fleet and replica choice).
    Empty where either never met the SLO."""
    aware, unaware = capacity_at_slo(results["app"], capacity), capacity_at_slo(results["fcfs"], capacity)
    if not aware or not unaware:
        return {}
    return {"length_scheduling": {
        "value": round(aware / unaware, 4), "metric": "capacity_at_slo_ratio", "basis": "simulated",
        "definition": f"the highest of the loads {loads} (shares of the fleet's closed-loop capacity) at which "
                      f"{SLO_ATTAINMENT:.0%} of requests met TTFT <= {SLO.ttft_s:g} s and TPOT <= {SLO.tpot_s:g} s: "
                      "the app over the same without length awareness, simulated on the Splitwise trace",
        "measured_on": f"simulated: {replicas} x {engine.gpu}, step time from {engine.step_time.source}",
        "hardware": {"kind": "gpu", "model": engine.gpu}, "command": command_line(), "runs": 1,
        "calibration_error": calibration_error(),
        "assumption": f"the GPU step time is the published source's, not validated here; the calibration error is "
                      f"the simulator's against this machine's CPU engine ({VALIDATION.name})"}}


def calibration_error() -> float:
    """The simulator's worst error against this machine's engine, over every metric
    and load its validation compares (`VALIDATION`)."""
    validation = json.loads(VALIDATION.read_text())
    return round(max(abs(row["error"]) for rows in validation["comparison"].values() for row in rows.values()), 4)


def gpu_hour_price(engine: PublishedEngine) -> dict[str, Any] | None:
    """One GPU-hour of the engine's instance type, on demand, from the app's price book
    (what a fixed fleet costs whatever its load); None where the book has no such type."""
    if engine.instance_type is None:
        return None
    instance = load_price_book().instances[engine.instance_type]
    return {"instance_type": engine.instance_type, "usd_per_gpu_hour": instance.on_demand.hourly_usd / instance.gpus,
            **instance.on_demand.model_dump(include={"region", "as_of", "source"})}


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}s"


def plot(results: dict[str, dict[str, Any]], loads: list[float], path: Path, title: str) -> None:
    from benchmarks.plots import pyplot

    plt = pyplot()
    fig, (short, goodput) = plt.subplots(1, 2, figsize=(10, 4))
    for name, by_load in results.items():
        short.plot(loads, [by_load[str(load)]["short_e2el_s"]["p99"] for load in loads], marker="o", label=name)
        goodput.plot(loads, [by_load[str(load)]["goodput"] for load in loads], marker="o", label=name)
    short.set(xlabel="load (share of capacity)", ylabel="short requests' E2E p99 (s)", title=title)
    goodput.set(xlabel="load (share of capacity)", ylabel="goodput (req/s)", title="goodput at the SLO")
    short.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
