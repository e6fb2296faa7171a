"""The throughput benchmark's summary: per system the median and range of its
repeats, ratios to vLLM's server, targets, the quantization factor, answers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import quality
from benchmarks.common import ratio
from benchmarks.cpu_accounting import GROUPS
from benchmarks.report import dig, factor, fmt, fmt_spread, print_targets, spread, spreads, target, usable_runs
from benchmarks.settings import differing
from benchmarks.systems import System

STAT_PATHS = {
    "output_tok_per_s": "summary.output_throughput", "req_per_s": "summary.request_throughput",
    "ttft_p50_s": "summary.ttft_s.p50", "ttft_p99_s": "summary.ttft_s.p99", "tpot_p50_s": "summary.tpot_s.p50",
    "itl_p50_s": "summary.itl_s.p50", "e2el_p50_s": "summary.e2el_s.p50", "e2el_p99_s": "summary.e2el_s.p99",
    "goodput": "summary.goodput", "ready_s": "ready_s", "loop_lag_p99_s": "loop_lag_s.p99",
    "client_machine_share": "cpu.client_machine_share",
    "server_cpu_s_per_1k_output_tokens": "cpu.server_cpu_s_per_1k_output_tokens",
}
RATIO_KEYS = ("output_tok_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s", "e2el_p50_s", "e2el_p99_s",
              "ready_s")
PAIRS = (("app", "vllm"), ("nobuckets", "vllm"), ("int8", "vllm-int8"))
"""(system, its baseline) for ratios and targets: baselines at the app's stream interval."""
SIDE_PAIRS = (("app", "vllm-si1"),)
"""(system, baseline) shown as ratios only: vLLM at its own default stream interval."""
MIN_TOK_RATIO, MAX_TTFT_RATIO, MAX_READY_EXTRA_S = 0.95, 1.3, 10.0


def result_entry(system: System, runs: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """One `results[]` entry: the planner's keys (medians over valid runs) and the
    spreads. One replica served each system on this machine, so the replica held
    all of its vCPUs (`vcpus_per_replica`; vLLM CPU computes on some and reserves
    the rest for everything else); `server_busy_vcpus` is what the server's
    processes kept busy."""
    used, valid_only = usable_runs(runs)
    measured = [r for r in runs if "error" not in r]
    stats = spreads(used, STAT_PATHS)
    median = {key: s["median"] for key, s in stats.items()}
    entry: dict[str, Any] = {
        "target": system.name, "description": system.description, "engine": system.engine,
        "quantization": system.engine.get("quantization"),
        "command": next((r["command"] for r in measured), None),
        "repeats": len(runs), "measured_runs": len(measured),
        "valid_runs": sum(r["validity"]["valid"] for r in measured),
        "medians_over": "valid runs" if valid_only else "all measured runs (none was valid)",
        "start_errors": [r["error"][-500:] for r in runs if "error" in r],
        "failed": sum(r["summary"]["failed"] for r in measured),
        "failures": _merged(r["summary"]["failures"] for r in measured),
        "latency_p50_s": median["e2el_p50_s"], "latency_p99_s": median["e2el_p99_s"],
        **{key: median[key] for key in ("output_tok_per_s", "req_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                                         "itl_p50_s", "e2el_p50_s", "e2el_p99_s", "ready_s")},
        "stats": stats,
        "vcpus_per_replica": os.cpu_count(),
        "server_busy_vcpus": spread(r["cpu"]["server_cpu_s"] / r["cpu"]["wall_s"] for r in used if r["cpu"]["wall_s"]),
        "cpu_s_per_1k_output_tokens": {g: spread(dig(r, "cpu.cpu_s_per_1k_output_tokens")[g] for r in used)
                                       for g in GROUPS},
        "runs": [{k: v for k, v in r.items() if k not in ("answers", "load_curve")} for r in runs],
    }
    curve = next((r["load_curve"] for r in measured if r.get("load_curve")), None)
    if curve is not None:
        main_point = {"concurrency": concurrency, "output_tok_per_s": median["output_tok_per_s"]}
        points = {p["concurrency"]: p for p in [*curve, main_point] if p["output_tok_per_s"] is not None}
        entry["load_curve"] = [points[c] for c in sorted(points)]
    return entry


def _merged(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for key, n in c.items():
            total[key] = total.get(key, 0) + n
    return total


def comparisons(results: Mapping[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ratios of medians to each system's baseline, and the targets with pass/fail."""
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for mine, base in PAIRS + SIDE_PAIRS:
        if mine not in results or base not in results:
            continue
        ours, theirs = results[mine], results[base]
        ratios[f"{mine}/{base}"] = {key: ratio(ours[key], theirs[key]) for key in RATIO_KEYS}
        extra = None if ours["ready_s"] is None or theirs["ready_s"] is None else ours["ready_s"] - theirs["ready_s"]
        ratios[f"{mine}/{base}"]["ready_s_minus_baseline"] = extra
        if (mine, base) in SIDE_PAIRS:
            continue
        targets[mine] = {
            "output_tok_per_s_ratio": target(ratios[f"{mine}/{base}"]["output_tok_per_s"], ">=", MIN_TOK_RATIO,
                                             f"output tok/s median / {base}'s"),
            "ttft_p50_ratio": target(ratios[f"{mine}/{base}"]["ttft_p50_s"], "<=", MAX_TTFT_RATIO,
                                     f"TTFT p50 median / {base}'s"),
            "ready_s_minus_baseline": target(extra, "<=", MAX_READY_EXTRA_S,
                                             f"start-to-ready median minus {base}'s (s)"),
        }
    return ratios, targets


QUANTIZATION_PAIRS = (("int8", "app"), ("vllm-int8", "vllm"))
"""(quantized, unquantized) systems a quantization factor may compare, in order of preference."""
QUANTIZATION_KEYS = frozenset({"model", "engine.quantization"})
"""The settings a quantized config may differ in from its unquantized pair: the checkpoint and its quantization."""


def quantization_factor(results: Mapping[str, dict[str, Any]], settings: Mapping[str, Mapping[str, Any]],
                        workload: Mapping[str, Any], command: str) -> tuple[dict[str, Any] | None, str]:
    """`factors.quantization` from the first pair of systems that both have a
    throughput and whose settings differ only in quantization; else None and why."""
    reasons = []
    for quantized, plain in QUANTIZATION_PAIRS:
        q, p = results.get(quantized), results.get(plain)
        value = ratio(q and q["output_tok_per_s"], p and p["output_tok_per_s"], 4)
        if not value or q is None or p is None:
            reasons.append(f"{quantized}/{plain}: not both measured")
            continue
        other = sorted(set(differing({quantized: settings[quantized], plain: settings[plain]})) - QUANTIZATION_KEYS)
        if other:
            reasons.append(f"{quantized}/{plain}: settings differ beyond quantization ({', '.join(other)})")
            continue
        runs = min(q["valid_runs"], p["valid_runs"]) or min(q["measured_runs"], p["measured_runs"])
        return factor("quantization", value, (
            f"output tok/s of {quantized} ({q['description']}, quantization {q['quantization']}) over {plain} "
            f"({p['description']}), settings otherwise equal; medians of {workload['repeats']} interleaved repeats "
            f"of {workload['requests']} streamed chat requests x {workload['max_tokens']} tokens (ignore_eos, "
            f"greedy), {workload['concurrency']} concurrent"), runs, command), ""
    return None, "; ".join(reasons)


def answers_block(systems: Sequence[System], runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    found = {s.name: a for s in systems if (a := next((r["answers"] for r in runs[s.name] if r.get("answers")),
                                                        None))}
    return quality.side_by_side(found) if found else None


def invalid_runs(runs: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"target": name, "repeat": r["repeat"], "reasons": r["validity"]["reasons"]}
            for name, rs in runs.items() for r in rs if "error" not in r and not r["validity"]["valid"]]


def print_summary(summary: Mapping[str, Any]) -> None:
    print(f"\n{'system':<10}{'tok/s':>22}{'TTFT p50':>20}{'TTFT p99':>20}{'TPOT p50':>20}{'ITL p50':>20}"
          f"{'E2EL p99':>20}{'ready s':>16}{'failed':>7}{'valid':>6}")
    for r in summary["results"]:
        s = r["stats"]
        print(f"{r['target']:<10}" + "".join(f"{fmt_spread(s[k]):>20}" for k in (
            "output_tok_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s", "e2el_p99_s"))
            + f"{fmt_spread(s['ready_s']):>16}{r['failed']:>7}{r['valid_runs']:>4}/{r['measured_runs']}")
    print("\nCPU-s per 1k output tokens (median):")
    for r in summary["results"]:
        groups = {g: v["median"] for g, v in r["cpu_s_per_1k_output_tokens"].items() if v["median"]}
        print(f"  {r['target']:<10}" + ", ".join(f"{g} {fmt(v)}" for g, v in groups.items()))
    for pair, values in summary["ratios"].items():
        print(f"{pair}: " + ", ".join(f"{k} {fmt(v)}" for k, v in values.items()))
    print("targets:")
    print_targets(summary["targets"])
    if summary.get("answers"):
        print("answers correct:", summary["answers"]["correct"])
    if summary.get("factors"):
        print("factors:", {k: v["value"] for k, v in summary["factors"].items()})
    for name, why in (summary.get("factors_not_emitted") or {}).items():
        print(f"factor {name} not emitted: {why}")
    if not summary["valid"]:
        print("INVALID runs (client starved; excluded from the medians):")
        for bad in summary["invalid_runs"]:
            print(f"  {bad['target']} repeat {bad['repeat']}: {'; '.join(bad['reasons'])}")
