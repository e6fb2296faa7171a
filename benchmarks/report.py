"""What both benchmarks report alike: the spread of repeats, the validity gate,
targets with pass/fail, the JSON file (with `benchmarks.provenance`'s block)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.metrics import rounded
from benchmarks.provenance import cpu_block, measured_on, provenance
from benchmarks.settings import differing
from serve_app.cost.measured import FACTORS
from serve_app.quantile import quantile


def spread(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """Median (numpy's linear interpolation), min and max of the values given."""
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": quantile(present, 0.5), "min": min(present), "max": max(present), "n": len(present)}


def dig(data: Mapping[str, Any] | None, path: str) -> Any:
    """`data["a"]["b"]` for path `a.b`; None where any step is missing."""
    for key in path.split("."):
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    return data


def spreads(runs: list[Mapping[str, Any]], paths: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """`spread` of each named dotted path over `runs`."""
    return {name: spread(dig(run, path) for run in runs) for name, path in paths.items()}


def validity(checks: Mapping[str, tuple[float | None, float]]) -> dict[str, Any]:
    """The validity gate: each check is (measured, limit) and passes when
    measured < limit; a check that could not be measured fails."""
    reasons = [f"{name} {'not measured' if value is None else f'{value:.3g}'} (limit < {limit})"
               for name, (value, limit) in checks.items() if value is None or not value < limit]
    return {"valid": not reasons, "reasons": reasons,
            "checks": {name: {"value": value, "limit": limit} for name, (value, limit) in checks.items()}}


def usable_runs(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The valid measured runs; all measured runs (and False) when none is valid."""
    measured = [r for r in runs if "error" not in r]
    valid = [r for r in measured if r["validity"]["valid"]]
    return (valid, True) if valid else (measured, False)


OPS: dict[str, Callable[[float, float], bool]] = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
                                                  "<": lambda a, b: a < b, ">": lambda a, b: a > b}


def target(value: float | None, op: str, threshold: float, what: str) -> dict[str, Any]:
    """One target: pass/fail, or None (not measured)."""
    return {"what": what, "value": value, "op": op, "threshold": threshold,
            "pass": None if value is None else OPS[op](value, threshold)}


def factor(name: str, value: float, definition: str, runs: int, command: str) -> dict[str, Any]:
    """One entry of a result's `factors` (`serve_app.cost.measured.MeasuredFactor`), measured on this CPU."""
    cpu = cpu_block()
    return {"value": value, "metric": FACTORS[name].metric, "definition": definition, "measured_on": measured_on(cpu),
            "hardware": {"kind": "cpu", "model": cpu["model"]}, "command": command, "runs": runs, "basis": "measured"}


def write_json(path: Path, data: dict[str, Any], settings: Mapping[str, Mapping[str, Any]]) -> None:
    """Write a benchmark's JSON with its provenance (commit, CPU, command, each
    system's `settings`) and the settings that differ between its systems."""
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {**data, "provenance": provenance(settings), "settings_differ": differing(settings)}
    path.write_text(json.dumps(rounded(full), indent=2) + "\n")


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def fmt_spread(s: Mapping[str, Any] | None, digits: int = 3) -> str:
    """`median [min-max]`, or `-`."""
    if not s or s.get("median") is None:
        return "-"
    if s["n"] == 1:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


def print_targets(targets: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    for system, checks in targets.items():
        for name, t in checks.items():
            verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
            print(f"  {verdict} {system}: {name}: {fmt(t['value'])} {t['op']} {t['threshold']} ({t['what']})")


def commit_of(data: Mapping[str, Any]) -> str:
    """`abcdef1234` (`-dirty` when the tree had uncommitted changes), or a note that it is not traceable."""
    prov = data.get("provenance") or {}
    git = prov.get("git") or prov  # benchmarks/provenance.py's block, or a flat `commit`/`dirty`
    if not git.get("commit"):
        return "no commit recorded (not traceable)"
    return f"`{git['commit'][:10]}`" + ("-dirty" if git.get("dirty") else "")


def where(path: str, data: Mapping[str, Any]) -> str:
    cpu = (data.get("provenance") or {}).get("cpu") or {}
    return f"[{Path(path).name}]({path}), {commit_of(data)}, {cpu.get('model', 'CPU not recorded')}"
