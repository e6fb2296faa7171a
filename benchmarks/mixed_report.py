"""The mixed-workload benchmark's summary: per system and load point the median
and range of the valid repeats (per class, as `vllm bench serve` defines the
metrics), ratios to vLLM's FCFS server, targets, each system's capacity at the goodput
SLO and the length-scheduling factor (a ratio of those capacities)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from benchmarks.common import ratio
from benchmarks.metrics import RequestRecord, Slo, summarize
from benchmarks.report import dig, factor, fmt, fmt_spread, print_targets, spread, target
from benchmarks.workload import CLASSES, PlannedRequest

BASELINE = "vllm"
FIGURES = {"short_e2el_p99_s": "classes.short.e2el_s.p99", "short_ttft_p99_s": "classes.short.ttft_s.p99",
           "long_e2el_p50_s": "classes.long.e2el_s.p50", "output_tok_per_s": "classes.all.output_throughput"}
"""The headline figures: compared with the baseline at every load point."""
HIGHER_IS_BETTER = {"output_tok_per_s"}
METRICS = ("ttft_s", "tpot_s", "itl_s", "e2el_s")
STATS = ("mean", "p50", "p90", "p99")
SHORT_GOAL, SHORT_FLOOR, MIN_TOK_RATIO, MAX_LONG_RATIO = 0.5, 1.0, 0.95, 1.2
RECORD_COLUMNS = ("index", "kind", "status", "start_s", "ttft_s", "e2el_s", "output_tokens")


def slo_for(args: Any) -> Any:
    """Each request's SLOs: TTFT and TPOT for all, E2EL for short requests too."""
    common = Slo(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s)
    short = Slo(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s, e2el_s=args.slo_e2el_short_s)
    return lambda record: short if record.kind == "short" else common


def class_summaries(records: list[RequestRecord], duration_s: float, slo: Any) -> dict[str, Any]:
    return {kind: summarize([r for r in records if kind in ("all", r.kind)], duration_s, slo) for kind in CLASSES}


def compact(plan: list[PlannedRequest], records: list[RequestRecord]) -> list[list[Any]]:
    return [[p.index, p.kind, r.status, r.start_s, r.ttft_s, r.e2el_s, r.output_tokens]
            for p, r in zip(plan, records, strict=True)]


def point_stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Spreads over `runs` (one system, one load) of the headline figures and of
    every class's metrics."""
    classes = {kind: {
        **{metric: {stat: spread(dig(r, f"classes.{kind}.{metric}.{stat}") for r in runs) for stat in STATS}
           for metric in METRICS},
        **{key: spread(dig(r, f"classes.{kind}.{key}") for r in runs)
           for key in ("output_throughput", "request_throughput", "goodput", "failed", "completed")},
    } for kind in CLASSES}
    return {"figures": {name: spread(dig(r, path) for r in runs) for name, path in FIGURES.items()},
            "classes": classes}


def aggregate(runs: Iterable[dict[str, Any]]) -> dict[str, dict[float, dict[str, Any]]]:
    """`[system][load]`: statistics over the valid runs (invalid ones listed, not used)."""
    grouped: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for run in runs:
        grouped.setdefault(run["system"], {}).setdefault(run["load"], []).append(run)
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for system, loads in grouped.items():
        for load, rs in loads.items():
            valid = [r for r in rs if "error" not in r and r["validity"]["valid"]]
            out.setdefault(system, {})[load] = {
                **point_stats(valid), "runs": len(rs), "valid_runs": len(valid),
                "invalid": [{"repeat": r["repeat"], "reasons": r["validity"]["reasons"]}
                            for r in rs if "error" not in r and not r["validity"]["valid"]],
                "errors": [r["error"][-300:] for r in rs if "error" in r]}
    return out


def median(stats: Mapping[str, dict[float, dict[str, Any]]], system: str, load: float, figure: str) -> float | None:
    return dig(stats.get(system, {}).get(load), f"figures.{figure}.median")


def ratios_to_baseline(stats: Mapping[str, dict[float, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """`[load][system][figure]`: the system's median over the baseline's."""
    loads = sorted({load for by_load in stats.values() for load in by_load})
    return {str(load): {system: {f: ratio(median(stats, system, load, f), median(stats, BASELINE, load, f))
                                 for f in FIGURES}
                        for system in stats if system != BASELINE}
            for load in loads}


def targets_at(stats: Mapping[str, dict[float, dict[str, Any]]], load: float) -> dict[str, dict[str, Any]]:
    """Pass/fail of this app at `load`: against vLLM FCFS, and better than Ray Serve LLM on every figure."""
    def r(system: str, figure: str, base: str = BASELINE) -> float | None:
        return ratio(median(stats, system, load, figure), median(stats, base, load, figure))

    result = {"app": {
        "short_e2el_p99_ratio": target(r("app", "short_e2el_p99_s"), "<=", SHORT_GOAL,
                                       f"short E2EL p99 / vllm's at load {load} (goal)"),
        "short_e2el_p99_ratio_floor": target(r("app", "short_e2el_p99_s"), "<=", SHORT_FLOOR,
                                             f"short E2EL p99 / vllm's at load {load} (floor)"),
        "output_tok_per_s_ratio": target(r("app", "output_tok_per_s"), ">=", MIN_TOK_RATIO,
                                         f"total output tok/s / vllm's at load {load}"),
        "long_e2el_p50_ratio": target(r("app", "long_e2el_p50_s"), "<=", MAX_LONG_RATIO,
                                      f"long E2EL p50 / vllm's at load {load}"),
    }}
    result["app_vs_rayllm"] = {
        f"{figure}_ratio": target(r("app", figure, "rayllm"), ">" if figure in HIGHER_IS_BETTER else "<", 1.0,
                                  f"app / rayllm {figure} at load {load}: app better")
        for figure in FIGURES}
    return result


def capacity_at_slo(stats: Mapping[str, dict[float, dict[str, Any]]], rates: Mapping[float, float],
                    goal: float) -> dict[str, dict[str, Any]]:
    """Per system: the highest offered rate (req/s) at which its goodput (requests
    meeting every SLO, median over valid repeats) is at least `goal` of the offered
    rate. `bracketed`: a higher offered rate was tried and missed it, so the
    capacity is known to the grid's resolution; otherwise it is only a lower bound
    (or, with no rate met, below the lowest tried)."""
    out = {}
    for system, by_load in stats.items():
        met = {load: (dig(point, "classes.all.goodput.median") or 0.0) >= goal * rates[load]
               for load, point in sorted(by_load.items()) if point["valid_runs"]}
        passed = [load for load, ok in met.items() if ok]
        best = max(passed) if passed else None
        out[system] = {"capacity_req_per_s": None if best is None else rates[best], "load": best,
                       "bracketed": best is not None and any(load > best and not ok for load, ok in met.items()),
                       "met": {str(load): ok for load, ok in met.items()}}
    return out


def length_scheduling_factor(capacity: Mapping[str, dict[str, Any]], goal: float, slo_line: str, command: str,
                             requests: int, repeats: int) -> tuple[dict[str, Any] | None, str]:
    """`factors.length_scheduling`: this app's capacity at the SLO over the same
    app's with length awareness off, when both are bracketed; else None and why."""
    app, off = capacity.get("app"), capacity.get("nobuckets")
    missing = [name for name, c in (("app", app), ("nobuckets", off))
               if c is None or c["capacity_req_per_s"] is None or not c["bracketed"]]
    if app is None or off is None or missing:
        return None, (f"capacity at the SLO not bracketed for {', '.join(missing)}: no offered rate was both met and "
                      "followed by a higher one that was missed; add load points")
    value = ratio(app["capacity_req_per_s"], off["capacity_req_per_s"], 4)
    assert value is not None
    return factor("length_scheduling", value, (
        f"capacity at the SLO of this app with length-aware scheduling (configs/local.yaml) over the same app with "
        f"it off (configs/local-nobuckets.yaml): the highest offered rate at which goodput ({slo_line}) was at least "
        f"{goal:.0%} of the offered rate, on the grid of load points (resolution: the grid's step); medians of "
        f"valid interleaved repeats (of {repeats}), open-loop seeded Poisson mix ({requests} requests per run)"),
        repeats, command), ""


def print_tables(stats: Mapping[str, dict[float, dict[str, Any]]], ratios: Mapping[str, Any],
                 targets: Mapping[str, Any], slo_line: str) -> None:
    print(f"\nmedian [min-max] over valid repeats; goodput SLOs: {slo_line}")
    print(f"{'load':<6}{'system':<15}{'short E2EL p99':>22}{'short TTFT p99':>22}{'long E2EL p50':>22}"
          f"{'tok/s':>22}{'goodput':>10}{'valid':>7}")
    for load in sorted({load for by_load in stats.values() for load in by_load}):
        for system, by_load in stats.items():
            point = by_load.get(load)
            if point is None:
                continue
            figs = point["figures"]
            print(f"{load:<6}{system:<15}" + "".join(f"{fmt_spread(figs[f]):>22}" for f in FIGURES)
                  + f"{fmt(point['classes']['all']['goodput']['median']):>10}{point['valid_runs']:>5}/{point['runs']}")
    for load, by_system in ratios.items():
        for system, values in by_system.items():
            print(f"load {load} {system}/{BASELINE}: " + ", ".join(f"{f} {fmt(v)}" for f, v in values.items()))
    print("targets:")
    print_targets(targets)
