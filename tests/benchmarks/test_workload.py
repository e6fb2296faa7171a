"""The mixed workload's generator (pure, seeded) and its calibration figures."""

from __future__ import annotations

import itertools
import statistics

import pytest

from benchmarks.common import ratio, ratios
from benchmarks.metrics import RequestRecord
from benchmarks.mixed_setup import body, short_template_prompt
from benchmarks.predictor_replay import prompt_class
from benchmarks.systems import System, first_app
from benchmarks.workload import (
    TRUE_PRIORITY,
    WorkloadSpec,
    generate,
    mean_output_tokens,
    saturated_output_tok_per_s,
)
from tests.conftest import REPO


def spec(**overrides) -> WorkloadSpec:
    return WorkloadSpec(**{"requests": 4000, "rate_per_s": 4.0, "seed": 7, **overrides})


def test_same_seed_same_sequence_other_seed_differs():
    assert generate(spec()) == generate(spec())
    assert generate(spec()) != generate(spec(seed=8))


def test_rate_moves_arrivals_but_keeps_the_requests():
    slow, fast = generate(spec(rate_per_s=1.0)), generate(spec(rate_per_s=8.0))
    assert [(p.kind, p.max_tokens, p.prompt) for p in slow] == [(p.kind, p.max_tokens, p.prompt) for p in fast]
    assert slow[-1].arrival_s > 4 * fast[-1].arrival_s


def test_class_mix_token_ranges_and_prompts():
    plan = generate(spec())
    by_kind = {kind: [p for p in plan if p.kind == kind] for kind in ("short", "other", "long")}
    for kind, share in (("short", 0.8), ("other", 0.1), ("long", 0.1)):
        assert abs(len(by_kind[kind]) / len(plan) - share) < 0.025  # ~4 standard deviations at n=4000
    assert {p.max_tokens for p in by_kind["short"]} == {128}
    assert {p.max_tokens for p in by_kind["other"]} == {256}
    assert {p.max_tokens for p in by_kind["long"]} <= set(range(256, 385)) and len(
        {p.max_tokens for p in by_kind["long"]}) > 50
    assert not any(p.ignore_eos for p in by_kind["short"] + by_kind["other"])
    assert all(p.ignore_eos for p in by_kind["long"])
    assert all(p.prompt == f"What is the capital of {p.params['country']}? Answer in one sentence."
               for p in by_kind["short"])
    assert all(p.prompt.startswith(f"List {p.params['count']} facts about {p.params['topic']}")
               for p in by_kind["other"])
    assert {int(p.params["count"]) for p in by_kind["other"]} == set(range(3, 13))
    assert all(p.prompt.startswith(f"Write a long story about {p.params['topic']}.") for p in by_kind["long"])
    assert {p.kind for p in generate(spec(short_share=1.0, other_share=0.0))} == {"short"}


def test_each_class_is_its_own_prompt_class_for_the_apps_predictor():
    plan = generate(spec(requests=500))
    keys = {kind: {prompt_class(p, as_template=True).key() for p in plan if p.kind == kind}
            for kind in ("short", "other", "long")}
    assert keys["short"] == {"template:capital"}
    assert len(keys["other"]) == 1 and len(keys["long"]) == 1 and keys["other"] != keys["long"]
    # sent as plain text (a baseline, or --no-templates) the short prompt still differs from the others
    plain = {prompt_class(p, as_template=False).key() for p in plan if p.kind == "short"}
    assert plain.isdisjoint(keys["other"] | keys["long"])
    # the warm-up prompt is in none of them
    assert "chat:2^2" not in keys["other"] | keys["long"] | plain


def test_poisson_interarrivals_have_the_rate_as_mean():
    plan = generate(spec(rate_per_s=4.0))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(plan)]
    assert all(gap > 0 for gap in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.08)  # exponential


def test_shares_and_validation():
    assert spec().shares() == pytest.approx({"short": 0.8, "other": 0.1, "long": 0.1})
    assert spec().mean_max_tokens() == pytest.approx(0.8 * 128 + 0.1 * 256 + 0.1 * 320)
    with pytest.raises(ValueError, match="long_max_tokens"):
        spec(long_max_tokens=(384, 256))
    with pytest.raises(ValueError, match="must not exceed 1"):
        spec(short_share=0.8, other_share=0.3)


def test_request_bodies_per_system():
    app_config = first_app(REPO / "configs/local.yaml")
    short_text = short_template_prompt(app_config)
    plan = generate(spec(requests=50, short_prompt=short_text))
    short = next(p for p in plan if p.kind == "short")
    long = next(p for p in plan if p.kind == "long")
    app = System("app", lambda: None, "", {}, uses_template=True)
    vllm = System("vllm", lambda: None, "", {})
    priority = System("vllm-priority", lambda: None, "", {}, true_priority=True)
    assert body(app, short, "m", True) == {"model": "m", "max_tokens": 128, "temperature": 0, "ignore_eos": False,
                                            "messages": [], "template": "capital", "params": short.params}
    rendered = app_config.templates["capital"].prompt.format(**short.params)
    assert body(vllm, short, "m", True)["messages"] == [{"role": "user", "content": rendered}]
    assert body(app, short, "m", False)["messages"][0]["content"] == rendered
    assert body(priority, short, "m", True)["priority"] == TRUE_PRIORITY["short"] == 0
    assert body(priority, long, "m", True)["priority"] == 2 and body(priority, long, "m", True)["ignore_eos"]
    assert "priority" not in body(vllm, long, "m", True)


def done(kind, start, ttft, e2el, tokens):
    return RequestRecord(kind=kind, start_s=start, ttft_s=ttft, e2el_s=e2el, output_tokens=tokens)


def test_saturated_tokens_count_what_was_streamed_until_the_last_send():
    # the last request is sent at t=2; the long one streams 300 tokens evenly over t=1..7
    records = [done("short", 0.0, 0.5, 1.0, 10), done("long", 0.0, 1.0, 7.0, 300), done("short", 1.0, 0.5, 1.0, 10),
               done("short", 2.0, 0.5, 1.0, 10), RequestRecord(status="http_503", kind="short", start_s=1.5)]
    assert saturated_output_tok_per_s(records) == pytest.approx((10 + 300 / 6 + 10) / 2)
    with pytest.raises(ValueError):
        saturated_output_tok_per_s([done("short", 0.0, 0.5, 1.0, 10)])


def test_mean_output_tokens_weights_the_classes_by_the_mix():
    records = [done("short", 0, 0.1, 1, 10), done("short", 0, 0.1, 1, 20), done("other", 0, 0.1, 1, 100),
               done("long", 0, 0.1, 9, 300), RequestRecord(status="timeout", kind="long")]
    shares = {"short": 0.8, "other": 0.1, "long": 0.1}
    assert mean_output_tokens(records, shares) == pytest.approx(0.8 * 15 + 0.1 * 100 + 0.1 * 300)


def test_ratios_skip_missing_and_zero_baselines():
    got = ratios({"a": 3.0, "b": 1.0, "c": 2.0, "d": None}, {"a": 2.0, "b": 0.0, "d": 1.0}, ["a", "b", "c", "d"])
    assert got == {"a": 1.5, "b": None, "c": None, "d": None}
    assert ratio(float("nan"), 1.0) is None
