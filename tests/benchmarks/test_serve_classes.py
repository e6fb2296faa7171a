"""Per-class figures from a `vllm bench serve` detailed result, by actual output length."""

from __future__ import annotations

import pytest

from benchmarks.serve_classes import by_class

DETAILED = {  # five requests: 10, 40, 41, 200 tokens, and one failed
    "output_lens": [10, 40, 41, 200, 0],
    "ttfts": [0.1, 0.2, 0.3, 0.4, 0.0],
    "latencies": [1.0, 2.15, 3.0, 9.35, 0.0],
    "errors": ["", "", "", "", "connection reset"],
}


def test_requests_are_grouped_by_the_length_they_produced_and_failures_left_out():
    classes = by_class(DETAILED, short_max_tokens=40, long_min_tokens=128)
    assert [classes[name]["count"] for name in ("short", "long", "all")] == [2, 1, 4]
    short = classes["short"]
    assert short["e2el_p50_s"] == pytest.approx(1.575)  # between 1.0 and 2.15
    assert short["e2el_p99_s"] == pytest.approx(1.0 + 0.99 * 1.15)
    assert short["tpot_p50_s"] == pytest.approx((0.1 + 0.05) / 2)  # 0.9/9 and 1.95/39
    assert classes["long"]["tpot_p50_s"] == pytest.approx(8.95 / 199)


def test_a_class_nobody_fell_in_has_no_figures():
    classes = by_class(DETAILED, short_max_tokens=5, long_min_tokens=1000)
    assert classes["short"] == {"count": 0, "e2el_p50_s": None, "e2el_p99_s": None, "ttft_p50_s": None,
                                "ttft_p99_s": None, "tpot_p50_s": None}
