"""One scenario, run on the shipped app (length awareness on, tests/e2e) and on the
same app with it off (configs/local-nobuckets.yaml, tests/e2e_nobuckets): long
requests saturate the pool's slots and queue, and short ones arrive behind them.

With length awareness the short ones take a reserve of slots sized from their own
measured demand and go ahead of the queued long ones, so they answer in about their
own service time. Without it they wait, first come first served, until a long one
ends. Both packages judge the run with `shorts_skip_the_queue`, expecting opposite
answers: the check is seen to fail where the scheduling it names is absent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import openai

MODEL = "smollm2-135m-instruct"
POOL = f"{MODEL}/default"
SLOTS = 32
"""The shipped configs' `max_num_seqs`: one engine, one pool."""
LONGS = SLOTS + 8
"""More long requests than slots, so some queue whatever the scheduler."""
LONG_TOKENS, SHORT_TOKENS = 192, 16
SHORT_WAVES, WAVE = 4, 6


@dataclass(frozen=True)
class SaturatedRun:
    shorts: list[float]
    """Seconds of each short request that arrived after the long ones, sorted."""
    longs: list[float]
    """Seconds of each long request, sorted."""
    pool: list[dict]
    """The pool's `/stats` every 0.25 s from the first long request to the last short one."""

    @property
    def short_p50(self) -> float:
        return self.shorts[len(self.shorts) // 2]

    @property
    def short_p95(self) -> float:
        return self.shorts[-2]

    @property
    def long_p50(self) -> float:
        return self.longs[len(self.longs) // 2]

    def describe(self) -> str:
        seen = [(p["in_flight"], p["long_in_flight"], p["waiting"], p["long_cap"]) for p in self.pool]
        return (f"short p50 {self.short_p50:.2f}s p95 {self.short_p95:.2f}s max {self.shorts[-1]:.2f}s; "
                f"long p50 {self.long_p50:.1f}s min {self.longs[0]:.1f}s; "
                f"pool (in flight, long, waiting, long cap) every 0.25 s: {seen}")


def shorts_skip_the_queue(run: SaturatedRun) -> bool:
    """Short requests answered in a fraction of a long one's time although long ones
    held the slots and queued: they neither waited for a slot nor behind the queue."""
    return run.short_p95 < run.long_p50 / 4 and run.shorts[-1] < run.long_p50


def pool_stats(base_url: str) -> dict:
    return httpx.get(base_url.removesuffix("/v1") + "/stats", timeout=30).json()["pools"][POOL]


async def _timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


def run_saturated(base_url: str) -> SaturatedRun:
    """A wave of short requests (their demand, which sizes the reserve), then `LONGS`
    long requests at once, then `SHORT_WAVES` waves of short ones while the long ones
    run and queue. Every request is greedy with `ignore_eos`, its length its `max_tokens`."""
    samples: list[dict] = []

    async def sample() -> None:
        while True:
            samples.append(await asyncio.to_thread(pool_stats, base_url))
            await asyncio.sleep(0.25)

    async def run() -> tuple[list[float], list[float]]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

        def ask(n: int, max_tokens: int):
            return client.completions.create(
                model=MODEL, prompt=f"Story {n}:", max_tokens=max_tokens, extra_body={"ignore_eos": True})

        await asyncio.gather(*(ask(n, SHORT_TOKENS) for n in range(WAVE)))
        sampler = asyncio.create_task(sample())
        longs = [asyncio.create_task(_timed(ask(n, LONG_TOKENS))) for n in range(LONGS)]
        await _until_queued(base_url, longs)
        shorts = []
        for wave in range(SHORT_WAVES):
            shorts += await asyncio.gather(*(_timed(ask(n, SHORT_TOKENS)) for n in range(wave * WAVE, (wave + 1) * WAVE)))
        sampler.cancel()
        # The sampler's polls share a busy machine (a CI run got one in 35 s): the state the
        # waves left is read once more, before the reserve lapses 10 s after them.
        samples.append(await asyncio.to_thread(pool_stats, base_url))
        return sorted(shorts), sorted(await asyncio.gather(*longs))

    shorts, longs = asyncio.run(run())
    return SaturatedRun(shorts, longs, samples)


async def _until_queued(base_url: str, longs: list[asyncio.Task], timeout_s: float = 120) -> None:
    """Until long requests hold every slot they may and some wait for one (none waits
    while a slot it may take is free). Fails at once if a long request ends first, and
    with the last `/stats` seen if that never comes."""
    deadline = time.monotonic() + timeout_s
    seen, slowest_poll_s = None, 0.0
    while seen is None or seen["waiting"] == 0:
        ended = [task for task in longs if task.done()]
        assert not ended, (f"{len(ended)} long requests ended before any waited for a slot, the first "
                           f"{ended[0].exception() or f'answered in {ended[0].result():.1f}s'}; last /stats {seen}")
        assert time.monotonic() < deadline, (f"no long request waited for a slot within {timeout_s:g}s: "
                                             f"last /stats {seen}, slowest /stats {slowest_poll_s:.1f}s")
        await asyncio.sleep(0.1)
        sent = time.perf_counter()
        seen = await asyncio.to_thread(pool_stats, base_url)
        slowest_poll_s = max(slowest_poll_s, time.perf_counter() - sent)
