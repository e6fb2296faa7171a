"""The simulated app router reads each replica's load as the app's router does: its
debt per request from reports at most a report period old, not the engine's current state."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from benchmarks.fleetsim import virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter, SimReplica


@dataclass
class LoadOnly:
    """An engine reduced to the one figure the router asks for."""

    tokens: int

    def in_flight_tokens(self) -> int:
        return self.tokens


def test_the_router_weighs_requests_by_each_replicas_last_report():
    engines = {"a": LoadOnly(100), "b": LoadOnly(200), "c": LoadOnly(1000)}
    replicas = [SimReplica(name, engine, slots=8, stream_interval=lambda ongoing: 1, ongoing=1)
                for name, engine in engines.items()]
    router = LeastLoadedRouter(report_every_s=1.0)

    async def choices() -> list[str]:
        seen = [router.choose(replicas).name]  # a and b are the lightest two, a has no more requests: a
        engines["a"].tokens = 5000  # a's one request turns out long, b's short
        engines["b"].tokens = 10
        await asyncio.sleep(0.5)
        seen.append(router.choose(replicas).name)  # the last reports still say a 100, b 200
        await asyncio.sleep(0.5)
        seen.append(router.choose(replicas).name)  # now b 10, then c 1000: b
        return seen

    assert virtual_time.run(choices()) == ["a", "a", "b"]
