"""One scenario, run on the shipped app (length awareness on, tests/e2e) and on the
same app with it off (configs/local-nobuckets.yaml, tests/e2e_nobuckets): long
requests saturate the pool's slots and queue, and short ones arrive behind them.

With length awareness the short ones take a reserve of slots sized from their own
measured demand and go ahead of the queued long ones, so every one answers while
the long ones still hold their slots. Without it they wait, first come first
served, until a long one ends (or their queue time runs out). Both packages judge
the run with `shorts_skip_the_queue`, expecting opposite answers: the check is seen
to fail where the scheduling it names is absent.

The verdict rests on the order of events, not on how fast this machine is: the long
requests run far longer than the run and are cancelled at its end, so neither a
slow start nor a slow machine can let one end before the short ones are judged.
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
LONG_TOKENS = 1024
"""Far longer than the run (about a minute at the least on this machine): the long
requests are cancelled once the short ones are judged, so none ends before the
pool saturates, however slowly a loaded machine lets them in (CI runs saw 192- and
256-token ones end first). All of them fit the shipped 1 GiB KV cache."""
SHORT_TOKENS = 16
DEMAND_TOKENS = 96
"""The demand waves' length: long enough that a wave's requests overlap in the pool
however slowly they reach it (a CI run saw 32-token ones not overlap), and under
the long edge (128 tokens), so they count as short."""
DEMAND_WAVES = 4
"""Demand waves sent at most until the reserve holds a whole wave (one whose
requests reached the pool spread out measures less)."""
SHORT_WAVES, WAVE = 4, 6
SAMPLE_EVERY_S = 0.5
DRAIN_TIMEOUT_S = 60


@dataclass(frozen=True)
class SaturatedRun:
    shorts: list[float]
    """Seconds of each short request sent once the pool saturated and answered
    before any long request ended, sorted."""
    sent: int
    """Short requests sent once the pool saturated."""
    first_long_end_s: float | None
    """From sending the long requests until the first ended by itself; None: every
    one still ran (or waited) when the run cancelled them."""
    pool: list[dict]
    """The pool's `/stats` every `SAMPLE_EVERY_S` from the first long request to the
    last short one, each with when it was asked (`at_s`) and how long it took
    (`took_s`); a poll that failed holds only those and its `error`."""
    saturated_after_s: float
    """From sending the long requests until the pool showed some of them queueing."""

    @property
    def pool_states(self) -> list[dict]:
        """The polls that answered."""
        return [sample for sample in self.pool if "error" not in sample]

    def describe(self) -> str:
        def quantile(q: float) -> str:
            return f"{self.shorts[min(len(self.shorts) - 1, int(q * len(self.shorts)))]:.2f}s" if self.shorts else "-"

        seen = [(round(p["at_s"], 1), round(p["took_s"], 2),
                 p.get("error") or (p["in_flight"], p["long_in_flight"], p["waiting"], p["long_cap"]))
                for p in self.pool]
        ended = "none" if self.first_long_end_s is None else f"after {self.first_long_end_s:.1f}s"
        return (f"{len(self.shorts)} of {self.sent} short requests answered before a long one ended "
                f"(p50 {quantile(0.5)}, max {quantile(1.0)}); first long one ended: {ended}; saturated after "
                f"{self.saturated_after_s:.1f}s; pool (asked at, took, (in flight, long, waiting, long cap)): {seen}")


def shorts_skip_the_queue(run: SaturatedRun) -> bool:
    """Every short request answered while the long ones held their slots and queued:
    none waited for a long request to end."""
    return run.sent > 0 and len(run.shorts) == run.sent


def pool_stats(base_url: str) -> dict:
    return httpx.get(base_url.removesuffix("/v1") + "/stats", timeout=60).json()["pools"][POOL]


async def _timed(coro) -> tuple[float, float]:
    """(seconds it took, when it ended on `time.perf_counter`)."""
    start = time.perf_counter()
    await coro
    end = time.perf_counter()
    return end - start, end


def run_saturated(base_url: str, reserve: bool) -> SaturatedRun:
    """Waves of short requests (their demand, which sizes the reserve where the app
    keeps one: `reserve`), then `LONGS` long requests at once, then `SHORT_WAVES`
    waves of short ones once the pool shows long ones queueing, each wave until it
    is answered or a long request ends. Every request is greedy with `ignore_eos`,
    its length its `max_tokens`. The long requests are then cancelled, and the run
    returns once the pool is idle again.

    Where the app keeps a reserve, short waves go on arriving while the long requests
    do, as on mixed traffic: the reserve lapses `SHORT_DEMAND_WINDOW_S` after the last
    short arrival, and a loaded machine may take longer than that to let every long
    request in. Without a reserve they would only queue, so none are sent then."""
    samples: list[dict] = []
    start = time.perf_counter()

    async def sample() -> None:
        while True:
            asked = time.perf_counter()
            try:
                stats = await asyncio.to_thread(pool_stats, base_url)
            except Exception as exc:  # a slow or failed poll is shown, not fatal
                stats = {"error": repr(exc)}
            samples.append({**stats, "at_s": asked - start, "took_s": time.perf_counter() - asked})
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def run() -> SaturatedRun:
        nonlocal start
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

        def ask(n: int, max_tokens: int) -> asyncio.Task:
            return asyncio.create_task(_timed(client.completions.create(
                model=MODEL, prompt=f"Story {n}:", max_tokens=max_tokens, extra_body={"ignore_eos": True})))

        def wave(first: int, max_tokens: int = SHORT_TOKENS) -> list[asyncio.Task]:
            return [ask(n, max_tokens) for n in range(first, first + WAVE)]

        waves = 0
        while True:
            waves += 1
            took = [round(seconds, 2) for seconds, _ in await asyncio.gather(*wave(0, DEMAND_TOKENS))]
            cap = (await asyncio.to_thread(pool_stats, base_url))["long_cap"]
            if not reserve or cap <= SLOTS - WAVE or waves == DEMAND_WAVES:
                break
        assert not reserve or cap <= SLOTS - WAVE, (
            f"{waves} waves of {WAVE} short requests (the last took {took} s) left long ones {cap} of "
            f"{SLOTS} slots: their requests did not overlap in the pool")
        saturated = asyncio.Event()

        async def keep_short_demand() -> None:
            while not saturated.is_set():
                await asyncio.gather(*wave(0))

        keeper = asyncio.create_task(keep_short_demand()) if reserve else None
        start = time.perf_counter()
        sampler = asyncio.create_task(sample())
        longs = [ask(n, LONG_TOKENS) for n in range(LONGS)]
        # A request waits only once long ones hold every slot they may (their cap, or all).
        await _until(lambda: bool(samples) and samples[-1].get("waiting", 0) > 0,
                     "long requests queued behind the slots they may hold", longs, samples)
        saturated_after_s = time.perf_counter() - start
        saturated.set()
        if keeper is not None:
            await keeper
        shorts: list[asyncio.Task] = []
        for n in range(SHORT_WAVES):
            shorts += wave(n * WAVE)
            # Until the wave is answered, or refused, or a long request ends.
            await asyncio.wait([asyncio.gather(*shorts, return_exceptions=True), *longs],
                               return_when=asyncio.FIRST_COMPLETED)
            if not all(task.done() and not task.exception() for task in shorts) or any(t.done() for t in longs):
                break
        # The state the waves left, read before the reserve lapses after them.
        samples.append({**await asyncio.to_thread(pool_stats, base_url),
                        "at_s": time.perf_counter() - start, "took_s": 0.0})
        sampler.cancel()
        first_long_end = min((_ended_at(task) for task in longs if _ended_at(task) is not None), default=None)
        answered = [task.result()[0] for task in shorts if _ended_at(task) is not None
                    and (first_long_end is None or _ended_at(task) < first_long_end)]
        for task in [*longs, *shorts]:
            task.cancel()
        await asyncio.gather(*longs, *shorts, return_exceptions=True)
        await _until(lambda: _idle(base_url), "the pool idle once the run's requests were cancelled",
                     timeout_s=DRAIN_TIMEOUT_S)
        return SaturatedRun(sorted(answered), len(shorts),
                            None if first_long_end is None else first_long_end - start, samples, saturated_after_s)

    return asyncio.run(run())


def _ended_at(task: asyncio.Task) -> float | None:
    """When a `_timed` request ended with an answer; None while it runs, or if it failed."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()[1]


def _idle(base_url: str) -> bool:
    pool = pool_stats(base_url)
    return pool["in_flight"] == 0 and pool["waiting"] == 0


async def _until(condition, what: str, running: list[asyncio.Task] = (), samples: list[dict] = (),
                 timeout_s: float = 120) -> None:
    """Until `condition()` holds, checked every 0.1 s. Fails at once, naming how and
    with the last of `samples`, if one of `running` ends first, and if that never
    comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        ended = [task for task in running if task.done()]
        last = f"; last pool samples: {list(samples)[-3:]}" if samples else ""
        assert not ended, (f"{len(ended)} requests ended before {what}, the first "
                           f"{ended[0].exception() or 'with an answer'}{last}")
        if condition():
            return
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g}s{last}"
        await asyncio.sleep(0.1)
