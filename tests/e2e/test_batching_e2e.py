"""Length-aware scheduling, admission and operator views on the shipped local app (real model)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.e2e.saturation import SLOTS, WAVE, run_saturated, shorts_skip_the_queue

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"


def stats(live_app: str) -> dict:
    return httpx.get(live_app.removesuffix("/v1") + "/stats", timeout=30).json()


def test_short_answers_do_not_wait_behind_long_ones(live_app):
    """Long requests saturate the slots and queue; short ones skip both (the same run
    with length awareness off fails this check: tests/e2e_nobuckets)."""
    run = run_saturated(live_app, reserve=True)
    print(f"\n[e2e] length awareness on: {run.describe()}")
    assert shorts_skip_the_queue(run)
    # Long requests queued and always left short ones a reserve: the six each wave
    # held (seven if one ended late), less one while a wave measured spread out (a
    # cap that shrinks stops no running request). It ended at the whole wave.
    states = run.pool_states
    assert max(pool["waiting"] for pool in states) > 0
    assert all(pool["long_in_flight"] <= SLOTS - (WAVE - 1) for pool in states)
    assert states[-1]["slots"] == SLOTS and SLOTS - 7 <= states[-1]["long_cap"] <= SLOTS - WAVE


def test_the_engine_runs_in_the_dtype_this_cpu_supports_and_the_app_is_ready(live_app):
    from serve_app.engine.cpu_dtype import cpu_flags, resolve_cpu_dtype

    engines = stats(live_app)["pools"]["smollm2-135m-instruct/default"]["engines"]
    (info,) = engines.values()
    assert info["dtype"] == resolve_cpu_dtype("auto", cpu_flags()).dtype and info["dtype_reason"].startswith("auto")
    ready = httpx.get(live_app.removesuffix("/v1") + "/ready", timeout=30)
    assert ready.status_code == 200 and ready.json()["ready"]


def test_overload_is_refused_with_retry_after_and_every_accepted_request_completes(live_app):
    async def run():
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=500)
        async with httpx.AsyncClient(base_url=live_app, timeout=300, limits=limits) as http:
            body = {"model": MODEL, "prompt": "Count:", "max_tokens": 24, "ignore_eos": True, "priority": "batch"}
            return await asyncio.gather(*(http.post("/completions", json=body) for _ in range(320)))

    responses = asyncio.run(run())
    codes = [response.status_code for response in responses]
    accepted = [response for response in responses if response.status_code == 200]
    refused = [response for response in responses if response.status_code == 503]
    print(f"\n[e2e] overload: {len(accepted)} accepted, {len(refused)} refused")
    assert len(accepted) + len(refused) == len(codes)
    assert refused and all(int(response.headers["retry-after"]) >= 1 for response in refused)
    assert all(response.json()["usage"]["completion_tokens"] == 24 for response in accepted)
    assert refused[0].json()["error"]["code"] == "overloaded"
