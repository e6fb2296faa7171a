"""The modelled engine against hand-computed schedules: chunked prefill, the
sequence limit, priority order, KV preemption, stream intervals, finish reasons."""

from __future__ import annotations

import asyncio

import pytest
from vllm.sampling_params import SamplingParams

from benchmarks.fleetsim.engine import EngineShape, SimEngine
from benchmarks.fleetsim.step_time import LinearStepTime
from benchmarks.fleetsim.virtual_time import run
from serve_app.engine.base import GenerationRequest

STEP = LinearStepTime(base_us=10_000, per_decode_seq_us=1_000, per_prefill_token_us=100, per_context_token_us=0)
"""10 ms a step, 1 ms per decoding request, 0.1 ms per prompt token."""


def shape(**overrides) -> EngineShape:
    return EngineShape(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 1024,
                          "kv_cache_tokens": 4096, "block_size": 16, **overrides})


def request(name: str, prompt: int, max_tokens: int = 100, priority: int = 0, ignore_eos: bool = False,
            stream_interval: int = 1) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    return GenerationRequest(name, (0,) * prompt, params, max_tokens=max_tokens, priority=priority,
                             stream_interval=stream_interval)


def serve(engine_shape: EngineShape, answers: dict[str, int], requests: list[GenerationRequest],
          start_after_s: dict[str, float] | None = None):
    """Each request's chunks as (virtual time, tokens, finish reason), and the engine."""
    async def main():
        loop = asyncio.get_running_loop()
        engine = SimEngine(engine_shape, STEP, lambda r: answers[r.request_id])
        engine.start()

        async def one(generation: GenerationRequest):
            await asyncio.sleep((start_after_s or {}).get(generation.request_id, 0.0))
            return [(round(loop.time(), 6), c.num_tokens, c.finish_reason) async for c in engine.stream(generation)]

        chunks = await asyncio.gather(*(one(r) for r in requests))
        engine.stop()
        return dict(zip([r.request_id for r in requests], chunks, strict=True)), engine

    return run(main())


def test_one_request_prefills_then_decodes_a_token_a_step_and_ends_by_itself():
    chunks, engine = serve(shape(), {"a": 3}, [request("a", prompt=40)])
    prefill, decode = 0.010 + 40 * 0.0001, 0.010 + 0.001
    assert chunks["a"] == [(pytest.approx(prefill), 1, None), (pytest.approx(prefill + decode), 1, None),
                           (pytest.approx(prefill + 2 * decode), 1, "stop")]
    assert engine.steps == 3 and engine.preemptions == 0


def test_a_prompt_over_the_token_budget_is_prefilled_in_chunks():
    chunks, engine = serve(shape(), {"a": 1}, [request("a", prompt=100)])
    assert chunks["a"] == [(pytest.approx(0.010 + 64 * 0.0001 + 0.010 + 36 * 0.0001), 1, "stop")]
    assert engine.steps == 2


def test_max_tokens_and_ignore_eos_end_with_length():
    chunks, _ = serve(shape(), {"cut": 50, "forced": 2},
                      [request("cut", 8, max_tokens=4), request("forced", 8, max_tokens=5, ignore_eos=True)])
    assert [(n, reason) for _, n, reason in chunks["cut"]][-1] == (1, "length") and len(chunks["cut"]) == 4
    assert sum(n for _, n, _ in chunks["forced"]) == 5 and chunks["forced"][-1][2] == "length"


def test_past_max_num_seqs_a_request_waits_and_the_higher_priority_one_goes_first():
    answers = {"running": 5, "low": 2, "high": 2}
    requests = [request("running", 8), request("low", 8, priority=9), request("high", 8, priority=1)]
    chunks, _ = serve(shape(max_num_seqs=1), answers, requests, start_after_s={"low": 0.001, "high": 0.002})
    assert chunks["high"][0][0] < chunks["low"][0][0]  # arrived later, ran first
    assert chunks["running"][-1][0] < chunks["high"][0][0]  # only once the running one ended


def test_a_full_kv_cache_preempts_the_lowest_priority_request_which_is_recomputed_and_completes():
    # 8 blocks of 16 tokens: two 48-token prompts fit (3 blocks each), growing past 64 tokens they do not.
    answers = {"urgent": 40, "later": 40}
    requests = [request("urgent", 48, priority=0), request("later", 48, priority=5)]
    chunks, engine = serve(shape(kv_cache_tokens=128, max_num_batched_tokens=256), answers, requests)
    assert engine.preemptions >= 1
    assert sum(n for _, n, _ in chunks["urgent"]) == 40 and sum(n for _, n, _ in chunks["later"]) == 40
    assert chunks["urgent"][-1][0] < chunks["later"][-1][0]


def test_the_stream_interval_gathers_tokens_but_the_first_and_last_go_at_once():
    chunks, _ = serve(shape(), {"a": 10}, [request("a", 8, stream_interval=4)])
    assert [n for _, n, _ in chunks["a"]] == [1, 4, 4, 1]


def test_the_routing_load_is_what_the_replica_can_know_its_requests_max_tokens_less_their_output():
    async def main():
        engine = SimEngine(shape(), STEP, lambda r: 3)  # every answer ends after 3 tokens
        engine.start()
        stream = engine.stream(request("a", prompt=8, max_tokens=100))
        first = await anext(stream)
        load = engine.in_flight_tokens()
        async for _ in stream:
            pass
        engine.stop()
        return first.num_tokens, load, engine.in_flight_tokens()

    assert run(main()) == (1, 99, 0)  # not the 2 tokens only the engine knows are left
