"""The ingress: OpenAI HTTP in front, the length-bucket batcher over Serve handles behind."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from deployments.router_metrics import RouterMetrics
from serve_app.api_server import build_openai_app
from serve_app.batcher import LengthBucketBatcher, ReplicaUnavailable, RequestMeta
from serve_app.config import AppConfig, pool_deployment_name
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult

logger = logging.getLogger("ray.serve")

CAPACITY_POLL_S = 2.0
"""How often the router re-reads how many replicas each pool has running."""

_RETRYABLE = (RayActorError, BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError)


class ServePoolClient:
    """The batcher's `PoolClient`: one streaming handle per pool deployment."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self._handles = {name: handle.options(stream=True) for name, handle in handles.items()}

    async def stream(
        self, model: str, pool: str, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        responses = self._handles[pool_deployment_name(model, pool)].stream.remote(request)
        try:
            async for chunk in responses:
                yield chunk
        except _RETRYABLE as exc:
            raise ReplicaUnavailable(f"{type(exc).__name__}") from exc
        except Exception as exc:
            # A RayTaskError's text carries the remote traceback; clients get the cause only.
            cause = getattr(exc, "cause", None) or exc
            detail = f"{type(cause).__name__}: {cause}"[:300]
            yield EngineError(f"model {model!r} failed: {detail}", status=500, code="engine_error", type="server_error")
        finally:
            responses.cancel()


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
        self._batcher = LengthBucketBatcher(config, ServePoolClient(pools), self._metrics)
        self._slots_per_replica = {
            (model.name, pool.name): model.pool_deployment(pool).max_ongoing_requests
            for model in config.models
            for pool in model.pools
        }
        self._count_replicas = count_replicas
        self._poller = asyncio.get_running_loop().create_task(self._poll_capacity())

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_openai_app(self._config, self)

    async def generate(self, model: str, request: GenerationRequest, meta: RequestMeta) -> GenerationResult | EngineError:
        return await self._batcher.generate(model, request, meta)

    def stream(self, model: str, request: GenerationRequest, meta: RequestMeta) -> AsyncIterator[GenerationChunk | EngineError]:
        return self._batcher.stream(model, request, meta)

    def stats(self) -> dict:
        pools = {
            pool_deployment_name(model, pool): vars(stats) for (model, pool), stats in self._batcher.stats().items()
        }
        return {"pools": pools, "predictor_classes": self._batcher.predictor_classes(), "moves": self._batcher.moves()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Queue waits per pool, for the queue-duration autoscaling policy."""
        stats: dict[str, float] = {}
        for (model, pool), pool_stats in self._batcher.stats().items():
            name = pool_deployment_name(model, pool)
            stats[f"queued:{name}"] = pool_stats.waiting
            stats[f"in_flight:{name}"] = pool_stats.in_flight
            for label, value in (("p50", pool_stats.queue_wait_p50_s), ("p90", pool_stats.queue_wait_p90_s)):
                if value is not None:
                    stats[f"queue_wait_{label}_s:{name}"] = value
        return stats

    async def _poll_capacity(self) -> None:
        """Keep each pool's slot count at running replicas x max_ongoing_requests."""
        while True:
            try:
                counts = await self._count_replicas()
                for (model, pool), slots in self._slots_per_replica.items():
                    running = counts.get(pool_deployment_name(model, pool), 0)
                    self._batcher.set_capacity(model, pool, running * slots)
                    self._metrics.pool_replicas(model, pool, running)
                for (model, pool), stats in self._batcher.stats().items():
                    self._metrics.queue_depth(model, pool, stats.waiting)
            except Exception:  # the controller may be briefly unreachable; keep the last counts
                logger.exception("reading pool replica counts failed")
            await asyncio.sleep(CAPACITY_POLL_S)
