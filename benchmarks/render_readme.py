"""Render the README's benchmark summary and docs/benchmarks.md's full tables
from the committed result files, between marker comments, so no figure there
can drift from a file that records its commit, CPU, command and settings.

    .venv/bin/python benchmarks/render_readme.py           # rewrite both blocks
    .venv/bin/python benchmarks/render_readme.py --check   # exit 1 if either is stale

Every `benchmarks/results/*.json` is listed; the throughput, mixed-workload, offline
predictor, live ShareGPT, engine step profile, simulator validation and projected routing figures are
rendered, other kinds by name and commit only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fleetsim.render import (  # noqa: E402
    routing_rows,
    routing_table,
    spot_rows,
    spot_table,
    validation_rows,
    validation_table,
)
from benchmarks.report import fmt, fmt_spread, where  # noqa: E402
from benchmarks.settings import settings_table  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- results:begin (benchmarks/render_readme.py) -->", "<!-- results:end -->"
"""The markers around each rendered block."""
SUMMARY_FIGURES = {"output_tok_per_s": "output tok/s", "ttft_p50_s": "TTFT p50", "itl_p50_s": "ITL p50"}
"""Throughput ratios the README's summary shows."""
PREDICTOR_FIGURES = {"bucket_accuracy": "bucket accuracy", "short_recall": "short recall", "kendall_tau_b": "Kendall tau"}
"""Offline predictor figures the README's summary shows, the app's beside a constant's."""


def load_results(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every result file, by its path relative to the repository, in name order."""
    return {str(path.relative_to(REPO)): json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def throughput_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    repeats = (data.get("workload") or {}).get("repeats")
    return [f"| throughput: {SUMMARY_FIGURES[key]} {pair} | {fmt(value)} | {repeats} repeats | {where(path, data)} |"
            for pair, values in (data.get("ratios") or {}).items()
            for key, value in values.items() if key in SUMMARY_FIGURES]


def mixed_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    load = str((data.get("workload") or {}).get("target_load"))
    repeats = (data.get("workload") or {}).get("repeats")
    rows = [f"| mixed at {load} load: {figure} {system}/vllm | {fmt(value)} | {repeats} repeats | {where(path, data)} |"
            for system, values in (data.get("ratios_to_vllm") or {}).get(load, {}).items()
            for figure, value in values.items()]
    capacity = (data.get("capacity_at_slo") or {}).get("systems") or {}
    rows += [f"| mixed: capacity at the SLO, {system} (req/s) | {fmt(c['capacity_req_per_s'])}"
             f"{'' if c['bracketed'] else ' (lower bound)'} | {repeats} repeats | {where(path, data)} |"
             for system, c in capacity.items()]
    return rows


def predictor_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    predictors = data.get("predictors") or {}
    if "app" not in predictors:
        return other_rows(path, data)
    app, constant = predictors["app"], predictors.get("constant") or {}
    name, runs, at = data["benchmark"], f"{app.get('requests')} requests", where(path, data)
    rows = [f"| {name}: app {label} (a constant: {fmt(constant.get(key))}) | {fmt(app.get(key))} | {runs} | {at} |"
            for key, label in PREDICTOR_FIGURES.items()]
    return rows + [f"| {name}: app cost p99 (us per request) | {fmt((app.get('cost_us') or {}).get('p99'))} | "
                   f"{runs} | {at} |"]


def predictor_table(predictors: Mapping[str, Mapping[str, Any]]) -> str:
    rows = ["| predictor | bucket accuracy | short recall | MAE (tokens) | Kendall tau | cost p50 / p99 (us) "
            "| settled after (requests) |", "|---|---|---|---|---|---|---|"]
    rows += [f"| `{name}` | {fmt(p.get('bucket_accuracy'))} | {fmt(p.get('short_recall'))} | {fmt(p.get('mae_tokens'))} "
             f"| {fmt(p.get('kendall_tau_b'))} | {fmt((p.get('cost_us') or {}).get('p50'))} / "
             f"{fmt((p.get('cost_us') or {}).get('p99'))} | {fmt(p.get('settled_after_requests'))} |"
             for name, p in predictors.items()]
    return "\n".join(rows)


def step_profile_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    at = where(path, data)
    return [f"| engine step time, fitted: median (p90) error on {sweep} | {fmt(e['median_abs_pct'])}% "
            f"({fmt(e['p90_abs_pct'])}%) | {e['steps']} steps | {at} |" for sweep, e in data["fit_error"].items()]


SHAREGPT_FIGURES = {"short_e2el_p99_s": "short E2EL p99", "long_e2el_p50_s": "long E2EL p50",
                    "output_tok_s": "output tok/s", "capacity_req_s": "capacity"}
"""The live ShareGPT benchmark's ratios the README's summary shows."""


def sharegpt_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    workload = data.get("workload") or {}
    return [f"| ShareGPT at {workload.get('load')} of own capacity: {SHAREGPT_FIGURES[key]} app/vllm | {fmt(value)} | "
            f"{workload.get('repeats')} repeats | {where(path, data)} |"
            for key, value in (data.get("ratios") or {}).items() if key in SHAREGPT_FIGURES]


def sharegpt_table(results: list[Mapping[str, Any]]) -> str:
    keys = ("capacity_req_s", "rate_req_s", "output_tok_s", "short_e2el_p99_s", "short_e2el_p50_s",
            "long_e2el_p50_s", "all_ttft_p50_s", "short_count")
    rows = ["| system | " + " | ".join(keys) + " | valid runs |", "|---" * (len(keys) + 2) + "|"]
    rows += [f"| `{r['system']}` | " + " | ".join(fmt_spread(r["figures"].get(k)) for k in keys)
             + f" | {r['valid_runs']}/{len(r['runs'])} |" for r in results]
    return "\n".join(rows)


def other_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    return [f"| {data.get('benchmark', Path(path).stem)}: see the file | - | - | {where(path, data)} |"]


ROWS: dict[str, Callable[[str, Mapping[str, Any]], list[str]]] = {
    "throughput": throughput_rows, "mixed_workload": mixed_rows,
    "predictor_sharegpt": predictor_rows, "predictor_smollm2": predictor_rows,
    "step_profile": step_profile_rows, "fleetsim_validation": validation_rows, "fleetsim_routing": routing_rows,
    "fleetsim_spot": spot_rows, "sharegpt_serve": sharegpt_rows}
"""Summary rows per benchmark kind (`benchmark` in the file)."""


def summary(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The README's block: one table of headline figures, each with its file and commit."""
    if not results:
        return ("No result file is committed yet (`benchmarks/results/`): every earlier figure is historical, "
                "kept in [docs/benchmarks.md](docs/benchmarks.md) with what needs re-measuring.")
    lines = ["| figure | value | runs | file, commit, CPU |", "|---|---|---|---|"]
    for path, data in results.items():
        lines += ROWS.get(data.get("benchmark", ""), other_rows)(path, data)
    return "\n".join(lines)


def full(results: Mapping[str, Mapping[str, Any]]) -> str:
    """docs/benchmarks.md's block: per file its command, per system its medians
    [ranges], and the settings that differ between its systems."""
    if not results:
        return "No result file is committed yet (`benchmarks/results/`)."
    parts = []
    for path, data in results.items():
        prov = data.get("provenance") or {}
        parts.append(f"#### {Path(path).name}\n\n{where(path, data)}; dtype {', '.join(prov.get('dtype') or ['-'])}"
                     f"\n\n```\n{prov.get('command', data.get('command', '(no command recorded)'))}\n```")
        if data.get("benchmark") == "throughput":
            rows = ["| system | output tok/s | TTFT p50 | ITL p50 | TPOT p50 | valid runs |", "|---|---|---|---|---|---|"]
            rows += [f"| `{r['target']}` | " + " | ".join(fmt_spread(r["stats"][k]) for k in (
                "output_tok_per_s", "ttft_p50_s", "itl_p50_s", "tpot_p50_s")) + f" | {r['valid_runs']}/{r['repeats']} |"
                for r in data.get("results") or []]
            parts.append("\n".join(rows))
        if data.get("predictors"):
            parts.append(predictor_table(data["predictors"]))
        if data.get("benchmark") == "fleetsim_validation":
            parts.append(validation_table(data["comparison"]))
        if data.get("benchmark") == "fleetsim_routing":
            parts.append(routing_table(data))
        if data.get("benchmark") == "fleetsim_spot":
            parts.append(spot_table(data))
        if data.get("benchmark") == "sharegpt_serve":
            parts.append(sharegpt_table(data["results"]))
        if prov.get("systems"):
            parts.append(settings_table(prov["systems"]))
    return "\n\n".join(parts)


def replace_block(text: str, block: str, name: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"{name}: needs exactly one {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text)


def rendered(results: Mapping[str, Mapping[str, Any]]) -> dict[Path, str]:
    """Each document's text with its block rendered from `results`."""
    return {README: replace_block(README.read_text(), summary(results), "README.md"),
            DOC: replace_block(DOC.read_text(), full(results), "docs/benchmarks.md")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rendered block differs from the files")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered(load_results()).items():
        if path.read_text() != text:
            stale.append(str(path.relative_to(REPO)))
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run .venv/bin/python benchmarks/render_readme.py", file=sys.stderr)
        return 1
    print(f"{'updated' if stale else 'up to date'}: {', '.join(stale) or 'README.md, docs/benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
