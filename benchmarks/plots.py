"""The benchmarks' PNGs (matplotlib, Agg): medians with min-max ranges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = {"app": "tab:blue", "nobuckets": "tab:cyan", "vllm": "tab:gray", "vllm-priority": "tab:purple",
          "rayllm": "tab:orange", "int8": "tab:green", "vllm-int8": "tab:olive"}


def pyplot():
    """matplotlib's pyplot, drawing to files only (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bar_with_range(ax, xs: Sequence[float], spreads: Sequence[Mapping[str, Any]], width: float, **kwargs) -> None:
    medians = [s.get("median") or 0.0 for s in spreads]
    low = [m - (s.get("min") if s.get("min") is not None else m) for m, s in zip(medians, spreads, strict=True)]
    high = [(s.get("max") if s.get("max") is not None else m) - m for m, s in zip(medians, spreads, strict=True)]
    bars = ax.bar(xs, medians, width, yerr=[low, high], capsize=4, **kwargs)
    ax.bar_label(bars, fmt="%.3g", fontsize=7)


def throughput_plot(results: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Output tok/s, TTFT p50/p99, TPOT/ITL p50 and server CPU per 1k tokens, per system."""
    plt = pyplot()
    names = [r["target"] for r in results]
    xs = list(range(len(names)))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    _bar_with_range(axes[0], xs, [r["stats"]["output_tok_per_s"] for r in results], 0.6,
                    color=[COLORS.get(n, "tab:red") for n in names])
    axes[0].set_title("output tokens/s (higher is better)")
    for ax, pairs, label in (
        (axes[1], (("ttft_p50_s", "p50"), ("ttft_p99_s", "p99")), "TTFT s (lower is better)"),
        (axes[2], (("tpot_p50_s", "TPOT p50"), ("itl_p50_s", "ITL p50")), "per-token s (lower is better)"),
    ):
        for offset, (key, legend) in zip((-0.2, 0.2), pairs, strict=True):
            _bar_with_range(ax, [x + offset for x in xs], [r["stats"][key] for r in results], 0.4, label=legend)
        ax.set_title(label)
        ax.legend(fontsize=8)
    bottom = [0.0] * len(names)
    groups = sorted({g for r in results for g in r.get("cpu_s_per_1k_output_tokens", {})})
    for group in groups:
        values = [(r.get("cpu_s_per_1k_output_tokens", {}).get(group) or {}).get("median") or 0.0 for r in results]
        if any(values):
            axes[3].bar(xs, values, 0.6, bottom=bottom, label=group)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes[3].set_title("CPU-s per 1k output tokens (median)")
    axes[3].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    for ax in axes:
        ax.set_xticks(xs, names, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


MIXED_PANELS = (("short_e2el_p99_s", "short requests: E2EL p99 (s)"),
                ("short_ttft_p99_s", "short requests: TTFT p99 (s)"),
                ("long_e2el_p50_s", "long requests: E2EL p50 (s)"),
                ("output_tok_per_s", "total output tokens/s"))


def mixed_plot(by_system: Mapping[str, Mapping[float, Mapping[str, Mapping[str, Any]]]], path: Path,
               title: str) -> None:
    """Each headline figure against offered load, one line per system with min-max bars.
    `by_system[system][load][figure]` is a spread."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(MIXED_PANELS), figsize=(5 * len(MIXED_PANELS), 4.2))
    for ax, (figure, label) in zip(axes, MIXED_PANELS, strict=True):
        for system, loads in by_system.items():
            points = sorted((load, figs[figure]) for load, figs in loads.items()
                            if figs.get(figure, {}).get("median") is not None)
            if not points:
                continue
            xs = [load for load, _ in points]
            medians = [s["median"] for _, s in points]
            err = [[m - s["min"] for m, (_, s) in zip(medians, points, strict=True)],
                   [s["max"] - m for m, (_, s) in zip(medians, points, strict=True)]]
            ax.errorbar(xs, medians, yerr=err, marker="o", capsize=3, label=system, color=COLORS.get(system))
        ax.set_xlabel("offered load (share of vllm's calibrated capacity)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SHAREGPT_PANELS = (("short_e2el_p99_s", "short (by output): E2EL p99 (s)"),
                   ("long_e2el_p50_s", "long (by output): E2EL p50 (s)"),
                   ("output_tok_s", "output tokens/s"),
                   ("capacity_req_s", "own capacity (req/s)"))


def sharegpt_plot(results: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> None:
    """One bar per system and headline figure, median with min-max range."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(SHAREGPT_PANELS), figsize=(4 * len(SHAREGPT_PANELS), 3.8))
    names = list(results)
    for ax, (figure, label) in zip(axes, SHAREGPT_PANELS, strict=True):
        spreads = [results[name]["figures"][figure] for name in names]
        shown = [(i, s) for i, s in enumerate(spreads) if s["median"] is not None]
        _bar_with_range(ax, [i for i, _ in shown], [s for _, s in shown], 0.6,
                        color=[COLORS.get(names[i]) for i, _ in shown])
        ax.set_xticks(range(len(names)), names)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
