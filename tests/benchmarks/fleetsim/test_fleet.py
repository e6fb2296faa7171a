"""The simulated app router reads each replica's load as the app's router does: from
reports at most a report period old, not the engine's current state."""

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


def test_the_router_sees_a_replicas_load_only_at_its_next_report():
    engines = {"a": LoadOnly(0), "b": LoadOnly(100), "c": LoadOnly(1000)}
    replicas = [SimReplica(name, engine, slots=8, stream_interval=lambda ongoing: 1) for name, engine in engines.items()]
    router = LeastLoadedRouter(report_every_s=1.0)

    async def choices() -> list[str]:
        seen = [router.choose(replicas).name]  # a and b are the lightest two, neither busier: a
        engines["a"].tokens = 5000
        await asyncio.sleep(0.5)
        seen.append(router.choose(replicas).name)  # a's last report still says 0
        await asyncio.sleep(0.5)
        seen.append(router.choose(replicas).name)  # a reports 5000: b and c are the lightest
        return seen

    assert virtual_time.run(choices()) == ["a", "a", "b"]
