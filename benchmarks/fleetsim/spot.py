"""Spot interruptions in the fleet simulator: notices, lost nodes, replacements,
and a client that sends a broken request again.

A notice names a replica (`Interruption`); `interrupt` asks for its
replacement, drains it some time before its node goes or not at all (the app's
rule is to drain at the notice: `SimReplica.draining`), and removes it
`NOTICE_S` after the notice, when every stream still on it sees the replica lost
and the app's batcher resumes (or re-sends) it. `ResendingClient` is the other
side: a client that sends a request again from the start when its stream broke
because its replica was lost, as one must where nothing resumes it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace

from benchmarks import metrics
from benchmarks.fleetsim.fleet import SimReplica
from benchmarks.fleetsim.simulate import SimApp, SimRequest

NOTICE_S = 120.0
"""AWS's Spot interruption notice: two minutes before the instance is stopped or
terminated (EC2 User Guide, "Spot Instance interruption notices")."""
REPLACEMENT_S = 300.0
"""Assumed: from asking for a GPU node to its replica serving, within the 3-10
minutes reported for a cold vLLM pod on Kubernetes (node, image pull, weights,
warm-up; e.g. spheron.network's KEDA/Knative GPU autoscaling guide)."""


@dataclass(frozen=True)
class Interruption:
    notice_s: float
    """When the notice comes, seconds into the run."""
    pick: int
    """Which replica (seeded draw, an index into those not yet noticed)."""


def interruptions(count: int, span_s: float, seed: int) -> list[Interruption]:
    """`count` notices at seeded times over a run whose requests arrive within
    `span_s`, each node gone before the last arrival; the same for every system."""
    draw = random.Random(seed)
    times = sorted(draw.uniform(0.0, span_s - NOTICE_S) for _ in range(count))
    return [Interruption(at, draw.randrange(1 << 30)) for at in times]


async def interrupt(app: SimApp, events: list[Interruption], drain_before_s: float | None,
                    replacement_s: float) -> None:
    """Each notice in turn: ask for the drawn replica's replacement, drain the replica
    `drain_before_s` before its node goes (None: never), and remove it `NOTICE_S`
    after the notice."""
    pool = app.model.pools[0].name
    loop = asyncio.get_running_loop()
    noticed: set[str] = set()
    pending = []

    async def lose(replica: SimReplica) -> None:
        if drain_before_s is not None:
            await asyncio.sleep(max(0.0, NOTICE_S - drain_before_s))
            replica.draining = True
            app.pool_changed(pool)
        await asyncio.sleep(min(NOTICE_S, drain_before_s) if drain_before_s is not None else NOTICE_S)
        app.fleet.remove_replica(replica)
        app.pool_changed(pool)

    async def replace_it() -> None:
        await asyncio.sleep(replacement_s)
        app.add_replica(pool)

    for event in events:
        await asyncio.sleep(max(0.0, event.notice_s - loop.time()))
        live = [r for r in app.fleet.replicas(app.model.name, pool) if r.name not in noticed]
        replica = live[event.pick % len(live)]
        noticed.add(replica.name)
        pending += [asyncio.create_task(lose(replica)), asyncio.create_task(replace_it())]
    await asyncio.gather(*pending)


RESENDS = 3
"""Times a client sends a broken request again before it gives up."""


class ResendingClient:
    """A client of `app` that sends a request again from the start when its stream
    breaks with a 503 (its replica lost), at most `RESENDS` times, its record timed
    from the first send; `broken` counts the breaks."""

    def __init__(self, app: SimApp) -> None:
        self._app = app
        self.broken = 0

    async def send(self, request: SimRequest, origin: float) -> metrics.RequestRecord:
        first = record = await self._app.send(request, origin)
        for _ in range(RESENDS):
            if record.status != "stream_error" or not record.error.startswith("503"):
                break
            self.broken += 1
            record = await self._app.send(request, origin)
        if record is not first and record.ok:
            waited = record.start_s - first.start_s
            record = replace(record, start_s=first.start_s, ttft_s=record.ttft_s + waited,
                             e2el_s=record.e2el_s + waited)
        return record
