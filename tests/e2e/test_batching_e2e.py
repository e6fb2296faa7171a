"""Length-aware scheduling, admission and operator views on the shipped local app (real model)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"


def stats(live_app: str) -> dict:
    return httpx.get(live_app.removesuffix("/v1") + "/stats", timeout=30).json()


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


def test_short_answers_do_not_wait_behind_long_ones(live_app):
    pool_stats = []  # the pool every 0.25 s, from the first long request to the last short one

    async def sample() -> None:
        while True:
            pool_stats.append((await asyncio.to_thread(stats, live_app))["pools"]["smollm2-135m-instruct/default"])
            await asyncio.sleep(0.25)

    async def run():
        client = openai.AsyncOpenAI(base_url=live_app, api_key="unused", max_retries=0, timeout=300)

        def ask(n: int, max_tokens: int):
            return client.completions.create(
                model=MODEL, prompt=f"Story {n}:", max_tokens=max_tokens, extra_body={"ignore_eos": True}
            )

        sampler = asyncio.create_task(sample())
        longs = [asyncio.create_task(timed(ask(n, 384))) for n in range(12)]
        await asyncio.sleep(3)  # the long requests are running now
        waves = []
        for wave in range(4):
            waves.append(await asyncio.gather(*(timed(ask(n, 16)) for n in range(wave * 6, wave * 6 + 6))))
        sampler.cancel()
        # The sampler's polls share a busy machine (a CI run got one in 35 s): the state
        # the waves left is read once more, before the reserve lapses 10 s after them.
        pool_stats.append((await asyncio.to_thread(stats, live_app))["pools"]["smollm2-135m-instruct/default"])
        return waves, sorted(await asyncio.gather(*longs))

    waves, longs = asyncio.run(run())
    shorts = sorted(seconds for wave in waves for seconds in wave)
    short_p95, long_p50 = shorts[-2], longs[len(longs) // 2]
    seen = [(pool["in_flight"], pool["long_in_flight"], pool["waiting"], pool["long_cap"]) for pool in pool_stats]
    print(f"\n[e2e] short p50 {shorts[len(shorts) // 2]:.2f}s p95 {short_p95:.2f}s max {shorts[-1]:.2f}s; "
          f"long p50 {long_p50:.1f}s min {longs[0]:.1f}s; short waves {[[round(t, 2) for t in wave] for wave in waves]}; "
          f"pool (in flight, long, waiting, long cap) every 0.25 s: {seen}")
    # One CI run saw one short request of 24 take 16.9 s (the rest about 1.2 s), not
    # reproduced in 10 runs since: the p95 must be short, and no short one as slow as a long one.
    assert short_p95 < long_p50 / 4 and shorts[-1] < long_p50
    # Nothing waited: all twelve long requests ran at once under their cap, and the short
    # ones took the reserve, sized to the six each wave held (seven if one ended late).
    assert max(pool["long_in_flight"] for pool in pool_stats) == 12
    assert all(pool["waiting"] == 0 and pool["long_in_flight"] <= pool["long_cap"] for pool in pool_stats)
    assert pool_stats[-1]["slots"] == 32 and 32 - 7 <= pool_stats[-1]["long_cap"] <= 32 - 6


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
