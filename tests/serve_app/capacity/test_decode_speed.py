"""Per-deployment decode speed and the Spot output cap, fed scripted observations."""

from __future__ import annotations

import math

import pytest

from serve_app.capacity.decode_speed import DecodeSpeed
from serve_app.config import NoticeCapConfig
from serve_app.quantile import quantile

CONFIG = NoticeCapConfig(percentile=10, min_samples=4, max_samples=20, default_tokens_per_s=5,
                         prefill_allowance_s=5, min_tokens=16, min_sample_tokens=8)
WINDOW_S, MARGIN_S = 120.0, 10.0
BUDGET_S = WINDOW_S - MARGIN_S - CONFIG.prefill_allowance_s


def feed(cap: DecodeSpeed, pool: str, speeds: list[float], tokens: int = 101) -> None:
    """One finished request per speed: `tokens` output tokens decoded at that speed."""
    for speed in speeds:
        cap.observe(pool, output_tokens=tokens, decode_s=(tokens - 1) / speed)


def test_cold_pool_uses_the_default_speed():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    feed(cap, "short-spot", [50.0] * (CONFIG.min_samples - 1))
    assert cap.tokens_per_s("short-spot") == CONFIG.default_tokens_per_s
    assert cap.cap("short-spot") == math.floor(CONFIG.default_tokens_per_s * BUDGET_S)


def test_warm_pool_caps_at_a_low_percentile_of_measured_speed():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    speeds = [40.0 + 3 * i for i in range(11)]  # 40 .. 70 tok/s
    feed(cap, "long-spot", list(reversed(speeds)))
    slow = quantile(speeds, 0.10)
    assert slow == 43.0  # 11 speeds: the 10th percentile is the second slowest
    assert cap.tokens_per_s("long-spot") == pytest.approx(slow)
    assert cap.cap("long-spot") == math.floor(slow * BUDGET_S)
    assert cap.cap("long-spot") < math.floor(sum(speeds) / len(speeds) * BUDGET_S)


def test_pools_are_measured_apart():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    feed(cap, "fast", [100.0] * 8)
    feed(cap, "slow", [10.0] * 8)
    assert cap.cap("fast") == math.floor(100.0 * BUDGET_S)
    assert cap.cap("slow") == math.floor(10.0 * BUDGET_S)


def test_old_samples_age_out_when_the_pool_slows_down():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    feed(cap, "p", [80.0] * CONFIG.max_samples)
    before = cap.cap("p")
    feed(cap, "p", [20.0] * CONFIG.max_samples)
    assert cap.cap("p") == math.floor(20.0 * BUDGET_S) < before


def test_short_or_untimed_requests_are_not_sampled():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    feed(cap, "p", [500.0] * 10, tokens=CONFIG.min_sample_tokens - 1)
    for _ in range(10):
        cap.observe("p", output_tokens=50, decode_s=0.0)
    assert cap.tokens_per_s("p") == CONFIG.default_tokens_per_s


def test_first_token_is_not_counted_as_decoded():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    for _ in range(CONFIG.min_samples):
        cap.observe("p", output_tokens=11, decode_s=2.0)
    assert cap.tokens_per_s("p") == pytest.approx(10 / 2.0)


def test_floor_holds_for_a_very_slow_pool():
    cap = DecodeSpeed(CONFIG, WINDOW_S, MARGIN_S)
    feed(cap, "p", [0.01] * 8)
    assert math.floor(0.01 * BUDGET_S) < CONFIG.min_tokens == cap.cap("p")


def test_shorter_window_gives_a_smaller_cap():
    wide, narrow = DecodeSpeed(CONFIG, 120, MARGIN_S), DecodeSpeed(CONFIG, 60, MARGIN_S)
    for cap in (wide, narrow):
        feed(cap, "p", [30.0] * 8)
    assert narrow.cap("p") < wide.cap("p")


def test_window_without_decode_time_is_refused():
    with pytest.raises(ValueError, match="no decode time"):
        DecodeSpeed(CONFIG, window_s=14, margin_s=10)
