"""Off-peak on the real tiny model: `serve run configs/local-offpeak.yaml`.

The big pool starts at zero and follows the ingress's queue duration
(application-level policy); realtime requests are answered by the tiny tier
meanwhile, queued batch demand brings a big replica up, traffic moves back to
it, and after idling it returns to zero.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.conftest import CAPITAL_QUESTION as CAPITAL
from tests.e2e_offpeak.conftest import BIG, TINY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def big_replicas(base_url: str) -> int:
    stats = httpx.get(base_url.removesuffix("/v1") + "/stats", timeout=30).json()
    return stats["pools"][f"{BIG}/default"]["replicas"]["any"]


def wait_for(base_url: str, replicas: int, timeout_s: float) -> float:
    start = time.monotonic()
    while big_replicas(base_url) != replicas:
        assert time.monotonic() - start < timeout_s, f"big pool not at {replicas} after {timeout_s}s"
        time.sleep(2)
    return time.monotonic() - start


def test_tiny_tier_serves_at_zero_demand_scales_up_and_idle_returns_to_zero(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=400)
    assert big_replicas(base_url) == 0
    reply = client.chat.completions.create(model=BIG, messages=CAPITAL, max_tokens=12, temperature=0)
    assert reply.model == TINY and "Paris" in reply.choices[0].message.content

    async def batch_demand():
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=400)
        return await asyncio.gather(*(
            aclient.chat.completions.create(
                model=BIG, messages=CAPITAL, max_tokens=8, extra_body={"priority": "batch"}
            )
            for _ in range(6)
        ))

    started = time.monotonic()
    batch = asyncio.run(batch_demand())  # waits in the big pool's queue until a replica is up
    print(f"\n[offpeak] queued batch demand served by a new big replica after {time.monotonic() - started:.0f}s")
    assert {reply.model for reply in batch} == {BIG}
    assert big_replicas(base_url) == 1
    assert client.chat.completions.create(model=BIG, messages=CAPITAL, max_tokens=4).model == BIG

    idle = wait_for(base_url, 0, timeout_s=300)
    print(f"[offpeak] big pool back at zero {idle:.0f}s after the last request")
    assert client.chat.completions.create(model=BIG, messages=CAPITAL, max_tokens=4).model == TINY
    cost = httpx.get(base_url + "/cost", timeout=30).json()
    # big: 6 batch + 1 realtime; tiny: 2 realtime + the readiness probe
    assert cost["by_model"][BIG]["requests"] == 7 and cost["by_model"][TINY]["requests"] == 3
    assert cost["by_model"][BIG]["cost_usd"] > 0 and cost["cost_per_1k_requests_usd"] > 0
    print(f"[offpeak] cost: {cost['cost_usd']:.5f} USD, {cost['cost_per_1k_requests_usd']:.3f} USD per 1k requests")
