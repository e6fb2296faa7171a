"""The mixed-workload benchmark's options, systems, request bodies, plans per
load point and the order servers are started in."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.client import add_client_options
from benchmarks.systems import System, choose, first_app, registry
from benchmarks.workload import TRUE_PRIORITY, PlannedRequest, WorkloadSpec, generate
from serve_app.config import AppConfig

SYSTEMS = ("vllm", "vllm-priority", "rayllm", "nobuckets", "app")
SHORT_TEMPLATE = "capital"
SHORT_TARGET = 1000
"""Short requests per load point the issue's protocol asks for."""
START_S = 90.0
"""Rough seconds to start one system here (for the time estimate)."""


def body(system: System, planned: PlannedRequest, model: str, use_template: bool) -> dict[str, Any]:
    """The chat request `system` gets for `planned`: this app gets short ones as its
    `capital` template with params, others the rendered text; `vllm-priority`
    gets vLLM's `priority` from the true class."""
    result: dict[str, Any] = {"model": model, "max_tokens": planned.max_tokens, "temperature": 0,
                              "ignore_eos": planned.ignore_eos}
    if system.uses_template and use_template and planned.kind == "short":
        result |= {"messages": [], "template": SHORT_TEMPLATE, "params": planned.params}
    else:
        result["messages"] = [{"role": "user", "content": planned.prompt}]
    if system.true_priority:
        result["priority"] = TRUE_PRIORITY[planned.kind]
    return result


def short_template_prompt(app: AppConfig) -> str | None:
    """The `capital` template's text when it can stand in for the short prompt
    (one `{country}` param, no system message), else None."""
    template = app.templates.get(SHORT_TEMPLATE)
    if template is None or template.system is not None:
        return None
    return template.prompt if "{country}" in template.prompt else None


@dataclass
class Plans:
    """The request sequence, the same at every load point but for the arrival rate."""

    spec: WorkloadSpec
    use_template: bool
    loads: list[float]
    capacity: float | None
    """vLLM FCFS's capacity on this mix (requests/s); None until calibrated."""
    calibration: dict[str, Any] | None = None
    _cache: dict[float, list[PlannedRequest]] = field(default_factory=dict)

    def rate(self, load: float) -> float:
        if self.capacity is None:
            raise RuntimeError("capacity not calibrated yet")
        return load * self.capacity

    def at(self, load: float) -> list[PlannedRequest]:
        if load not in self._cache:
            self._cache[load] = generate(self.spec.model_copy(update={"rate_per_s": self.rate(load)}))
        return self._cache[load]

    def short_per_run(self) -> int:
        return sum(p.kind == "short" for p in generate(self.spec))

    def short_json(self, repeats: int) -> dict[str, Any]:
        short = self.short_per_run()
        return {"per_run": short, "per_point_over_repeats": short * repeats, "target": SHORT_TARGET,
                "met_per_run": short >= SHORT_TARGET, "met_over_repeats": short * repeats >= SHORT_TARGET}

    def short_line(self, args: argparse.Namespace) -> str:
        s = self.short_json(args.repeats)
        return (f"short requests per load point: {s['per_run']} per run, {s['per_point_over_repeats']} over "
                f"{args.repeats} repeat(s); the protocol asks >= {SHORT_TARGET}: "
                f"{'MET' if s['met_per_run'] else 'NOT MET'} per run, "
                f"{'met' if s['met_over_repeats'] else 'not met'} over repeats")

    def slo_line(self, args: argparse.Namespace) -> str:
        return (f"TTFT <= {args.slo_ttft_s}s, TPOT <= {args.slo_tpot_s}s (all), "
                f"E2EL <= {args.slo_e2el_short_s}s (short)")

    def describe(self, args: argparse.Namespace, sessions: int) -> str:
        counts = {k: sum(p.kind == k for p in generate(self.spec)) for k in ("short", "other", "long")}
        if self.capacity is None:
            rate_text, per_run = "capacity: calibrated on vllm first", "unknown until calibrated"
        else:
            rate_text = f"capacity {self.capacity} req/s (--capacity-req-s)"
            runs_s = sum(self.spec.requests / self.rate(load) for load in self.loads)
            total = sessions * START_S + args.repeats * len(args.systems.split(",")) * runs_s
            per_run = f"~{total / 3600:.1f} h in all"
        return "\n".join([
            f"mixed workload: systems {args.systems}; loads {self.loads}; {args.repeats} repeat(s), interleaved; "
            f"{sessions} server starts",
            f"each run: {self.spec.requests} requests ({counts}), seed {self.spec.seed}; {rate_text}; {per_run}",
            f"goodput SLOs: {self.slo_line(args)}; validity: send lag p99 < {args.max_send_lag_p99_s}s",
            self.short_line(args)])

    def workload_json(self, args: argparse.Namespace) -> dict[str, Any]:
        return {**self.spec.model_dump(exclude={"rate_per_s"}), "loads": self.loads, "repeats": args.repeats,
                "target_load": args.target_load, "capacity_req_per_s": self.capacity,
                "rate_per_s": {str(load): self.rate(load) for load in self.loads} if self.capacity else None,
                "short_as_template": self.use_template, "temperature": 0, "restart_per_point": args.restart_per_point,
                "endpoint": "/v1/chat/completions (stream, include_usage)", "short_requests": self.short_json(
                    args.repeats),
                "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_s, "e2el_short_s": args.slo_e2el_short_s},
                "true_priority": TRUE_PRIORITY}

    def title(self, args: argparse.Namespace) -> str:
        return (f"{self.spec.requests} requests/run ({self.spec.short_share:.0%} short), loads x "
                f"{self.capacity and round(self.capacity, 3)} req/s, median [min-max] of {args.repeats}")


def session_order(systems: list[System], args: argparse.Namespace) -> list[tuple[int, System, list[float]]]:
    """(repeat, system, loads) per server start. The baseline goes first in every
    round (it calibrates); repeats are interleaved over the systems."""
    ordered = sorted(systems, key=lambda s: s.name != "vllm")
    loads = parse_loads(args.loads)
    if args.restart_per_point:
        return [(r, s, [load]) for load in loads for r in range(1, args.repeats + 1) for s in ordered]
    return [(r, s, loads) for r in range(1, args.repeats + 1) for s in ordered]


def parse_loads(text: str) -> list[float]:
    return sorted({float(x) for x in text.split(",") if x.strip()})


def prepare(repo: Path, args: argparse.Namespace) -> tuple[list[System], Plans, AppConfig]:
    try:
        systems = choose(registry(repo, args.config, args.nobuckets_config, vllm_policy="fcfs"), args.systems,
                         SYSTEMS)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if args.capacity_req_s is None and not any(s.name == "vllm" for s in systems):
        raise SystemExit("calibration runs on `vllm`: include it in --systems or give --capacity-req-s")
    app = first_app(repo / args.config)
    template_prompt = short_template_prompt(app)
    spec = WorkloadSpec(requests=args.requests, rate_per_s=1.0, seed=args.seed, short_share=args.short_share,
                        other_share=args.other_share, **({"short_prompt": template_prompt} if template_prompt else {}))
    if args.calibration_concurrency is None:
        args.calibration_concurrency = app.models[0].engine.max_num_seqs
    plans = Plans(spec, args.templates and template_prompt is not None, parse_loads(args.loads), args.capacity_req_s)
    return systems, plans, app


def parse_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml", help="this app, length-aware (`app`)")
    parser.add_argument("--nobuckets-config", default="configs/local-nobuckets.yaml", help="`nobuckets`")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of: {', '.join(SYSTEMS)}")
    parser.add_argument("--loads", default="0.5,0.7,0.9,1.0", help="shares of vllm's calibrated capacity")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats per system and load")
    parser.add_argument("--requests", type=int, default=200,
                        help=f"per run; the protocol asks >= {SHORT_TARGET} short ones (1250 at 80%% short)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short-share", type=float, default=0.8)
    parser.add_argument("--other-share", type=float, default=0.1, help="lists of facts; the rest is long")
    parser.add_argument("--capacity-req-s", type=float, help="skip calibration: vllm FCFS's capacity on this mix")
    parser.add_argument("--calibration-requests", type=int, default=128)
    parser.add_argument("--calibration-concurrency", type=int, help="default: the engine's max_num_seqs")
    parser.add_argument("--target-load", type=float, default=0.9, help="load point of the targets and factor")
    parser.add_argument("--slo-ttft-s", type=float, default=1.0, help="goodput SLO, all requests")
    parser.add_argument("--slo-tpot-s", type=float, default=0.25, help="goodput SLO, all requests")
    parser.add_argument("--slo-e2el-short-s", type=float, default=5.0, help="goodput SLO, short requests")
    parser.add_argument("--goodput-goal", type=float, default=0.9,
                        help="capacity at the SLO: the highest offered rate whose goodput is at least this share of it")
    parser.add_argument("--max-send-lag-p99-s", type=float, default=0.1, help="validity gate per run")
    parser.add_argument("--templates", action=argparse.BooleanOptionalAction, default=True,
                        help=f"send short requests to this app as its {SHORT_TEMPLATE!r} template")
    parser.add_argument("--restart-per-point", action="store_true",
                        help="a fresh server per load point (default: one per repeat serves every point)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="idle seconds before each load point")
    parser.add_argument("--keep-records", action=argparse.BooleanOptionalAction, default=True,
                        help="write every request's timings into the JSON")
    add_client_options(parser, progress_s=15.0)
    parser.add_argument("--out", default="benchmarks/results/mixed_workload")
    return parser.parse_args(argv)
