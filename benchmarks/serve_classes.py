"""Per-class figures from `vllm bench serve --save-detailed` results: requests
grouped by their actual output length (short, long, all), with metrics as vLLM
defines them (TTFT; TPOT = (E2EL - TTFT) / (output tokens - 1); E2EL)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serve_app.quantile import quantile

CLASS_METRICS = ("count", "e2el_p50_s", "e2el_p99_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s")


def by_class(detailed: Mapping[str, Any], short_max_tokens: int, long_min_tokens: int) -> dict[str, dict[str, Any]]:
    """`CLASS_METRICS` of the successful requests whose output had at most
    `short_max_tokens` tokens (`short`), at least `long_min_tokens` (`long`), and of all."""
    done = [(out, ttft, e2el) for out, ttft, e2el, error in zip(
        detailed["output_lens"], detailed["ttfts"], detailed["latencies"], detailed["errors"], strict=True)
        if not error and out > 0]
    members = {"short": [r for r in done if r[0] <= short_max_tokens],
               "long": [r for r in done if r[0] >= long_min_tokens], "all": done}
    return {name: figures(rows) for name, rows in members.items()}


def figures(rows: list[tuple[int, float, float]]) -> dict[str, Any]:
    e2els, ttfts = [r[2] for r in rows], [r[1] for r in rows]
    tpots = [(e2el - ttft) / (out - 1) for out, ttft, e2el in rows if out > 1]
    return {"count": len(rows),
            "e2el_p50_s": _q(e2els, 0.5), "e2el_p99_s": _q(e2els, 0.99),
            "ttft_p50_s": _q(ttfts, 0.5), "ttft_p99_s": _q(ttfts, 0.99), "tpot_p50_s": _q(tpots, 0.5)}


def _q(values: list[float], q: float) -> float | None:
    return quantile(values, q) if values else None
