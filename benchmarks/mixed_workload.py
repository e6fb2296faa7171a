"""Mixed workload: 80% short answers, 20% long stories, Poisson arrivals near
saturation, sent to each system in turn (one at a time; each is stopped before the
next starts): this app with length buckets, this app without them, `vllm serve`
and Ray Serve LLM, on the same model, engine settings and machine.

    python benchmarks/mixed_workload.py --requests 300 --calibrate
    python benchmarks/mixed_workload.py --systems vllm,rayllm --requests 24 --rate 2

Every system gets the same seeded request sequence as streamed chat completions
(greedy). Per request: TTFT, latency, output tokens, class and status (429/503
and other failures are counted, never dropped). Writes per system and class
throughput, p50/p99 latency and TTFT, error counts and ratios to `vllm serve`
(default: results/mixed_workload.{json,png}).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import percentile  # noqa: E402
from benchmarks.ray_serve_llm_app import RayServeLLMServer  # noqa: E402
from benchmarks.servers import LocalServer, ServeRunServer, VLLMServer  # noqa: E402
from benchmarks.workload import (  # noqa: E402
    ClassStats,
    Outcome,
    PlannedRequest,
    WorkloadSpec,
    generate,
    mean_output_tokens,
    ratios_by_class,
    saturated_output_tok_per_s,
    stats_by_class,
)
from serve_app.config import AppConfig, app_configs, load_serve_config  # noqa: E402

SYSTEMS = ("app", "nobuckets", "vllm", "rayllm")
BASELINE = "vllm"
SHORT_TEMPLATE = "capital"
COLORS = {"app": "tab:blue", "nobuckets": "tab:cyan", "vllm": "tab:gray", "rayllm": "tab:orange"}


class Sender:
    """Sends planned requests to one server as streamed chat completions.

    The official client makes the request and raises its errors; the SSE lines
    are read here: the client's own parsing costs ~260 us of CPU per chunk
    (`json.loads` ~4 us), and on 2 busy cores that stalled this event loop for
    seconds against Ray Serve LLM, sending every later request late."""

    def __init__(self, server: LocalServer, args: argparse.Namespace, use_template: bool) -> None:
        self.client = openai.AsyncOpenAI(base_url=server.base_url, api_key=args.api_key, max_retries=0,
                                         timeout=args.timeout_s)
        self.model = server.model_name
        self.use_template = use_template

    def body(self, planned: PlannedRequest) -> dict[str, Any]:
        extra: dict[str, Any] = {"ignore_eos": planned.ignore_eos}
        if self.use_template and planned.kind == "short":
            messages: list[dict[str, str]] = []
            extra |= {"template": SHORT_TEMPLATE, "params": planned.params}
        else:
            messages = [{"role": "user", "content": planned.prompt}]
        return {"model": self.model, "messages": messages, "max_tokens": planned.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, "extra_body": extra}

    async def send(self, planned: PlannedRequest, run_started: float) -> Outcome:
        started = time.perf_counter()
        failed = {"index": planned.index, "kind": planned.kind, "sent_s": round(started - run_started, 3)}
        first_token_at, tokens = None, None
        try:
            async with self.client.chat.completions.with_streaming_response.create(**self.body(planned)) as response:
                async for line in response.iter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data:"):])
                    if chunk.get("error"):  # an SSE error event in the middle of the stream
                        return Outcome(status="stream_error", **failed)
                    deltas = [choice.get("delta") or {} for choice in chunk.get("choices", [])]
                    if first_token_at is None and any(delta.get("content") for delta in deltas):
                        first_token_at = time.perf_counter()
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
        except openai.APIStatusError as exc:
            return Outcome(status=str(exc.status_code), retry_after=exc.response.headers.get("retry-after"), **failed)
        except (openai.APITimeoutError, httpx.TimeoutException):
            return Outcome(status="timeout", **failed)
        except (openai.APIConnectionError, httpx.TransportError):  # also a connection lost mid-stream
            return Outcome(status="connection_error", **failed)
        except json.JSONDecodeError:
            return Outcome(status="bad_stream", **failed)
        finished = time.perf_counter()
        if tokens is None:
            return Outcome(status="no_usage", **failed)
        return Outcome(status="ok", latency_s=round(finished - started, 3),
                       ttft_s=round((first_token_at or finished) - started, 3), output_tokens=tokens, **failed)


async def drive(name: str, sender: Sender, plan: list[PlannedRequest], progress_s: float,
                concurrency: int | None = None) -> tuple[float, list[Outcome]]:
    """Send `plan` at its arrival times (or closed-loop, `concurrency` at a time);
    return the run's wall time and each request's outcome, in plan order."""
    warm_up = [p for p in plan if p.kind == "short"][:2]
    await asyncio.gather(*(sender.send(replace(p, max_tokens=8), time.perf_counter()) for p in warm_up))
    gate = asyncio.Semaphore(concurrency or len(plan))
    counts: Counter[str] = Counter()
    started = time.perf_counter()

    async def one(planned: PlannedRequest) -> Outcome:
        if concurrency is None:
            await asyncio.sleep(max(0.0, started + planned.arrival_s - time.perf_counter()))
        async with gate:
            counts["sent"] += 1
            outcome = await sender.send(planned, started)
        counts["done"] += 1
        counts["ok" if outcome.status == "ok" else "failed"] += 1
        return outcome

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_s)
            print(f"  [{name}] {time.perf_counter() - started:5.0f}s: sent {counts['sent']}/{len(plan)}, "
                  f"done {counts['done']} (ok {counts['ok']}, failed {counts['failed']}), "
                  f"in flight {counts['sent'] - counts['done']}", flush=True)

    reporter = asyncio.create_task(report())
    try:
        outcomes = await asyncio.gather(*(one(p) for p in plan))
    finally:
        reporter.cancel()
        await sender.client.close()
    return time.perf_counter() - started, list(outcomes)


@contextlib.contextmanager
def realtime_client(enabled: bool) -> Iterator[None]:
    """Run the calling thread (the client's event loop) as SCHED_FIFO meanwhile.

    On 2 cores the servers' busy threads kept this thread waiting runnable for
    seconds (schedstat), even at nice -5: requests went out up to 15 s late and
    TTFTs read 16 s where they were 0.1 s. The client needs ~2% of a core, so
    a real-time policy costs the servers nothing measurable (and the kernel's
    RT throttling bounds it). Linux sets it per thread and children inherit it
    at spawn, so servers started before or after keep the default policy."""
    if enabled:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            print("note: no permission for SCHED_FIFO; the client may be starved of CPU", flush=True)
            enabled = False
    try:
        yield
    finally:
        if enabled:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def measure(name: str, server: LocalServer, plan: list[PlannedRequest], args: argparse.Namespace,
            use_template: bool = False, concurrency: int | None = None) -> dict[str, Any]:
    """Start `server`, run `plan` on it, stop it; a system that fails to start is
    reported with its error instead of results."""
    print(f"[{name}] starting {server.label} (log: {server.log_path})", flush=True)
    try:
        startup = server.start()
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        print(f"[{name}] FAILED to start: {str(exc)[:500]}", flush=True)
        return {"error": str(exc)[-4000:], "log": str(server.log_path)}
    mode = f"closed loop, {concurrency} at a time" if concurrency else "at the planned arrival times"
    print(f"[{name}] answering after {startup:.0f}s; sending {len(plan)} requests {mode}", flush=True)
    try:
        with realtime_client(args.realtime_client):
            wall, outcomes = asyncio.run(drive(name, Sender(server, args, use_template), plan, args.progress_s,
                                               concurrency))
    finally:
        stopping = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - stopping
    # How late the client sent requests: large values mean it was starved of CPU
    # and its timings are not the server's.
    lags = [o.sent_s - p.arrival_s for o, p in zip(outcomes, plan, strict=True)] if concurrency is None else [0.0]
    print(f"[{name}] done in {wall:.0f}s, stopped in {stop_s:.0f}s; send lag max {max(lags):.2f}s", flush=True)
    return {"startup_s": round(startup, 1), "stop_s": round(stop_s, 1), "wall_s": round(wall, 2),
            "send_lag_p99_s": round(percentile(lags, 99), 3), "send_lag_max_s": round(max(lags), 3),
            "classes": stats_by_class(outcomes, wall), "outcomes": outcomes}


def calibrate(model_server: Callable[[], LocalServer], spec: WorkloadSpec, args: argparse.Namespace,
              concurrency: int) -> dict[str, Any]:
    """Closed-loop run of the workload's first requests on `vllm serve`: its
    saturated output tok/s over the mix's mean output tokens per request, times
    `--load`, is the arrival rate."""
    plan = generate(spec.model_copy(update={"requests": args.calibration_requests}))
    result = measure("calibration", model_server(), plan, args, concurrency=concurrency)
    if "error" in result:
        raise SystemExit(f"calibration failed: {result['error']}")
    tok_per_s = saturated_output_tok_per_s(result["outcomes"])
    tokens = mean_output_tokens(result["outcomes"], spec.short_share)
    return {"requests": len(plan), "concurrency": concurrency, "wall_s": result["wall_s"],
            "saturated_output_tok_per_s": round(tok_per_s, 1), "mean_output_tokens": round(tokens, 1),
            "saturation_req_per_s": round(tok_per_s / tokens, 3),
            "rate_per_s": round(args.load * tok_per_s / tokens, 3)}


def jsonable(result: dict[str, Any]) -> dict[str, Any]:
    """A `measure` result with its statistics and outcomes as plain dicts."""
    if "classes" not in result:
        return result
    return {**result, "classes": {kind: asdict(s) for kind, s in result["classes"].items()},
            "outcomes": [asdict(o) for o in result["outcomes"]]}


def short_template_prompt(app: AppConfig) -> str | None:
    """The `capital` template's text when it can stand in for the short prompt
    (one `{country}` param, no system message), else None."""
    template = app.templates.get(SHORT_TEMPLATE)
    if template is None or template.system is not None:
        return None
    return template.prompt if "{country}" in template.prompt else None


def plot(systems: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name, result in systems.items() if "classes" in result]
    panels = [("short", "latency_p99_s", "short requests: p99 latency (s)"),
              ("short", "ttft_p99_s", "short requests: p99 TTFT (s)"),
              ("all", "output_tok_per_s", "total output tokens/s (higher is better)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (kind, metric, label) in zip(axes, panels, strict=True):
        values = [getattr(systems[name]["classes"][kind], metric) or 0.0 for name in names]
        bars = ax.bar(names, values, color=[COLORS[name] for name in names])
        ax.bar_label(bars, fmt="%.0f" if kind == "all" else "%.2f")
        ax.set_title(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(systems: dict[str, dict[str, Any]], ratios: dict[str, dict[str, dict[str, float | None]]]) -> None:
    print(f"\n{'system':<11}{'class':<7}{'ok/sent':>9}{'tok/s':>8}{'req/s':>7}{'p50 s':>8}{'p99 s':>8}"
          f"{'ttft50':>8}{'ttft99':>8}  errors")
    for name, result in systems.items():
        if "classes" not in result:
            print(f"{name:<11}not measured: {result['error'].splitlines()[0][:80]}")
            continue
        for kind, s in result["classes"].items():
            cells = [s.latency_p50_s, s.latency_p99_s, s.ttft_p50_s, s.ttft_p99_s]
            print(f"{name:<11}{kind:<7}{f'{s.ok}/{s.requests}':>9}{s.output_tok_per_s:>8}{s.req_per_s:>7}"
                  + "".join(f"{'-' if c is None else c:>8}" for c in cells) + f"  {s.errors or ''}")
    for name, by_class in ratios.items():
        short, total = by_class["short"], by_class["all"]
        print(f"{name} / {BASELINE}: short p99 {short['latency_p99_s']}x, short ttft p99 {short['ttft_p99_s']}x, "
              f"total tok/s {total['output_tok_per_s']}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml", help="this app with length buckets")
    parser.add_argument("--nobuckets-config", default="configs/local-nobuckets.yaml",
                        help="this app with bucketing off (falls back to --config while it does not exist)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of: {', '.join(SYSTEMS)}")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short-share", type=float, default=0.8)
    parser.add_argument("--rate", type=float, help="arrivals per second (default: --calibrate, or an estimate)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure vllm serve's saturation on this workload first; rate = --load x that")
    parser.add_argument("--calibration-requests", type=int, default=128,
                        help="a few times max_num_seqs, so the saturated part of the run dominates")
    parser.add_argument("--load", type=float, default=0.9, help="share of saturation to offer")
    parser.add_argument("--capacity-tok-s", type=float, default=530.0,
                        help="vllm serve's output tok/s here, for the rate estimate without --calibrate")
    parser.add_argument("--templates", action=argparse.BooleanOptionalAction, default=True,
                        help=f"send short requests to this app as its {SHORT_TEMPLATE!r} template")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    parser.add_argument("--progress-s", type=float, default=10.0)
    parser.add_argument("--realtime-client", action=argparse.BooleanOptionalAction, default=True,
                        help="run the sending thread as SCHED_FIFO so busy servers cannot starve its "
                             "clock (servers keep the default policy)")
    parser.add_argument("--out", default="results/mixed_workload")
    args = parser.parse_args()

    chosen = args.systems.split(",")
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    config_path = REPO / args.config
    nobuckets_path = REPO / args.nobuckets_config
    if not nobuckets_path.exists():
        print(f"note: {args.nobuckets_config} does not exist; 'nobuckets' runs {args.config}")
        nobuckets_path = config_path
    app = next(iter(app_configs(load_serve_config(config_path)).values()))
    model = app.models[0]
    template_prompt = short_template_prompt(app)
    use_template = args.templates and template_prompt is not None
    servers: dict[str, Callable[[], LocalServer]] = {
        "app": lambda: ServeRunServer(config_path, cwd=REPO),
        "nobuckets": lambda: ServeRunServer(nobuckets_path, cwd=REPO),
        "vllm": lambda: VLLMServer(model, cwd=REPO),
        "rayllm": lambda: RayServeLLMServer(config_path, cwd=REPO),
    }

    spec = WorkloadSpec(requests=args.requests, rate_per_s=args.rate or 1.0, seed=args.seed,
                        short_share=args.short_share,
                        **({"short_prompt": template_prompt} if template_prompt else {}))
    calibration = None
    if args.rate:
        rate_source = "--rate"
    elif args.calibrate:
        calibration = calibrate(servers["vllm"], spec, args, concurrency=model.engine.max_num_seqs)
        spec, rate_source = spec.model_copy(update={"rate_per_s": calibration["rate_per_s"]}), "calibrated"
    else:
        rate = round(args.load * args.capacity_tok_s / spec.mean_max_tokens(), 3)
        spec, rate_source = spec.model_copy(update={"rate_per_s": rate}), "estimated from --capacity-tok-s"
    plan = generate(spec)
    print(f"workload: {len(plan)} requests ({sum(p.kind == 'short' for p in plan)} short), "
          f"{spec.rate_per_s} req/s ({rate_source}), seed {spec.seed}", flush=True)

    systems = {name: measure(name, servers[name](), plan, args, use_template and name in ("app", "nobuckets"))
               for name in chosen}
    measured: dict[str, dict[str, ClassStats]] = {n: r["classes"] for n, r in systems.items() if "classes" in r}
    ratios = ({name: ratios_by_class(stats, measured[BASELINE]) for name, stats in measured.items()
               if name != BASELINE} if BASELINE in measured else {})

    report = {
        "benchmark": "mixed_workload",
        "config": args.config,
        "nobuckets_config": str(nobuckets_path.relative_to(REPO)),
        "model": model.name,
        "engine": model.engine.model_dump(),
        "workload": {**spec.model_dump(), "rate_source": rate_source, "calibration": calibration,
                     "short_as_template": use_template, "temperature": 0,
                     "endpoint": "/v1/chat/completions (stream)"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "systems": {name: jsonable(result) for name, result in systems.items()},
        f"ratios_to_{BASELINE}": ratios,
    }
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(systems, out.with_suffix(".png"), f"{model.name}: {len(plan)} requests, {spec.short_share:.0%} short, "
         f"Poisson {spec.rate_per_s} req/s")
    print_table(systems, ratios)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0 if len(measured) == len(systems) else 1


if __name__ == "__main__":
    sys.exit(main())
