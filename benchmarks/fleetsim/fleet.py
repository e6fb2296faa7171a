"""The pools' replicas and the request router, as the batcher's `PoolClient`.

Each replica is a `SimEngine` taking at most `slots` requests at once (Serve's
`max_ongoing_requests`, which the app sets from the engine's `max_num_seqs`)
and streaming them as the app's replica does (`ModelConfig.stream_interval`).
Which replica takes an attempt is a `Router`'s choice:

- `LeastLoadedRouter`: the app's own `LeastLoadedPolicy` (queue length, each
  request weighed at its replica's reported debt per request) ranks the replicas, and of its first rank the one with fewer
  requests takes it, as Serve's router picks between the two it is offered.
  Each replica's in-flight tokens and requests are its last report, made every
  `request_routing_stats_period_s` of the app's router config (so up to that
  old); the queue lengths are the router's own, current.
- `PowerOfTwoRouter`: Serve's default, two replicas drawn at random, the one
  with fewer requests.

A replica under a Spot notice may be `draining` (the app's rule: no new
request goes to it, and its slots leave the pool's); a removed one's node is
gone, and every stream on it ends with the app's "replica lost" error, which
the batcher resumes or re-sends. Whoever adds or removes replicas, or drains
one, tells the batcher the pool's `slots`, as the ingress does from Serve's
replica counts.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Protocol

from benchmarks.fleetsim.engine import SimEngine
from serve_app.config import ModelConfig, Priority
from serve_app.engine.base import (
    REPLICA_ENGINE_LOST,
    EngineError,
    EngineLost,
    EngineRequestError,
    GenerationChunk,
    GenerationRequest,
)
from serve_app.scheduling.errors import ReplicaUnavailable
from serve_app.scheduling.replica_choice import LeastLoadedPolicy, ReplicaLoad
from serve_app.topology import REQUEST_ROUTER_CONFIG


@dataclass(eq=False)
class SimReplica:
    name: str
    engine: SimEngine
    slots: int
    stream_interval: Callable[[int], int]
    """Tokens per chunk for a request that finds `ongoing` running (`ModelConfig.stream_interval`)."""
    ongoing: int = 0
    draining: bool = False
    """Under a Spot notice, drained: it finishes what it holds and takes nothing new."""

    @property
    def has_room(self) -> bool:
        return not self.draining and self.ongoing < self.slots


class Router(Protocol):
    def choose(self, replicas: list[SimReplica]) -> SimReplica:
        """One of `replicas` (all have room) for the next attempt."""
        ...


class LeastLoadedRouter:
    def __init__(self, policy: LeastLoadedPolicy | None = None,
                 report_every_s: float = REQUEST_ROUTER_CONFIG["request_routing_stats_period_s"]) -> None:
        self._policy = policy or LeastLoadedPolicy()
        self._report_every_s = report_every_s
        self._reports: dict[str, tuple[float, ReplicaLoad]] = {}
        """Replica name: (when it last reported, its load then)."""

    def reported_load(self, replica: SimReplica) -> ReplicaLoad:
        """The replica's in-flight tokens and requests as of its last report (read
        afresh when the router needs them and the last report is `report_every_s`
        old, a replica's first use included), with its current queue length."""
        now = asyncio.get_running_loop().time()
        at, load = self._reports.get(replica.name, (-math.inf, None))
        if load is None or now - at >= self._report_every_s:
            load = ReplicaLoad(replica.name, float(replica.engine.in_flight_tokens()), None,
                               reported_requests=replica.ongoing)
            self._reports[replica.name] = (now, load)
        return replace(load, queue_len=replica.ongoing)

    def choose(self, replicas: list[SimReplica]) -> SimReplica:
        by_name = {replica.name: replica for replica in replicas}
        loads = [self.reported_load(r) for r in replicas]
        first = [by_name[name] for name in self._policy.rank(loads)[0]]
        return min(first, key=lambda replica: replica.ongoing)


class PowerOfTwoRouter:
    def __init__(self, seed: int = 0) -> None:
        self._random = random.Random(seed)

    def choose(self, replicas: list[SimReplica]) -> SimReplica:
        pair = self._random.sample(replicas, min(2, len(replicas)))
        return min(pair, key=lambda replica: replica.ongoing)


class SimFleet:
    """The `PoolClient` the batcher dispatches through."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._pools: dict[tuple[str, str], list[SimReplica]] = {}
        self._names = itertools.count()
        self.engines: list[SimEngine] = []
        """Every engine the fleet ran, removed replicas' included."""

    def replicas(self, model: str, pool: str) -> list[SimReplica]:
        return self._pools.get((model, pool), [])

    def add_replica(self, model: ModelConfig, pool: str, engine: SimEngine, slots: int) -> SimReplica:
        replica = SimReplica(f"{model.name}/{pool}#{next(self._names)}", engine, slots, model.stream_interval)
        engine.start()
        self.engines.append(engine)
        self._pools.setdefault((model.name, pool), []).append(replica)
        return replica

    def remove_replica(self, replica: SimReplica) -> None:
        """The replica's node is gone: its engine stops mid-step, its requests see it lost."""
        for replicas in self._pools.values():
            if replica in replicas:
                replicas.remove(replica)
        replica.engine.kill()

    def slots(self, model: str, pool: str) -> int:
        """Requests the pool's replicas that are not draining take at once."""
        return sum(replica.slots for replica in self.replicas(model, pool) if not replica.draining)

    def has_replicas(self, model: str, pool: str) -> bool:
        return bool(self.replicas(model, pool))

    async def stream(self, model: str, pool: str, request: GenerationRequest,
                     priority: Priority) -> AsyncIterator[GenerationChunk | EngineError]:
        free = [replica for replica in self.replicas(model, pool) if replica.has_room]
        if not free:
            raise ReplicaUnavailable(f"no replica of {model}/{pool} has room")
        replica = self._router.choose(free)
        request = replace(request, stream_interval=replica.stream_interval(replica.ongoing))
        replica.ongoing += 1
        try:
            async with aclosing(replica.engine.stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except EngineRequestError as exc:  # as the app's replica answers it
            yield exc.error
        except EngineLost as exc:  # as the app's pool client reports a dead replica
            yield EngineError(str(exc), status=503, code=REPLICA_ENGINE_LOST, replica=replica.name)
        finally:
            replica.ongoing -= 1
