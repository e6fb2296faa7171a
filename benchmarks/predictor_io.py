"""The predictor benchmark's outputs: its provenance block, JSON and learning-curve PNG."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.provenance import NOTABLE_FLAGS, cpu_model, git_state
from serve_app.engine.cpu_dtype import cpu_flags

INPUTS = ("*.py", "configs", "pyproject.toml")
"""What a result depends on: a change elsewhere (results, docs) does not make it dirty."""


def provenance(script: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """Git commit (and whether tracked `INPUTS` differed), CPU model, flags and load (timings
    share the machine), the command line."""
    flags = cpu_flags()
    args = sys.argv[1:] if argv is None else list(argv)
    return {**git_state(paths=INPUTS),
            "cpu": {"model": cpu_model(), "flags": [f for f in NOTABLE_FLAGS if f in flags], "cpus": os.cpu_count(),
                    "load_average_1m_at_end": os.getloadavg()[0]},
            "command": shlex.join([".venv/bin/python", script, *args])}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, Mapping):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def write_result(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_rounded(data), indent=1) + "\n")


def write_plot(path: Path, results: Mapping[str, Mapping[str, Any]], window: int, long_tokens: int) -> None:
    """Bucket accuracy and Kendall tau-b per window of requests, one line per predictor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, tau) = plt.subplots(1, 2, figsize=(13, 4.2))
    for number, (name, result) in enumerate(results.items()):
        color = f"C{number % 10}"
        curve = result["learning_curve"]
        xs = [(i + 1) * window for i in range(len(curve))]
        acc.plot(xs, [w["bucket_accuracy"] for w in curve], marker=".", label=name, color=color)
        taus = [w["kendall_tau_b"] for w in curve]
        if any(t is not None for t in taus):
            tau.plot(xs, [math.nan if t is None else t for t in taus], marker=".", label=name, color=color)
    acc.set_title(f"bucket accuracy at {long_tokens} tokens, per {window} requests (higher is better)")
    tau.set_title(f"Kendall tau-b per {window} requests (higher is better)")
    for ax in (acc, tau):
        ax.set_xlabel("requests arrived")
        ax.grid(alpha=0.3)
    acc.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
