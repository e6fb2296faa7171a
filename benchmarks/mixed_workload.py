"""Mixed workload, open loop: a seeded Poisson stream of short answers, lists of
facts and long stories, sent identically to every system in one invocation:
vLLM's server FCFS (`vllm`) and with priority from the true class
(`vllm-priority`), Ray Serve LLM (`rayllm`), this app without length awareness
(`nobuckets`) and with it (`app`); same engine flags, dtype and machine.

    .venv/bin/python benchmarks/mixed_workload.py                     # reduced default
    .venv/bin/python benchmarks/mixed_workload.py --requests 1250 --repeats 3   # full protocol

vLLM FCFS's capacity is calibrated first (closed loop on the mix), then each
`--loads` point offers that share of it. Systems run one at a time, repeats
interleaved; by default one server start serves all load points of a repeat
(`--restart-per-point` starts one per point). A run whose client sent late
(send lag p99 >= `--max-send-lag-p99-s`) is invalid: kept, excluded from the
medians, reported. Writes benchmarks/results/mixed_workload.{json,png}, the
JSON with its provenance, each system's capacity at the goodput SLO, and the
settings that differ between systems.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import cpu_accounting as cpu  # noqa: E402
from benchmarks import mixed_report as mr  # noqa: E402
from benchmarks.client import LoopLag, Progress, StreamSender, closed_loop, open_loop, realtime_client  # noqa: E402
from benchmarks.metrics import distribution  # noqa: E402
from benchmarks.mixed_setup import Plans, body, parse_args, prepare, session_order  # noqa: E402
from benchmarks.plots import mixed_plot  # noqa: E402
from benchmarks.predictor_replay import replay, report  # noqa: E402
from benchmarks.provenance import command_line, machine  # noqa: E402
from benchmarks.report import fmt, validity, write_json  # noqa: E402
from benchmarks.servers import LocalServer  # noqa: E402
from benchmarks.settings import settings_table  # noqa: E402
from benchmarks.systems import System, server_command, server_pid  # noqa: E402
from benchmarks.workload import generate, mean_output_tokens, saturated_output_tok_per_s  # noqa: E402


async def calibrate(server: LocalServer, system: System, plans: Plans, args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop of the mix on `server`: saturated output tok/s over the mix's
    mean output tokens per request is its capacity in requests/s."""
    plan = generate(plans.spec.model_copy(update={"requests": args.calibration_requests}))
    sender = StreamSender(server.base_url, args.timeout_s, args.api_key)
    try:
        progress = Progress("calibration", len(plan), args.progress_s)
        duration, records = await closed_loop(
            lambda i, origin: sender.send(body(system, plan[i], server.model_name, plans.use_template), origin),
            len(plan), args.calibration_concurrency, progress)
    finally:
        await sender.close()
    for planned, record in zip(plan, records, strict=True):
        record.kind = planned.kind
    tok_s = saturated_output_tok_per_s(records)
    tokens = mean_output_tokens(records, plans.spec.shares())
    return {"requests": len(plan), "concurrency": args.calibration_concurrency, "duration_s": duration,
            "failed": sum(not r.ok for r in records), "saturated_output_tok_per_s": tok_s,
            "mean_output_tokens": tokens, "capacity_req_per_s": tok_s / tokens}


async def run_point(server: LocalServer, system: System, plans: Plans, load: float,
                    args: argparse.Namespace) -> tuple[dict[str, Any], tuple[list, list]]:
    """One load point: the plan sent at its arrival times; metrics per class."""
    plan = plans.at(load)
    sender = StreamSender(server.base_url, args.timeout_s, args.api_key)
    roots = [pid for pid in [server_pid(server)] if pid is not None]
    try:
        before = cpu.snapshot(roots)
        lag = LoopLag()
        lag.start()
        progress = Progress(f"{system.name} load {load}", len(plan), args.progress_s)
        duration, records, lags = await open_loop(
            lambda i, origin: sender.send(body(system, plan[i], server.model_name, plans.use_template), origin),
            [p.arrival_s for p in plan], progress)
        loop_lag = lag.stop()
        after = cpu.snapshot(roots)
    finally:
        await sender.close()
    for planned, record in zip(plan, records, strict=True):
        record.kind = planned.kind
    classes = mr.class_summaries(records, duration, mr.slo_for(args))
    send_lag = {**distribution(lags), "max": max(lags)}
    run = {"rate_per_s": plans.rate(load), "duration_s": duration, "requests": len(plan),
           "short_requests": sum(p.kind == "short" for p in plan), "classes": classes,
           "send_lag_s": send_lag, "loop_lag_s": loop_lag,
           "cpu": cpu.window_report(before, after, classes["all"]["output_tokens"], duration),
           "validity": validity({"send_lag_p99_s": (send_lag["p99"], args.max_send_lag_p99_s)})}
    if args.keep_records:
        run["records"] = {"columns": mr.RECORD_COLUMNS, "rows": mr.compact(plan, records)}
    return run, (plan, records)


def app_stats(server: LocalServer) -> dict[str, Any] | None:
    """This app's `/stats` (its predictor's classes), for the record."""
    try:
        return httpx.get(server.base_url.removesuffix("/v1") + "/stats", timeout=10, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None


def session(system: System, loads: list[float], repeat: int, index: int, plans: Plans,
            args: argparse.Namespace) -> tuple[list[dict[str, Any]], list]:
    """Start `system`, (calibrate,) run each load point, stop. Returns its runs
    and, per point, the (plan, records) pairs for the predictor replay."""
    if plans.capacity is None and system.name != "vllm":
        raise SystemExit("calibration runs on `vllm` and it did not start; give --capacity-req-s to go on")
    server = system.make()
    tag = f"[{system.name} repeat {repeat}]"
    print(f"{tag} starting {server.label} for loads {loads} (log: {server.log_path})", flush=True)
    base = {"system": system.name, "repeat": repeat, "session": index}
    try:
        ready_s = server.start()
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        print(f"{tag} FAILED to start: {str(exc)[:500]}", flush=True)
        return [{**base, "load": load, "error": str(exc)[-4000:]} for load in loads], []
    print(f"{tag} ready after {ready_s:.1f}s", flush=True)
    runs, pairs = [], []
    try:
        with realtime_client(args.realtime_client) as realtime:
            asyncio.run(_warm_up(server, args))
            if plans.capacity is None:
                plans.calibration = asyncio.run(calibrate(server, system, plans, args))
                plans.capacity = plans.calibration["capacity_req_per_s"]
                print(f"calibrated: {fmt(plans.calibration['saturated_output_tok_per_s'])} tok/s saturated, "
                      f"{fmt(plans.calibration['mean_output_tokens'])} tokens/request -> capacity "
                      f"{fmt(plans.capacity)} req/s", flush=True)
            for load in loads:
                time.sleep(args.settle_s)
                print(f"{tag} load {load}: {plans.spec.requests} requests at {fmt(plans.rate(load))} req/s "
                      f"(~{plans.spec.requests / plans.rate(load):.0f}s)", flush=True)
                run, pair = asyncio.run(run_point(server, system, plans, load, args))
                runs.append({**base, "load": load, "ready_s": ready_s, "realtime_client": realtime, **run})
                pairs.append(pair)
                a, v = run["classes"], run["validity"]
                print(f"{tag} load {load}: short E2EL p99 {fmt(a['short']['e2el_s']['p99'])}s, short TTFT p99 "
                      f"{fmt(a['short']['ttft_s']['p99'])}s, long E2EL p50 {fmt(a['long']['e2el_s']['p50'])}s, "
                      f"{fmt(a['all']['output_throughput'])} tok/s, failed {a['all']['failed']}, send lag p99 "
                      f"{fmt(run['send_lag_s']['p99'])}s: {'valid' if v['valid'] else 'INVALID'}", flush=True)
            stats = app_stats(server) if system.uses_template else None
    finally:
        server.stop()
    for run in runs:
        run["command"] = server_command(server)
    if runs and stats is not None:
        runs[-1]["app_stats_at_end"] = stats  # the predictor's classes after the session's last point
    return runs, pairs


async def _warm_up(server: LocalServer, args: argparse.Namespace) -> None:
    """Two tiny requests in a prompt class of their own (not the workload's)."""
    sender = StreamSender(server.base_url, args.timeout_s, args.api_key)
    body_ = {"model": server.model_name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    try:
        await asyncio.gather(sender.send(body_), sender.send(body_))
    finally:
        await sender.close()


def main() -> int:
    args = parse_args(__doc__)
    systems, plans, app = prepare(REPO, args)
    order = session_order(systems, args)
    print(plans.describe(args, len(order)), flush=True)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    replays: list = []
    for index, (repeat, system, loads) in enumerate(order):
        session_runs, pairs = session(system, loads, repeat, index, plans, args)
        runs += session_runs
        if system.name == "app" and pairs:
            labels = [f"session {index} load {r['load']}" for r in session_runs]
            replays += replay(pairs, app.ingress.predictor, plans.use_template, labels)
    stats = mr.aggregate(runs)
    ratios = mr.ratios_to_baseline(stats)
    targets = mr.targets_at(stats, args.target_load)
    host = machine()
    command = command_line()
    summary: dict[str, Any] = {
        "benchmark": "mixed_workload", "command": command, "machine": host,
        "metrics": "as vllm bench serve (benchmarks/metrics.py), per class; medians [min-max] over valid repeats",
        "systems": {s.name: {"description": s.description, "engine": s.engine} for s in systems},
        "workload": plans.workload_json(args), "calibration": plans.calibration,
        "stats": stats, f"ratios_to_{mr.BASELINE}": ratios, "targets": targets,
        "valid": all(r.get("validity", {}).get("valid", False) for r in runs),
        "invalid_runs": [{k: r[k] for k in ("system", "load", "repeat")} | {"reasons": r["validity"]["reasons"]}
                         for r in runs if "error" not in r and not r["validity"]["valid"]],
        "predictor": {**report(replays, app.models[0].length_scheduling.long_tokens),
                      "requests": [vars(item) for item in replays]} if replays else None,
        "runs": runs, "wall_s": time.monotonic() - started,
    }
    capacity = mr.capacity_at_slo(stats, {load: plans.rate(load) for load in plans.loads}, args.goodput_goal)
    summary["capacity_at_slo"] = {"goodput_goal": args.goodput_goal, "slo": plans.slo_line(args), "systems": capacity}
    factor, why_not = mr.length_scheduling_factor(capacity, args.goodput_goal, plans.slo_line(args), command,
                                                  plans.spec.requests, args.repeats)
    if factor:
        summary["factors"] = {"length_scheduling": factor}
    else:
        summary["factors_not_emitted"] = {"length_scheduling": why_not}
    settings = {s.name: s.settings for s in systems}
    out = REPO / args.out
    write_json(out.with_suffix(".json"), summary, settings)
    print(settings_table(settings))
    mixed_plot({s: {load: p["figures"] for load, p in by_load.items()} for s, by_load in stats.items()},
               out.with_suffix(".png"), plans.title(args))
    mr.print_tables(stats, ratios, targets, plans.slo_line(args))
    if summary["predictor"]:
        overall = summary["predictor"]["overall"]
        print(f"predictor (replayed, app): bucket accuracy {fmt(overall['bucket_accuracy'])}, MAE "
              f"{fmt(overall['mae_tokens'])} tokens over {overall['requests']} requests; " + ", ".join(
                  f"{kind} {fmt(c['bucket_accuracy'])} / {fmt(c['mae_tokens'])} (true p50 {fmt(c.get('true_tokens_p50'))})"
                  for kind, c in summary["predictor"]["by_class"].items()))
    print(plans.short_line(args))
    print("capacity at the SLO (req/s): " + ", ".join(
        f"{name} {fmt(c['capacity_req_per_s'])}{'' if c['bracketed'] else ' (not bracketed)'}"
        for name, c in capacity.items()))
    print(f"length_scheduling factor: {fmt(factor['value']) if factor else 'not emitted: ' + why_not}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0 if summary["valid"] and all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
