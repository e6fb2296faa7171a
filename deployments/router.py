"""The ingress: OpenAI HTTP in front, the length-bucket batcher over Serve handles behind."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import asdict
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from deployments.router_metrics import RouterMetrics
from serve_app.api_server import build_openai_app
from serve_app.autoscaling import PoolQueueStats, autoscaling_stats
from serve_app.cost import CostMeter
from serve_app.errors import APIError
from serve_app.admission import Priority
from serve_app.batcher import LengthBucketBatcher, ReplicaUnavailable, RequestMeta
from serve_app.config import AppConfig, pool_deployment_name
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.notice_cap import NoticeCap
from serve_app.placement import ON_DEMAND, SPOT, CapacityChooser, CapacityState

logger = logging.getLogger("ray.serve")

ROUTER_DEPLOYMENT = "OpenAIRouter"

CAPACITY_POLL_S = 2.0
"""How often the router re-reads how many replicas each pool has running."""

ENGINE_INFO_TIMEOUT_S = 5.0
"""How long `/stats` waits for a replica to say what its engine resolved."""

_RETRYABLE = (RayActorError, BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError)


class ServePoolClient:
    """The batcher's `PoolClient`: picks one of a pool's deployments (capacity
    types) per request, and streams from it over a Serve handle.

    Batch prefers Spot, realtime the type with more free slots
    (`CapacityChooser`); a request that could not finish inside a Spot notice
    window (`NoticeCap`, from measured decode speed) goes on-demand when there is
    an on-demand deployment.
    """

    def __init__(
        self, config: AppConfig, handles: dict[str, DeploymentHandle], on_attempt: AttemptRecorder | None = None
    ) -> None:
        self._handles = {name: handle.options(stream=True) for name, handle in handles.items()}
        self._info_handles = handles
        self.engine_info: dict[str, dict] = {}
        """Per deployment: what its engine resolved at start (`EngineInfo`)."""
        self._on_attempt = on_attempt
        self._deployments: dict[tuple[str, str], dict[str, str]] = {}
        self._slots_per_replica: dict[str, int] = {}
        for model in config.models:
            for pool in model.pools:
                sides = config.pool_deployments(model, pool)
                names = {side: pool_deployment_name(model.name, pool.name, side) for side in sides}
                self._deployments[(model.name, pool.name)] = names
                for side, name in names.items():
                    self._slots_per_replica[name] = sides[side]["max_ongoing_requests"]
        self._running: dict[str, int] = {}
        self._in_flight: Counter[str] = Counter()
        self._chooser = CapacityChooser()
        preemption = config.preemption
        self._cap = NoticeCap(config.notice_cap, preemption.notice_window_s, preemption.drain_margin_s)

    def set_running(self, counts: dict[str, int]) -> None:
        self._running = dict(counts)

    def slots(self, model: str, pool: str) -> int:
        """Requests the pool's running replicas take at once, over all its deployments."""
        names = self._deployments[(model, pool)].values()
        return sum(self._running.get(name, 0) * self._slots_per_replica[name] for name in names)

    def replica_groups(self) -> dict[tuple[str, str, str], int]:
        """Running replicas by (model, pool, capacity type): what the cost meter bills."""
        return {
            (model, pool, side): self._running.get(name, 0)
            for (model, pool), names in self._deployments.items()
            for side, name in names.items()
        }

    def pool_engine_info(self, model: str, pool: str) -> dict[str, dict]:
        """Engine info of a pool's deployments by capacity type (those known so far)."""
        names = self._deployments[(model, pool)]
        return {side: self.engine_info[name] for side, name in names.items() if name in self.engine_info}

    async def refresh_engine_info(self) -> None:
        """Ask one replica of each running deployment what its engine resolved, once."""
        for name, handle in self._info_handles.items():
            if name not in self.engine_info and self._running.get(name, 0) > 0:
                try:
                    async with asyncio.timeout(ENGINE_INFO_TIMEOUT_S):
                        self.engine_info[name] = asdict(await handle.engine_info.remote())
                except Exception as exc:  # shown as missing; asked again next time
                    logger.warning("engine info of %s unavailable: %s", name, type(exc).__name__)

    def running(self, model: str, pool: str) -> dict[str, int]:
        return {side: self._running.get(name, 0) for side, name in self._deployments[(model, pool)].items()}

    def _choose(self, model: str, pool: str, request: GenerationRequest, priority: Priority) -> tuple[str, str]:
        """(capacity type, deployment name) for this attempt."""
        names = self._deployments[(model, pool)]
        if len(names) == 1:
            return next(iter(names.items()))
        snapshot = {}
        for side, name in names.items():
            running = self._running.get(name, 0)
            free = running * self._slots_per_replica[name] - self._in_flight[name]
            snapshot[side] = CapacityState(healthy=running, free_slots=max(0, free))
        order = self._chooser.choose(snapshot, priority)
        limits = [limit for limit in (request.sampling.max_tokens, request.stop_after) if limit is not None]
        budget = min(limits) if limits else None
        if ON_DEMAND in names and (budget is None or budget > self._cap.cap(names[SPOT])):
            order = [side for side in order if side != SPOT]
        return order[0], names[order[0]]

    async def stream(
        self, model: str, pool: str, request: GenerationRequest, priority: Priority
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        side, name = self._choose(model, pool, request, priority)
        responses = self._handles[name].stream.remote(request)
        self._in_flight[name] += 1
        first_token_at, tokens, prompt_tokens = None, 0, 0
        try:
            async for chunk in responses:
                if isinstance(chunk, GenerationChunk) and chunk.num_tokens:
                    first_token_at = first_token_at or time.monotonic()
                    tokens += chunk.num_tokens
                    prompt_tokens = chunk.prompt_tokens + len(request.continuation)
                yield chunk
            if first_token_at is not None:
                self._cap.observe(name, tokens, time.monotonic() - first_token_at)
        except _RETRYABLE as exc:
            # Count the replica as gone until the next poll says otherwise, so the
            # retry goes to a side that still has replicas (a lost Spot node
            # often takes all of its side's replicas).
            self._running[name] = max(0, self._running.get(name, 0) - 1)
            raise ReplicaUnavailable(f"{type(exc).__name__}") from exc
        except Exception as exc:
            # A RayTaskError's text carries the remote traceback; clients get the cause only.
            cause = getattr(exc, "cause", None) or exc
            detail = f"{type(cause).__name__}: {cause}"[:300]
            yield EngineError(f"model {model!r} failed: {detail}", status=500, code="engine_error", type="server_error")
        finally:
            self._in_flight[name] -= 1
            responses.cancel()
            if self._on_attempt is not None and tokens:
                requests = 0 if request.continuation else 1  # a resumed attempt is the same request
                self._on_attempt(model, pool, side, prompt_tokens, tokens, requests)


AttemptRecorder = Callable[[str, str, str, int, int, int], None]
"""(model, pool, capacity type, prompt tokens, output tokens, requests) of one attempt."""

ReplicaCounter = Callable[[], Awaitable[dict[str, int]]]
"""Running replicas by deployment name."""


async def serve_replica_counts() -> dict[str, int]:
    """Running replicas of every deployment in this router's application."""
    app = serve.get_replica_context().app_name
    status = await asyncio.to_thread(serve.status)
    return {
        name: sum(n for state, n in deployment.replica_states.items() if getattr(state, "value", state) == "RUNNING")
        for name, deployment in status.applications[app].deployments.items()
    }


class OpenAIRouter:
    """A `ModelBackend` over the batcher, plus its HTTP app and autoscaling stats."""

    async def __init__(
        self,
        config: AppConfig,
        pools: dict[str, DeploymentHandle],
        count_replicas: ReplicaCounter = serve_replica_counts,
    ) -> None:
        self._config = config
        self._metrics = RouterMetrics()
        self._cost = CostMeter(config.cost, start=time.time()) if config.cost is not None else None
        self._client = ServePoolClient(config, pools, self._record_cost)
        self._batcher = LengthBucketBatcher(config, self._client, self._metrics)
        self._count_replicas = count_replicas
        self._poller = asyncio.get_running_loop().create_task(self._poll_capacity())

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_openai_app(self._config, self)

    async def generate(self, model: str, request: GenerationRequest, meta: RequestMeta) -> GenerationResult | EngineError:
        return await self._batcher.generate(model, request, meta)

    def stream(self, model: str, request: GenerationRequest, meta: RequestMeta) -> AsyncIterator[GenerationChunk | EngineError]:
        return self._batcher.stream(model, request, meta)

    async def stats(self) -> dict:
        await self._client.refresh_engine_info()
        pools = {
            f"{model}/{pool}": {**vars(stats), "replicas": self._client.running(model, pool),
                                "engines": self._client.pool_engine_info(model, pool)}
            for (model, pool), stats in self._batcher.stats().items()
        }
        return {"pools": pools, "predictor_classes": self._batcher.predictor_classes(), "moves": self._batcher.moves()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Queue waits per pool, for the queue-duration autoscaling policy."""
        return autoscaling_stats({
            pool_deployment_name(model, pool): PoolQueueStats(
                queued=stats.waiting,
                in_flight=stats.in_flight,
                wait_p50_s=stats.queue_wait_p50_s,
                wait_p90_s=stats.queue_wait_p90_s,
                oldest_wait_s=stats.oldest_wait_s,
                diverted=stats.diverted,
                slots=stats.capacity,
            )
            for (model, pool), stats in self._batcher.stats().items()
        })

    def cost(self) -> dict:
        if self._cost is None:
            raise APIError(404, "cost accounting is off: add a `cost` price table to the config", code="not_configured")
        return self._cost.report(time.time())

    def _record_cost(
        self, model: str, pool: str, capacity_type: str, prompt_tokens: int, output_tokens: int, requests: int
    ) -> None:
        if self._cost is not None:
            self._cost.record(model, pool, capacity_type, prompt_tokens, output_tokens, requests)

    async def _poll_capacity(self) -> None:
        """Keep each pool's slot count at running replicas x max_ongoing_requests."""
        while True:
            try:
                counts = await self._count_replicas()
                self._client.set_running(counts)
                if self._cost is not None:
                    # Each router replica meters its share of the fleet, as it sees its share of the requests.
                    routers = max(1, counts.get(ROUTER_DEPLOYMENT, 1))
                    groups = {group: n / routers for group, n in self._client.replica_groups().items()}
                    self._cost.sample(time.time(), groups)
                    self._metrics.cost(self._cost.report(time.time()))
                for (model, pool), stats in self._batcher.stats().items():
                    self._batcher.set_capacity(model, pool, self._client.slots(model, pool))
                    for capacity_type, running in self._client.running(model, pool).items():
                        self._metrics.pool_replicas(model, pool, capacity_type, running)
                    self._metrics.queue_depth(model, pool, stats.waiting)
            except Exception:  # the controller may be briefly unreachable; keep the last counts
                logger.exception("reading pool replica counts failed")
            await asyncio.sleep(CAPACITY_POLL_S)
