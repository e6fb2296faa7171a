"""The offline predictor benchmark's pieces: the cut-short ShareGPT reader, Kendall tau-b,
the settle point and the online protocol."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import sharegpt
from benchmarks.predictor_bench import Fixed, Request, full_class, kendall_tau_b, run, settle_point
from serve_app.config import PredictorConfig
from serve_app.scheduling.predictor import LengthPredictor
from serve_app.scheduling.prompt_features import SamplingSummary


def test_a_cut_short_file_gives_its_whole_conversations():
    text = ('[{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},\n'
            ' {"id": "b", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "q"}, '
            '{"from": "gpt", "value": "answer"}]}, {"id": "c", "conversations": [{"from": "human", "va')
    items = list(sharegpt.conversations(text))
    assert [i["id"] for i in items] == ["a", "b"]
    assert sharegpt.first_exchange(items[0]) == sharegpt.Conversation((("user", "hi"),), "hello")
    assert sharegpt.first_exchange(items[1]).messages == (("assistant", "x"), ("user", "q"))
    assert sharegpt.first_exchange({"conversations": [{"from": "human", "value": "unanswered"}]}) is None


def brute_tau_b(x, y):
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    pairs = list(itertools.combinations(range(len(x)), 2))
    concordance = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i, j in pairs)
    untied_x = sum(x[i] != x[j] for i, j in pairs)
    untied_y = sum(y[i] != y[j] for i, j in pairs)
    return concordance / (untied_x * untied_y) ** 0.5


def test_kendall_tau_b_matches_the_pairwise_definition_with_ties():
    x, y = [1, 2, 2, 5, 3, 9, 1], [10, 20, 5, 5, 30, 40, 1]
    assert kendall_tau_b(x, y, chunk=3) == pytest.approx(brute_tau_b(x, y))
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau_b([4, 4, 4], [1, 2, 3]) is None


def test_settle_point_is_where_the_curve_stays_near_its_final_level():
    # final level 0.8 +- 3 * sqrt(0.8 * 0.2 / 300) = 0.069; smoothed: 0.5, 0.55, 0.633, 0.737, 0.803, 0.8
    assert settle_point([0.5, 0.6, 0.8, 0.81, 0.8, 0.79], window=100) == 300
    assert settle_point([0.8] * 4, window=10) == 0


def test_requests_are_observed_after_later_arrivals_and_learned_as_the_batcher_learns():
    sampling = SamplingSummary(max_tokens=300)
    requests = [Request((("user", f"Say hello {i}"),), sampling, 3, "stop") for i in range(6)]
    requests += [Request((("user", "Say hello again"),), sampling, 300, "length")] * 4
    predictor = LengthPredictor(PredictorConfig(min_samples=100, model_min_samples=3))
    got = run("app", full_class, predictor, requests, in_flight=2, long_tokens=128, window=5)
    # the 3rd request is observed as the 5th arrives, after its prediction: the model answers from the 6th on. The 7th
    # and 8th (predicted about 3 by the model, cut at 300: past the long edge of 128) are learned too, as the
    # batcher learns them (`worth_learning`); the 9th and 10th are still running at the end
    assert got["sources"] == {"max_tokens": 5, "model": 5} and predictor._models[None].samples == 8
    assert got["requests"] == 10 and [w["requests"] for w in got["learning_curve"]] == [5, 5]
    assert run("k", full_class, Fixed(7), requests, 0, 128, 5)["mae_tokens"] == pytest.approx((6 * 4 + 4 * 293) / 10)
