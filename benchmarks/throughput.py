"""Closed-loop throughput: this app (length-aware and not), vLLM's own server on
the same engine flags and dtype, optionally the INT8 app and INT8 vLLM, in one
invocation. Systems run one at a time; `--repeats` are interleaved (app,
nobuckets, vllm, app, nobuckets, vllm, ...), each repeat a fresh server.

    .venv/bin/python benchmarks/throughput.py                      # app, nobuckets, vllm x 3
    .venv/bin/python benchmarks/throughput.py --systems app,nobuckets,vllm,int8,vllm-int8

Per run: `--requests` streamed chat completions (`--max-tokens`, ignore_eos,
greedy), `--concurrency` in flight; metrics as `vllm bench serve` defines them
(TTFT, TPOT, ITL, E2EL, throughput over the run), start-to-ready seconds, and
CPU-seconds per 1k output tokens per process group over the load phase. A run
whose client was starved (event-loop lag p99 or client CPU share over the
limits) is marked invalid and left out of the medians. The first repeat also
records answers to a fixed question set and, for `--curve-systems`, a load
curve. Writes benchmarks/results/throughput.{json,png} (cost planner input),
the JSON with its provenance and the settings that differ between systems.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import cpu_accounting as cpu  # noqa: E402
from benchmarks import quality  # noqa: E402
from benchmarks.client import LoopLag, Progress, StreamSender, add_client_options, closed_loop, realtime_client  # noqa: E402
from benchmarks.common import TOPICS  # noqa: E402
from benchmarks.metrics import Slo, summarize  # noqa: E402
from benchmarks.plots import throughput_plot  # noqa: E402
from benchmarks.provenance import command_line, machine  # noqa: E402
from benchmarks.report import fmt, validity, write_json  # noqa: E402
from benchmarks.servers import LocalServer  # noqa: E402
from benchmarks.settings import settings_table  # noqa: E402
from benchmarks.systems import System, choose, registry, server_command, server_pid  # noqa: E402
from benchmarks.throughput_report import (  # noqa: E402
    answers_block,
    comparisons,
    invalid_runs,
    print_summary,
    quantization_factor,
    result_entry,
)

SYSTEMS = ("app", "nobuckets", "vllm", "vllm-si1", "int8", "vllm-int8")


def body(model: str, index: int, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[index % len(TOPICS)]}."}]}


async def load_curve(sender: StreamSender, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A short closed-loop run per `--curve-concurrencies` point (`--curve-rounds` requests per stream)."""
    points = []
    for concurrency in sorted(set(args.curve_concurrencies) - {args.concurrency}):
        count = concurrency * args.curve_rounds
        progress = Progress(f"curve c={concurrency}", count, args.progress_s)
        duration, records = await closed_loop(lambda i, origin: sender.send(body(model, i, args.max_tokens), origin),
                                              count, concurrency, progress)
        summary = summarize(records, duration)
        print(f"  load curve: {concurrency} concurrent -> {summary['output_throughput']:.1f} tok/s", flush=True)
        points.append({"concurrency": concurrency, "output_tok_per_s": summary["output_throughput"],
                       "requests": count, "failed": summary["failed"]})
    return points


async def load_phase(server: LocalServer, system: System, args: argparse.Namespace, first: bool) -> dict[str, Any]:
    """Warm up, then the measured closed loop with CPU snapshots around it and the
    client's loop lag during it; on the first repeat answers and the load curve."""
    sender = StreamSender(server.base_url, args.timeout_s, args.api_key)
    model = server.model_name
    try:
        # the measured requests' own shape: 16-token warm-ups made a length-aware app
        # hold a reserve for short requests through the first 10 s of the run
        warm = await asyncio.gather(*(sender.send(body(model, i, args.max_tokens)) for i in range(args.warmup)))
        roots = [pid for pid in [server_pid(server)] if pid is not None]
        before = cpu.snapshot(roots)
        lag = LoopLag()
        lag.start()
        progress = Progress(system.name, args.requests, args.progress_s)
        duration, records = await closed_loop(lambda i, origin: sender.send(body(model, i, args.max_tokens), origin),
                                              args.requests, args.concurrency, progress)
        loop_lag = lag.stop()
        after = cpu.snapshot(roots)
        summary = summarize(records, duration, Slo(args.slo_ttft_s, args.slo_tpot_s, args.slo_e2el_s))
        usage = cpu.window_report(before, after, summary["output_tokens"], duration)
        run = {"summary": summary, "loop_lag_s": loop_lag, "cpu": usage,
               "warmup_failed": sum(not r.ok for r in warm),
               "validity": validity({"loop_lag_p99_s": (loop_lag["p99"], args.max_lag_p99_s),
                                     "client_machine_share": (usage["client_machine_share"], args.max_client_share)})}
        if first and args.quality:
            run["answers"] = await quality.answers(sender, model)
        if first and system.name in args.curve_systems:
            run["load_curve"] = await load_curve(sender, model, args)
        return run
    finally:
        await sender.close()


def measure(system: System, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """Start the system, run the load phase, stop it; a start failure is recorded, not raised."""
    server = system.make()
    tag = f"[{system.name} {repeat}/{args.repeats}]"
    print(f"{tag} starting {server.label} (log: {server.log_path})", flush=True)
    try:
        ready_s = server.start()
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        print(f"{tag} FAILED to start: {str(exc)[:500]}", flush=True)
        return {"repeat": repeat, "error": str(exc)[-4000:], "log": str(server.log_path)}
    print(f"{tag} ready after {ready_s:.1f}s; {args.requests} requests x {args.max_tokens} tokens, "
          f"{args.concurrency} concurrent", flush=True)
    try:
        with realtime_client(args.realtime_client) as realtime:
            run = asyncio.run(load_phase(server, system, args, first=repeat == 1))
    finally:
        server.stop()
    run.update(repeat=repeat, ready_s=ready_s, realtime_client=realtime, command=server_command(server))
    s = run["summary"]
    print(f"{tag} {fmt(s['output_throughput'])} tok/s, TTFT p50 {fmt(s['ttft_s']['p50'])}s, TPOT p50 "
          f"{fmt(s['tpot_s']['p50'])}s, failed {s['failed']}, loop lag p99 {fmt(run['loop_lag_s']['p99'])}s, "
          f"client CPU {fmt(run['cpu']['client_machine_share'])} of the machine: "
          f"{'valid' if run['validity']['valid'] else 'INVALID ' + '; '.join(run['validity']['reasons'])}",
          flush=True)
    return run


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml", help="this app, length-aware (`app`)")
    parser.add_argument("--nobuckets-config", default="configs/local-nobuckets.yaml", help="`nobuckets`")
    parser.add_argument("--int8-config", default="configs/local-int8.yaml", help="`int8` and `vllm-int8`")
    parser.add_argument("--systems", default="app,nobuckets,vllm", help=f"comma list of: {', '.join(SYSTEMS)}")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per system")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=4, help="requests like the measured ones before each measured run")
    parser.add_argument("--curve-concurrencies", type=ints, default=[1, 8],
                        help="load-curve points besides --concurrency (first repeat only)")
    parser.add_argument("--curve-rounds", type=int, default=2, help="requests per stream at each curve point")
    parser.add_argument("--curve-systems", type=lambda t: t.split(","), default=["app"])
    parser.add_argument("--quality", action=argparse.BooleanOptionalAction, default=True,
                        help=f"record greedy answers to {len(quality.QUESTIONS)} questions (first repeat)")
    parser.add_argument("--slo-ttft-s", type=float, help="goodput SLOs (optional)")
    parser.add_argument("--slo-tpot-s", type=float)
    parser.add_argument("--slo-e2el-s", type=float)
    parser.add_argument("--max-lag-p99-s", type=float, default=0.1, help="validity: client loop lag p99 limit")
    parser.add_argument("--max-client-share", type=float, default=0.1,
                        help="validity: the client's CPU share of the machine during the load phase")
    add_client_options(parser, progress_s=10.0)
    parser.add_argument("--out", default="benchmarks/results/throughput")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    try:
        systems = choose(registry(REPO, args.config, args.nobuckets_config, args.int8_config), args.systems, SYSTEMS)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    print(f"throughput: {', '.join(s.name for s in systems)} x {args.repeats} repeats (interleaved), "
          f"{args.requests} requests x {args.max_tokens} tokens, {args.concurrency} concurrent", flush=True)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for repeat in range(1, args.repeats + 1):
        for system in systems:
            runs[system.name].append(measure(system, args, repeat))

    results = {s.name: result_entry(s, runs[s.name], args.concurrency) for s in systems}
    ratios, targets = comparisons(results)
    workload = {"requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                "ignore_eos": True, "temperature": 0, "repeats": args.repeats, "order": "interleaved",
                "warmup_requests": args.warmup, "prompt": "Write a short story about <topic>.",
                "endpoint": "/v1/chat/completions (stream, include_usage)",
                "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_s, "e2el_s": args.slo_e2el_s}}
    bad = invalid_runs(runs)
    summary: dict[str, Any] = {
        "benchmark": "throughput", "config": args.config, "command": command_line(), "machine": machine(),
        "metrics": "as vllm bench serve (benchmarks/metrics.py); medians [min-max] over valid repeats",
        "workload": workload, "engine": systems[0].engine,
        "results": list(results.values()), "ratios": ratios, "targets": targets,
        "valid": not bad, "invalid_runs": bad, "answers": answers_block(systems, runs),
        "wall_s": time.monotonic() - started,
    }
    settings = {s.name: s.settings for s in systems}
    factor, why_not = quantization_factor(results, settings, workload, summary["command"])
    if factor:
        summary["factors"] = {"quantization": factor}
    elif any(entry.get("quantization") for entry in results.values()):
        summary["factors_not_emitted"] = {"quantization": why_not}
    out = REPO / args.out
    write_json(out.with_suffix(".json"), summary, settings)
    print(settings_table(settings))
    throughput_plot(summary["results"], out.with_suffix(".png"),
                    f"{args.requests} req x {args.max_tokens} tok, {args.concurrency} concurrent, "
                    f"median [min-max] of {args.repeats}")
    print_summary(summary)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    complete = all(r["measured_runs"] == r["repeats"] and r["failed"] == 0 for r in summary["results"])
    return 0 if complete and summary["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
