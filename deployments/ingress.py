"""The ingress deployment: OpenAI HTTP in front, the length-bucket batcher over Serve handles behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.ingress_metrics import IngressMetrics
from deployments.pool_client import ServePoolClient
from serve_app.autoscaling.contract import PoolQueueStats, autoscaling_stats
from serve_app.config import AppConfig
from serve_app.cost.meter import CostMeter
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.logs import logger_for
from serve_app.openai.errors import APIError
from serve_app.openai.server import build_openai_app
from serve_app.scheduling.batcher import LengthBucketBatcher
from serve_app.scheduling.types import RequestMeta
from serve_app.topology import INGRESS_DEPLOYMENT, Topology, deployment_name

logger = logger_for(__name__)

CAPACITY_POLL_S = 2.0
"""How often the ingress re-reads how many replicas each pool has running."""

ReplicaCounter = Callable[[], Awaitable[dict[str, int]]]
"""Running replicas by deployment name."""


async def serve_replica_counts() -> dict[str, int]:
    """Running replicas of every deployment in this ingress's application."""
    app = serve.get_replica_context().app_name
    status = await asyncio.to_thread(serve.status)
    return {
        name: sum(n for state, n in deployment.replica_states.items() if getattr(state, "value", state) == "RUNNING")
        for name, deployment in status.applications[app].deployments.items()
    }


class OpenAIIngress:
    """A `ModelBackend` over the batcher, plus its HTTP app and autoscaling stats."""

    async def __init__(
        self,
        config: AppConfig,
        pools: dict[str, DeploymentHandle],
        count_replicas: ReplicaCounter = serve_replica_counts,
    ) -> None:
        self._config = config
        self._metrics = IngressMetrics()
        self._cost = CostMeter(config.cost, start=time.time()) if config.cost is not None else None
        self._client = ServePoolClient(Topology(config), pools, self._record_cost)
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
        pools = {
            f"{model}/{pool}": {**vars(stats), "replicas": self._client.running(model, pool),
                                "engines": await self._client.engine_info(model, pool)}
            for (model, pool), stats in self._batcher.stats().items()
        }
        return {"pools": pools, "predictor_classes": self._batcher.predictor_classes(), "moves": self._batcher.moves()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Queue waits per pool, for the queue-duration autoscaling policy."""
        return autoscaling_stats({
            deployment_name(model, pool): PoolQueueStats(
                queued=stats.waiting,
                in_flight=stats.in_flight,
                wait_p50_s=stats.queue_wait_p50_s,
                wait_p90_s=stats.queue_wait_p90_s,
                oldest_wait_s=stats.oldest_wait_s,
                diverted=stats.diverted,
                slots=stats.slots,
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
        """Keep each pool's slot count at its running replicas' slots."""
        while True:
            try:
                counts = await self._count_replicas()
                self._client.set_running(counts)
                if self._cost is not None:
                    # Each ingress replica meters its share of the fleet, as it sees its share of the requests.
                    ingresses = max(1, counts.get(INGRESS_DEPLOYMENT, 1))
                    groups = {group: n / ingresses for group, n in self._client.replica_groups().items()}
                    self._cost.sample(time.time(), groups)
                    self._metrics.cost(self._cost.report(time.time()))
                for (model, pool), stats in self._batcher.stats().items():
                    self._batcher.set_slots(model, pool, self._client.slots(model, pool))
                    for capacity_type, running in self._client.running(model, pool).items():
                        self._metrics.pool_replicas(model, pool, capacity_type, running)
                    self._metrics.queue_depth(model, pool, stats.waiting)
            except Exception:  # the controller may be briefly unreachable; keep the last counts
                logger.exception("reading pool replica counts failed")
            await asyncio.sleep(CAPACITY_POLL_S)
