"""The mixed workload's generator and statistics (pure, no servers)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from benchmarks.common import percentile, ratios
from benchmarks.workload import (
    Outcome,
    WorkloadSpec,
    class_stats,
    generate,
    mean_output_tokens,
    ratios_by_class,
    saturated_output_tok_per_s,
    stats_by_class,
)


def spec(**overrides) -> WorkloadSpec:
    return WorkloadSpec(**{"requests": 2000, "rate_per_s": 4.0, "seed": 7, **overrides})


def test_same_seed_same_sequence_other_seed_differs():
    assert generate(spec()) == generate(spec())
    assert generate(spec()) != generate(spec(seed=8))


def test_rate_moves_arrivals_but_keeps_the_requests():
    slow, fast = generate(spec(rate_per_s=1.0)), generate(spec(rate_per_s=8.0))
    assert [(p.kind, p.max_tokens, p.prompt) for p in slow] == [(p.kind, p.max_tokens, p.prompt) for p in fast]
    assert slow[-1].arrival_s > 4 * fast[-1].arrival_s


def test_class_mix_and_token_ranges():
    plan = generate(spec(short_share=0.8))
    shorts = [p for p in plan if p.kind == "short"]
    longs = [p for p in plan if p.kind == "long"]
    assert abs(len(shorts) / len(plan) - 0.8) < 0.03  # ~3.5 standard deviations at n=2000
    assert {p.max_tokens for p in shorts} <= set(range(16, 33)) and len({p.max_tokens for p in shorts}) > 10
    assert {p.max_tokens for p in longs} <= set(range(256, 385))
    assert not any(p.ignore_eos for p in shorts) and all(p.ignore_eos for p in longs)
    assert all(p.prompt == f"What is the capital of {p.params['country']}? Answer in one sentence." for p in shorts)
    assert all(p.params["topic"] in p.prompt for p in longs)
    assert {p.kind for p in generate(spec(short_share=1.0))} == {"short"}


def test_poisson_interarrivals_have_the_rate_as_mean():
    plan = generate(spec(rate_per_s=4.0))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(plan)]
    assert all(gap > 0 for gap in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.07)
    # exponential: the standard deviation equals the mean
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.1)


def test_mean_max_tokens_and_bad_ranges():
    assert spec(short_share=0.8).mean_max_tokens() == pytest.approx(0.8 * 24 + 0.2 * 320)
    with pytest.raises(ValueError, match="long_max_tokens"):
        spec(long_max_tokens=(384, 256))


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    assert percentile(reversed(values), 50) == 51.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0 and percentile(values, 0) == 1.0
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))


def test_ratios_skip_missing_and_zero_baselines():
    got = ratios({"a": 3.0, "b": 1.0, "c": 2.0, "d": None}, {"a": 2.0, "b": 0.0, "d": 1.0}, ["a", "b", "c", "d"])
    assert got == {"a": 1.5, "b": None, "c": None, "d": None}


def ok(index, kind, latency, ttft, tokens):
    return Outcome(index, kind, "ok", sent_s=0.0, latency_s=latency, ttft_s=ttft, output_tokens=tokens)


def test_class_stats_count_every_failure_and_measure_only_completions():
    outcomes = [ok(0, "short", 1.0, 0.1, 10), ok(1, "short", 3.0, 0.3, 20),
                Outcome(2, "short", "429", sent_s=0.0, retry_after="1"),
                Outcome(3, "short", "503", sent_s=0.0),
                Outcome(4, "short", "stream_error", sent_s=0.0)]
    stats = class_stats(outcomes, wall_s=10.0)
    assert (stats.requests, stats.ok) == (5, 2)
    assert stats.errors == {"429": 1, "503": 1, "stream_error": 1}
    assert stats.refused_without_retry_after == 1
    assert (stats.output_tokens, stats.output_tok_per_s, stats.req_per_s) == (30, 3.0, 0.2)
    assert (stats.latency_p50_s, stats.latency_p99_s, stats.ttft_p99_s) == (1.0, 3.0, 0.3)
    with pytest.raises(ValueError):
        class_stats(outcomes, wall_s=0)


def test_stats_by_class_split_and_ratios_to_baseline():
    ours = stats_by_class([ok(0, "short", 1.0, 0.2, 10), ok(1, "long", 8.0, 0.5, 300)], wall_s=10.0)
    assert (ours["short"].requests, ours["long"].requests, ours["all"].requests) == (1, 1, 2)
    assert ours["all"].output_tokens == 310
    base = stats_by_class([ok(0, "short", 4.0, 0.4, 10), ok(1, "long", 8.0, 1.0, 200)], wall_s=10.0)
    got = ratios_by_class(ours, base)
    assert got["short"]["latency_p99_s"] == 0.25 and got["short"]["ttft_p99_s"] == 0.5
    assert got["long"]["output_tok_per_s"] == 1.5 and got["all"]["req_per_s"] == 1.0


def test_a_class_without_completions_has_no_percentiles_or_ratios():
    ours = stats_by_class([Outcome(0, "long", "503", sent_s=0.0), ok(1, "short", 1.0, 0.1, 5)], wall_s=1.0)
    assert ours["long"].latency_p99_s is None and ours["long"].output_tok_per_s == 0.0
    base = stats_by_class([ok(0, "long", 2.0, 0.1, 5), ok(1, "short", 1.0, 0.1, 5)], wall_s=1.0)
    assert ratios_by_class(ours, base)["long"]["latency_p99_s"] is None


def done(index, kind, sent, ttft, latency, tokens):
    return Outcome(index, kind, "ok", sent_s=sent, latency_s=latency, ttft_s=ttft, output_tokens=tokens)


def test_saturated_tokens_count_what_was_streamed_until_the_last_send():
    # the last request is sent at t=2; the long one streams 300 tokens evenly over t=1..7
    outcomes = [done(0, "short", 0.0, 0.5, 1.0, 10), done(1, "long", 0.0, 1.0, 7.0, 300),
                done(2, "short", 1.0, 0.5, 1.0, 10), done(3, "short", 2.0, 0.5, 1.0, 10),
                Outcome(4, "short", "503", sent_s=1.5)]
    assert saturated_output_tok_per_s(outcomes) == pytest.approx((10 + 300 / 6 + 10) / 2)
    with pytest.raises(ValueError):
        saturated_output_tok_per_s([done(0, "short", 0.0, 0.5, 1.0, 10)])


def test_mean_output_tokens_weights_the_classes_by_the_mix():
    outcomes = [done(0, "short", 0, 0.1, 1, 10), done(1, "short", 0, 0.1, 1, 20), done(2, "long", 0, 0.1, 9, 300),
                Outcome(3, "long", "503", sent_s=0.0)]
    assert mean_output_tokens(outcomes, short_share=0.8) == pytest.approx(0.8 * 15 + 0.2 * 300)
