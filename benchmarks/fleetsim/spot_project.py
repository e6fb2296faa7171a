"""Spot interruptions on a GPU fleet, projected: re-sending what a lost replica held
against the app's drain and resume.

    .venv/bin/python -m benchmarks.fleetsim.spot_project    # a few minutes; writes benchmarks/results/fleetsim_spot.{json,png}

Every figure this writes is PROJECTED, not measured: the fleet, engines and
traffic are `project.py`'s (prod.yaml's first model on `--engine`'s published
step time, one pool, the Splitwise window offered at `--load` of the fleet's
capacity). Three systems serve the same requests with the app's batcher:

- `on-demand`: nothing is interrupted;
- `spot-resend`: Spot as Serve's defaults leave it: a replica under notice keeps
  taking requests until its node goes, the streams on it then break, and their
  clients send them again from the start (the record times the user's wait
  from the first send);
- `spot-resume`: the app: a replica under notice takes nothing new and its slots
  leave the pool, its streams run on through the notice, and those still
  running when the node goes resume elsewhere from the tokens already sent;
- `spot-resume-late-drain` and `spot-resume-no-drain`: variants the app does
  not ship, to weigh its drain: the replica serves on through the notice but
  for its last `LATE_DRAIN_S` (or to the end), and whatever runs on it when the
  node goes resumes elsewhere.

`--interruptions` replicas get a notice each, at seeded times over the window
(which replica: seeded too); the node goes `NOTICE_S` later, and a replacement,
asked for at the notice, serves `--replacement-s` after it. Each of `--seeds`
draws its notices; the first seed's runs are reported in full, every seed's
share of requests within the SLO beside them. The window is far more
interrupted than a real one, so each interruption's toll is reported on its own
(streams broken, tokens computed again, the replica-seconds they take), and the
Spot Advisor's interruption-frequency buckets turn it into the seconds of a
Spot replica-hour lost and a cost per 1M output tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import metrics
from benchmarks.fleetsim import virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter
from benchmarks.fleetsim.project import (
    SLO,
    SYSTEMS,
    VALIDATION,
    at_load,
    calibration_error,
    fleet_config,
    gpu_hour_price,
)
from benchmarks.fleetsim.published import PUBLISHED, PublishedEngine
from benchmarks.fleetsim.simulate import SimApp, SimRequest, open_loop
from benchmarks.fleetsim.spot import NOTICE_S, REPLACEMENT_S, Interruption, ResendingClient, interrupt, interruptions
from benchmarks.fleetsim.step_time import StepShape
from benchmarks.fleetsim.traces import SPLITWISE, splitwise_requests
from benchmarks.provenance import REPO, command_line
from benchmarks.report import write_json
from serve_app.config import AppConfig
from serve_app.cost.plan import HOURS_PER_MONTH
from serve_app.cost.prices import load_price_book

SPOT_ADVISOR_BUCKETS = {"<5%": 0.05, "5-10%": 0.10, "10-15%": 0.15, "15-20%": 0.20, ">20%": 0.25}
"""The AWS Spot Instance Advisor's frequency-of-interruption buckets (share of an
instance type's Spot capacity reclaimed over the trailing month), each taken at
its upper edge (">20%" at 25%): interruptions per instance-month."""
ROUTING = {"llama-3.1-8b-h100": REPO / "benchmarks" / "results" / "fleetsim_routing.json",
           "llama-3.1-8b-l40s": REPO / "benchmarks" / "results" / "fleetsim_routing_l40s.json"}
"""The routing projections whose capacity calibrates the offered load."""


@dataclass(frozen=True)
class SpotSystem:
    interrupted: bool
    drain_before_s: float | None
    """A replica under notice takes nothing new from this long before its node goes
    (the app: from the notice, `NOTICE_S`); None: it serves until the end."""
    resumable: bool
    """A broken stream resumes from the tokens sent (greedy and unseeded); else its
    request runs seeded, which no other engine continues exactly, and the client
    sends it again."""


LATE_DRAIN_S = 30.0
"""The late-drain variant's: about twice the uninterrupted run's E2E p99, so most
requests it still takes end before the node goes."""
SPOT_SYSTEMS = {"on-demand": SpotSystem(False, None, True), "spot-resend": SpotSystem(True, None, False),
                "spot-resume": SpotSystem(True, NOTICE_S, True),
                "spot-resume-late-drain": SpotSystem(True, LATE_DRAIN_S, True),
                "spot-resume-no-drain": SpotSystem(True, None, True)}


def run(config: AppConfig, system: SpotSystem, engine: PublishedEngine, replicas: int, requests: list[SimRequest],
        events: list[Interruption], replacement_s: float) -> dict[str, Any]:
    """One simulated window; the summary, the tokens the engines computed and the streams that broke."""
    if not system.resumable:
        requests = [replace(r, seed=0) for r in requests]

    async def main():
        app = SimApp(config, engine.step_time, LeastLoadedRouter(), replicas, engine.kv_cache_tokens)
        spot = asyncio.create_task(interrupt(app, events if system.interrupted else [], system.drain_before_s, replacement_s))
        client = ResendingClient(app)
        records, duration = await open_loop(client, requests)
        await spot
        engines = app.fleet.engines
        return records, duration, client.broken, sum(e.prefill_tokens for e in engines), \
            sum(e.decode_tokens for e in engines)

    records, duration, broken, prefill, decode = virtual_time.run(main())
    summary = metrics.summarize(records, duration, SLO)
    return {**summary, "streams_broken": broken, "prefill_tokens_computed": prefill, "decode_tokens_computed": decode}


def toll(result: dict[str, Any], baseline: dict[str, Any], count: int, engine: PublishedEngine,
         replicas: int, max_batched_tokens: int) -> dict[str, Any]:
    """Per interruption, against the uninterrupted run of the same requests: streams
    broken, tokens computed again, and the replica-seconds those take (decode at the
    run's own replica-seconds per decoded token, prefill at a full prefill chunk's pace)."""
    extra_prefill = result["prefill_tokens_computed"] - baseline["prefill_tokens_computed"]
    extra_decode = result["decode_tokens_computed"] - baseline["decode_tokens_computed"]
    decode_s = replicas * baseline["duration_s"] / baseline["decode_tokens_computed"]
    prefill_s = engine.step_time.step_s(StepShape(0, max_batched_tokens, 0)) / max_batched_tokens
    lost_s = max(0, extra_prefill) * prefill_s + max(0, extra_decode) * decode_s
    return {"streams_broken": result["streams_broken"] / count, "prefill_tokens_again": extra_prefill / count,
            "decode_tokens_again": extra_decode / count, "lost_work_replica_s": round(lost_s / count, 3)}


def advisor_costs(toll_by_system: dict[str, dict], replacement_s: float, spot_hourly: float, od_hourly: float,
                  od_usd_per_1m: float) -> dict[str, dict[str, Any]]:
    """For each Spot Advisor bucket: the seconds of each Spot replica-hour lost to
    interruptions, `rate x (lost work + replacement)` as the planner counts them, and
    the cost per 1M output tokens that follows from the on-demand run's."""
    costs = {}
    for bucket, per_month in SPOT_ADVISOR_BUCKETS.items():
        rate = per_month / HOURS_PER_MONTH
        row = {}
        for name, toll_ in toll_by_system.items():
            lost_s = rate * (toll_["lost_work_replica_s"] + replacement_s)
            row[name] = {"lost_s_per_replica_hour": lost_s,
                         "usd_per_1m_output_tokens": od_usd_per_1m * spot_hourly / od_hourly / (1 - lost_s / 3600)}
        costs[bucket] = row
    return costs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="llama-3.1-8b-l40s", choices=sorted(PUBLISHED))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--load", type=float, default=0.7, help="share of the fleet's capacity offered")
    parser.add_argument("--duration-s", type=float, default=720.0,
                        help="the run's arrivals span: the trace's first requests that fill it at the offered rate")
    parser.add_argument("--interruptions", type=int, default=2)
    parser.add_argument("--replacement-s", type=float, default=REPLACEMENT_S)
    parser.add_argument("--seeds", default="0,1,2", help="notice draws: the first's runs in full, each one's "
                                                          "share of requests within the SLO")
    parser.add_argument("--trace", type=Path, default=SPLITWISE)
    parser.add_argument("--out", default="benchmarks/results/fleetsim_spot")
    args = parser.parse_args(argv)
    engine = PUBLISHED[args.engine]
    config = fleet_config(SYSTEMS["app"])
    if args.duration_s <= NOTICE_S:
        parser.error(f"--duration-s must exceed the {NOTICE_S:g} s notice")
    capacity = args.replicas * replica_capacity(args.engine)
    rate = args.load * capacity
    requests = at_load(splitwise_requests(args.trace)[:round(rate * args.duration_s)], rate)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    by_seed = {}
    for seed in seeds:
        events = interruptions(args.interruptions, args.duration_s, seed)
        print(f"[spot] {args.replicas} x {args.engine}: capacity {capacity:.1f} req/s, offered {args.load:g} of it; "
              f"seed {seed}: notices at {', '.join(f'{e.notice_s:.0f}s' for e in events)}", flush=True)
        runs = {}
        for name, system in SPOT_SYSTEMS.items():
            runs[name] = r = run(config, system, engine, args.replicas, requests, events, args.replacement_s)
            print(f"[spot] {name:22} failed {r['failed']}, streams broken {r['streams_broken']}, within the SLO "
                  f"{r['good_requests']}/{r['requests']}, E2E p99 {r['e2el_s']['p99']:.2f}s", flush=True)
        by_seed[seed] = (events, runs)
    events, results = by_seed[seeds[0]]
    chunk = config.models[0].engine.max_num_batched_tokens or config.models[0].engine.max_model_len
    tolls = {name: toll(results[name], results["on-demand"], args.interruptions, engine, args.replicas, chunk)
             for name, system in SPOT_SYSTEMS.items() if system.interrupted}
    price = gpu_hour_price(engine)
    instance = load_price_book().instances[price["instance_type"]]
    od_usd_per_1m = args.replicas * price["usd_per_gpu_hour"] / 3600 / results["on-demand"]["output_throughput"] * 1e6
    result = {
        "benchmark": "fleetsim_spot", "projected": True, "command": command_line(),
        "engine": {"name": args.engine, "source": engine.step_time.source, "kv_cache_tokens": engine.kv_cache_tokens},
        "replicas": args.replicas, "capacity_req_per_s": capacity, "load": args.load,
        "trace": {"file": "../shared/traces/splitwise_conv.csv", "requests": len(requests),
                  "from": "its first requests, their arrivals time-scaled to the offered rate",
                  "arrivals_span_s": args.duration_s},
        "capacity_source": f"{ROUTING[args.engine].relative_to(REPO)}: its closed-loop capacity per replica",
        "interruptions": [asdict(e) for e in events], "notice_s": NOTICE_S, "seeds": seeds,
        "within_slo_by_seed": {str(seed): {"notices_s": [e.notice_s for e in events_],
                                           **{name: r["good_requests"] / r["requests"] for name, r in runs.items()}}
                               for seed, (events_, runs) in by_seed.items()},
        "replacement_s": args.replacement_s, "replacement_basis": "assumed" if args.replacement_s == REPLACEMENT_S
        else "operator input", "slo": vars(SLO), "results": results, "per_interruption": tolls,
        "price": {**price, "spot_usd_per_hour": instance.spot.hourly_usd, "od_usd_per_hour": instance.on_demand.hourly_usd,
                  "spot_as_of": instance.spot.as_of, "spot_source": instance.spot.source},
        "on_demand_usd_per_1m_output_tokens": round(od_usd_per_1m, 4),
        "spot_advisor": advisor_costs(tolls, args.replacement_s, instance.spot.hourly_usd,
                                      instance.on_demand.hourly_usd, od_usd_per_1m),
        "factors": {"spot_lost_work_s": {
            "value": tolls["spot-resume"]["lost_work_replica_s"], "metric": "replica_s_lost_per_interruption",
            "basis": "simulated", "definition": "the app's drain and resume: tokens computed again per interruption "
            "over the uninterrupted run, in replica-seconds", "measured_on": f"simulated: {args.replicas} x "
            f"{engine.gpu}, step time from {engine.step_time.source}", "hardware": {"kind": "gpu", "model": engine.gpu},
            "command": command_line(), "runs": 1, "calibration_error": calibration_error(),
            "assumption": f"the GPU step time is the published source's; decode costs the run's replica-seconds per "
                          f"decoded token, prefill a full chunk's pace; calibration error from {VALIDATION.name}"}},
    }
    settings = {name: {"interrupted": system.interrupted, "drain_before_node_goes_s": system.drain_before_s,
                       "broken_streams": "resume" if system.resumable else "client sends again",
                       "dtype": "bfloat16 (the published coefficients')"}
                for name, system in SPOT_SYSTEMS.items()}
    write_json(Path(f"{args.out}.json"), result, settings)
    plot(result, Path(f"{args.out}.png"))
    return result


def replica_capacity(engine: str) -> float:
    """One replica's req/s with every slot busy, as the routing projection of the
    same engine calibrated it (its fleet's closed-loop capacity over its replicas)."""
    if engine not in ROUTING or not ROUTING[engine].exists():
        raise SystemExit(f"no routing projection of {engine}: run `python -m benchmarks.fleetsim.project "
                         f"--engine {engine}` first")
    routing = json.loads(ROUTING[engine].read_text())
    return routing["capacity_req_per_s"] / routing["replicas"]


def plot(result: dict[str, Any], path: Path) -> None:
    from benchmarks.plots import pyplot

    plt = pyplot()
    fig, (latency, cost) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(result["results"])
    latency.bar(names, [result["results"][n]["e2el_s"]["p99"] for n in names])
    latency.set(ylabel="E2E p99 (s)", title=f"{len(result['interruptions'])} interruptions in "
                                            f"{result['trace']['arrivals_span_s']:.0f} s (projected)")
    buckets = list(result["spot_advisor"])
    for name in result["per_interruption"]:
        cost.plot(buckets, [result["spot_advisor"][b][name]["usd_per_1m_output_tokens"] for b in buckets],
                  marker="o", label=name)
    cost.axhline(result["on_demand_usd_per_1m_output_tokens"], color="black", linestyle="--", label="on-demand")
    cost.set(xlabel="Spot Advisor interruption frequency", ylabel="USD per 1M output tokens", title="cost")
    cost.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
