"""The app's real batcher through the simulator: its policies change simulated
outcomes the way they change live ones, and every request is accounted for."""

from __future__ import annotations

import random

import pytest

from benchmarks import metrics
from benchmarks.fleetsim import virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter, PowerOfTwoRouter
from benchmarks.fleetsim.simulate import SimApp, SimRequest, VllmServeSim, closed_loop, open_loop
from benchmarks.fleetsim.step_time import LinearStepTime
from serve_app.config.app import app_configs, load_serve_config
from tests.conftest import REPO

STEP = LinearStepTime(base_us=10_000, per_decode_seq_us=1_000, per_prefill_token_us=100, per_context_token_us=0)
SHORT = "Answer yes or no: is the sea salty?"
LONG = "Write a long story about a lighthouse."


def config(name: str):
    (app,) = app_configs(load_serve_config(REPO / "configs" / name)).values()
    return app


def mixed(count: int, rate: float, seed: int = 0) -> list[SimRequest]:
    """Half short answers (8 tokens), half long (200), one `max_tokens` for all, Poisson arrivals."""
    rng, at, requests = random.Random(seed), 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        short = rng.random() < 0.5
        requests.append(SimRequest(20, 8 if short else 200, 256, (("user", SHORT if short else LONG),),
                                   kind="short" if short else "long", arrival_s=at))
    return requests


def short_p90(config_name: str) -> float:
    async def main():
        app = SimApp(config(config_name), STEP, LeastLoadedRouter())
        await closed_loop(app, mixed(48, 1.0, seed=1), concurrency=4)  # the predictor learns both instructions
        records, _ = await open_loop(app, mixed(300, 9.0))
        assert all(record.ok for record in records)
        return metrics.distribution(r.e2el_s for r in records if r.kind == "short")["p90"]

    return virtual_time.run(main())


def test_length_awareness_lets_short_answers_past_long_ones_under_load():
    on, off = short_p90("local.yaml"), short_p90("local-nobuckets.yaml")
    assert on < off / 3, (on, off)


def test_the_app_over_one_engine_matches_the_engine_alone_when_nothing_queues():
    requests = [SimRequest(30, 64, 64, (("user", LONG),), ignore_eos=True) for _ in range(16)]

    async def main(system: str):
        app = SimApp(config("local.yaml"), STEP, PowerOfTwoRouter()) if system == "app" \
            else VllmServeSim(config("local.yaml"), STEP)
        records, duration = await closed_loop(app, requests, concurrency=8)
        return metrics.summarize(records, duration)

    app, alone = virtual_time.run(main("app")), virtual_time.run(main("vllm"))
    assert app["completed"] == alone["completed"] == 16
    assert app["output_throughput"] == pytest.approx(alone["output_throughput"], rel=0.01)
