"""The virtual clock: timers fire in order at their virtual time, at once in real time."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.fleetsim.virtual_time import Deadlock, run


def test_an_hour_of_sleeps_runs_in_order_at_virtual_times_and_at_once():
    async def main():
        loop = asyncio.get_running_loop()
        woke = []

        async def sleeper(seconds: float) -> None:
            await asyncio.sleep(seconds)
            woke.append((seconds, loop.time()))

        await asyncio.gather(*(sleeper(s) for s in (3600.0, 5.0, 1.5)))
        return woke

    started = time.perf_counter()
    assert run(main()) == [(1.5, 1.5), (5.0, 5.0), (3600.0, 3600.0)]
    assert time.perf_counter() - started < 5


def test_a_timeout_fires_at_its_virtual_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.sleep(100)
        return loop.time()

    assert run(main()) == 10.0


def test_waiting_with_nothing_left_to_wake_anyone_is_a_deadlock():
    async def main():
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        run(main())
