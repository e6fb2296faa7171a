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
LONG_TOKENS, SHORT_TOKENS = 256, 16
"""Long enough that no long request ends before the rest reach the pool, however
slowly a loaded machine's proxy lets them in (a CI run saw 192-token ones end first)."""
DEMAND_TOKENS = 32
"""The first wave's length: long enough that its requests overlap in the pool
however slowly they reach it."""
SHORT_WAVES, WAVE = 4, 6
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class SaturatedRun:
    shorts: list[float]
    """Seconds of each short request that arrived after the long ones, sorted."""
    longs: list[float]
    """Seconds of each long request, sorted."""
    pool: list[dict]
    """The pool's `/stats` every `SAMPLE_EVERY_S` from the first long request to the last short one."""
    saturated_after_s: float
    """From sending the long requests until the pool showed some of them queueing."""

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
                f"long p50 {self.long_p50:.1f}s min {self.longs[0]:.1f}s; saturated after "
                f"{self.saturated_after_s:.1f}s; pool (in flight, long, waiting, long cap) "
                f"every {SAMPLE_EVERY_S} s: {seen}")


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


def run_saturated(base_url: str, reserve: bool) -> SaturatedRun:
    """A wave of short requests (their demand, which sizes the reserve where the app
    keeps one: `reserve`), then `LONGS` long requests at once, then `SHORT_WAVES` waves
    of short ones once the pool shows long ones queueing. Every request is greedy with `ignore_eos`, its length its `max_tokens`.

    Where the app keeps a reserve, short waves go on arriving while the long requests
    do, as on mixed traffic: the reserve lapses `SHORT_DEMAND_WINDOW_S` after the last
    short arrival, and a loaded machine may take longer than that to let every long
    request in. Without a reserve they would only queue, so none are sent then."""
    samples: list[dict] = []

    async def sample() -> None:
        while True:
            samples.append(await asyncio.to_thread(pool_stats, base_url))
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def run() -> tuple[list[float], list[float], float]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

        def ask(n: int, max_tokens: int):
            return client.completions.create(
                model=MODEL, prompt=f"Story {n}:", max_tokens=max_tokens, extra_body={"ignore_eos": True})

        def wave(first: int, max_tokens: int = SHORT_TOKENS):
            return asyncio.gather(*(_timed(ask(n, max_tokens)) for n in range(first, first + WAVE)))

        await wave(0, DEMAND_TOKENS)
        cap = (await asyncio.to_thread(pool_stats, base_url))["long_cap"]
        assert not reserve or cap <= SLOTS - (WAVE - 1), (
            f"the first wave of {WAVE} short requests left long ones {cap} of {SLOTS} slots: "
            "its requests did not overlap in the pool")
        saturated = asyncio.Event()

        async def keep_short_demand() -> None:
            while not saturated.is_set():
                await wave(0)

        keeper = asyncio.create_task(keep_short_demand()) if reserve else None
        sampler = asyncio.create_task(sample())
        start = time.perf_counter()
        longs = [asyncio.create_task(_timed(ask(n, LONG_TOKENS))) for n in range(LONGS)]
        # A request waits only once long ones hold every slot they may (their cap, or all).
        await _until(lambda: bool(samples) and samples[-1]["waiting"] > 0, longs,
                     "long requests queued behind the slots they may hold")
        saturated_after_s = time.perf_counter() - start
        saturated.set()
        if keeper is not None:
            await keeper
        shorts = []
        for n in range(SHORT_WAVES):
            shorts += await wave(n * WAVE)
        sampler.cancel()
        # The sampler's polls share a busy machine (a CI run got one in 35 s): the state the
        # waves left is read once more, before the reserve lapses after them.
        samples.append(await asyncio.to_thread(pool_stats, base_url))
        return sorted(shorts), sorted(await asyncio.gather(*longs)), saturated_after_s

    shorts, longs, saturated_after_s = asyncio.run(run())
    return SaturatedRun(shorts, longs, samples, saturated_after_s)


async def _until(condition, running: list[asyncio.Task], what: str, timeout_s: float = 120) -> None:
    """Until `condition()` holds, checked every 0.1 s. Fails at once, naming how,
    if one of `running` ends first, and if that never comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        ended = [task for task in running if task.done()]
        assert not ended, (f"{len(ended)} requests ended before {what}, the first "
                           f"{ended[0].exception() or 'with an answer'}")
        if condition():
            return
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g}s"
        await asyncio.sleep(0.1)
