"""Replaying recorded requests through the app's length predictor, and its report."""

from __future__ import annotations

import pytest

from benchmarks.metrics import RequestRecord
from benchmarks.predictor_replay import Replayed, accuracy, bin_of, replay, report
from benchmarks.workload import PlannedRequest
from serve_app.config import PredictorConfig

CONFIG = PredictorConfig(min_samples=2, quantile=0.9, window=16)


def short(index, arrival=0.0):
    return PlannedRequest(index, "short", arrival, 128, False, "What is the capital of X? Answer in one sentence.",
                          {"country": "X"})


def done(start, e2el, tokens):
    return RequestRecord(start_s=start, ttft_s=0.1, e2el_s=e2el, output_tokens=tokens)


def test_predictions_see_only_requests_finished_before_they_arrive():
    plan = [short(0), short(1), short(2), short(3), short(4)]
    records = [done(0.0, 1.0, 10),   # ends at 1.0
               done(0.5, 1.0, 20),   # ends at 1.5
               done(1.2, 1.0, 30),   # arrives after one ended: 1 sample < min_samples -> max_tokens
               RequestRecord(status="timeout", start_s=1.6),  # failed: predicted, never observed
               done(5.0, 1.0, 12)]   # 3 samples (10, 20, 30) by now
    got = replay([(plan, records)], CONFIG, as_template=True)
    # at t=1.6: [10, 20] -> ceil(10 + 0.9 * 10) = 19; at t=5: [10, 20, 30] -> ceil(20 + 0.8 * 10) = 28
    assert [(r.n, r.predicted, r.source, r.true_tokens) for r in got] == [
        (1, 128, "max_tokens", 10), (2, 128, "max_tokens", 20), (3, 128, "max_tokens", 30),
        (4, 19, "history", None), (5, 28, "history", 12)]


def test_history_carries_over_the_runs_of_one_server_and_classes_stay_apart():
    story = "Write a long story about the moon. Give it a beginning, a middle and an end, named characters, " \
            "dialogue and vivid descriptions of the places they visit."
    long = [PlannedRequest(i, "long", 0.0, 300, True, story, {"topic": "the moon"}) for i in range(3)]
    first = ([short(0), short(1), long[0]], [done(0.0, 0.5, 10), done(0.1, 0.5, 10), done(0.2, 5.0, 300)])
    second = ([short(0), long[1]], [done(0.0, 0.5, 10), done(0.1, 5.0, 300)])
    got = replay([first, second], CONFIG, as_template=True, labels=["load 0.5", "load 0.9"])
    assert [(r.kind, r.n, r.predicted, r.point) for r in got] == [
        ("short", 1, 128, "load 0.5"), ("short", 2, 128, "load 0.5"), ("long", 1, 300, "load 0.5"),
        ("short", 3, 10, "load 0.9"), ("long", 2, 300, "load 0.9")]  # one long sample: still max_tokens


def item(kind, n, predicted, true):
    return Replayed(kind, n, 128, predicted, "history", true)


def test_accuracy_mae_and_learning_curve():
    items = [item("short", 1, 128, 10), item("short", 2, 20, 12), item("short", 9, 20, 140),
             item("long", 1, 300, 300), item("other", 1, 256, 90), item("short", 3, 20, None)]
    got = accuracy(items, long_tokens=128)
    # right: short#2 (short/short), long#1 (long/long); wrong: short#1, short#9, other#1
    assert got["requests"] == 5 and got["bucket_accuracy"] == pytest.approx(2 / 5)
    assert got["mae_tokens"] == pytest.approx((118 + 8 + 120 + 0 + 166) / 5)
    assert got["true_long_share"] == pytest.approx(2 / 5) and got["predicted_long_share"] == pytest.approx(3 / 5)
    assert accuracy([item("short", 1, 5, None)], 128)["bucket_accuracy"] is None
    assert [bin_of(n) for n in (1, 8, 9, 16, 17, 33, 100)] == [(1, 8), (1, 8), (9, 16), (9, 16), (17, 32),
                                                              (33, 64), (65, 128)]
    full = report(items, 128)
    assert [(b["n_from"], b["n_to"], b["requests"]) for b in full["learning_curve"]["short"]] == [(1, 8, 2),
                                                                                                 (9, 16, 1)]
    assert full["by_class"]["long"]["bucket_accuracy"] == 1.0 and full["overall"]["requests"] == 5
