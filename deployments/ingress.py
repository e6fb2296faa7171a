"""The ingress deployment: OpenAI HTTP in front, the length-bucket batcher over Serve handles behind."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.schema import ServeInstanceDetails

from deployments.ingress_metrics import IngressMetrics
from deployments.pool_client import FAILED_STATUSES, STARTING_STATES, DeploymentState, ServePoolClient
from deployments.ray_private import serve_instance_details
from serve_app.autoscaling.contract import PoolQueueStats, autoscaling_stats
from serve_app.config import AppConfig
from serve_app.cost.meter import CostMeter
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest
from serve_app.logs import logger_for
from serve_app.openai.errors import APIError
from serve_app.openai.frontend import ModelFrontend, build_frontend
from serve_app.openai.server import build_openai_app
from serve_app.scheduling.batcher import LengthBucketBatcher
from serve_app.scheduling.types import RequestMeta
from serve_app.topology import INGRESS_DEPLOYMENT, Topology, deployment_name

logger = logger_for(__name__)

CAPACITY_POLL_S = 5.0
"""How often the ingress re-reads how many replicas each pool has running, while
nothing changes (each read asks the controller for the whole app's status)."""
CHANGING_POLL_S = 0.5
"""The same while replicas start or requests wait for a pool with no slot
(starting up, scaling from zero), so they get a new replica as soon as it runs."""
STATUS_TIMEOUT_S = 5.0
"""Longest one read of the controller's status may take; the last counts stay meanwhile."""

StateReader = Callable[[], Awaitable[dict[str, DeploymentState]]]
"""Every deployment of the app by name."""


async def serve_deployment_states() -> dict[str, DeploymentState]:
    """Every deployment of this ingress's application as Serve's controller has it,
    within `STATUS_TIMEOUT_S` (a controller or GCS outage must not stall the poll)."""
    app = serve.get_replica_context().app_name
    details = ServeInstanceDetails(**await serve_instance_details(STATUS_TIMEOUT_S))
    return {
        name: DeploymentState(
            replicas=frozenset(r.actor_id for r in deployment.replicas if r.state.value == "RUNNING" and r.actor_id),
            starting=sum(1 for r in deployment.replicas if r.state.value in STARTING_STATES),
            status=str(deployment.status.value),
            message=deployment.message or "",
        )
        for name, deployment in details.applications[app].deployments.items()
    }


NO_REPLICAS = "NO_REPLICAS"
"""`/ready`'s code for a pool that is down without a failed deployment: nothing running or starting."""


def down_code(states: dict[str, DeploymentState], deployments: list[str]) -> str:
    """Why a pool that is down is: the Serve status of a failed deployment of it
    (`DEPLOY_FAILED`, `UNHEALTHY`), else `NO_REPLICAS`. A code, never the message."""
    failed = sorted({states[name].status for name in deployments
                     if name in states and states[name].status in FAILED_STATUSES})
    return failed[0] if failed else NO_REPLICAS


class OpenAIIngress:
    """The scheduler behind vLLM's OpenAI layer (`IngressBackend`), its HTTP app and autoscaling stats."""

    async def __init__(
        self,
        config: AppConfig,
        pools: dict[str, DeploymentHandle],
        read_states: StateReader = serve_deployment_states,
        frontends: dict[str, ModelFrontend] | None = None,
    ) -> None:
        self._config = config
        self._metrics = IngressMetrics()
        self._cost = CostMeter(config.cost, start=time.time()) if config.cost is not None else None
        self._topology = Topology(config)
        self._client = ServePoolClient(self._topology, pools, self._record_cost)
        self._batcher = LengthBucketBatcher(config, self._client, self._metrics)
        self._read_states = read_states
        self._down: dict[tuple[str, str], tuple[str, str]] = {}
        """Pools that are down -> (short code for `/ready`, the detail, which only the log gets)."""
        self._frontends = frontends or {model.name: await build_frontend(model) for model in config.models}
        """vLLM's OpenAI layer per model (built here, or given: they hold no state of a request)."""
        self._poller = asyncio.get_running_loop().create_task(self._poll_capacity())

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_openai_app(self._config, self, self._frontends)

    def stream(self, model: str, request: GenerationRequest, meta: RequestMeta) -> AsyncIterator[GenerationChunk | EngineError]:
        return self._batcher.stream(model, request, meta)

    def admit(self, client: str | None) -> None:
        self._batcher.admit_request(client)

    def route(self, model: str, meta: RequestMeta, max_tokens: int | None) -> str:
        return self._batcher.route(model, meta, max_tokens)

    async def stats(self) -> dict:
        pools = {
            f"{model}/{pool}": {**vars(stats), "replicas": self._client.running(model, pool),
                                "engines": await self._client.engine_info(model, pool)}
            for (model, pool), stats in self._batcher.stats().items()
        }
        return {"pools": pools, "predictor_classes": self._batcher.predictor_classes(), "moves": self._batcher.moves()}

    def readiness(self) -> dict:
        """Each model answers if one of its pools, or its fallback's, has a running
        replica. A pool that is down says why as a short code (`down_code`); the
        deployments' own messages go only to the log."""
        stats = self._batcher.stats()
        pools = {model.name: {pool.name: {"slots": stats[(model.name, pool.name)].slots,
                                          "down": self._down_code(model.name, pool.name)}
                              for pool in model.pools}
                 for model in self._config.models}

        def serving(name: str) -> bool:
            return any(pool["slots"] for pool in pools[name].values())

        models = {}
        for model in self._config.models:
            fallback = model.fallback.model if model.fallback is not None else None
            models[model.name] = {"ready": serving(model.name) or (fallback is not None and serving(fallback)),
                                  "pools": pools[model.name]}
        return {"ready": all(entry["ready"] for entry in models.values()), "models": models}

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

    def _down_code(self, model: str, pool: str) -> str | None:
        down = self._down.get((model, pool))
        return down[0] if down is not None else None

    def _note_down(self, model: str, pool: str, states: dict[str, DeploymentState], reason: str | None) -> None:
        """Keep the pool's down code for `/ready`, and log its detail when it changes."""
        if reason is None:
            if self._down.pop((model, pool), None) is not None:
                logger.info("pool %s/%s is serving again", model, pool)
            return
        names = [d.name for d in self._topology.pool(model, pool).values()]
        code = down_code(states, names)
        if self._down.get((model, pool)) != (code, reason):
            messages = "; ".join(states[name].message for name in names if name in states and states[name].message)
            logger.warning("pool %s/%s is down (%s): %s %s", model, pool, code, reason, messages[:2000])
        self._down[(model, pool)] = (code, reason)

    async def _poll_capacity(self) -> None:
        """Keep each pool's slots at this ingress replica's share of its running
        replicas' slots, and say which pools are down."""
        while True:
            starting = False
            try:
                states = await self._read_states()
                starting = any(state.starting for state in states.values())
                self._client.set_states(states)
                ingress = states.get(INGRESS_DEPLOYMENT)
                ingresses = max(1, ingress.running if ingress is not None else 1)
                self._batcher.set_ingress_replicas(ingresses)
                if self._cost is not None:
                    # Each ingress replica meters its share of the fleet, as it sees its share of the requests.
                    groups = {group: n / ingresses for group, n in self._client.replica_groups().items()}
                    self._cost.sample(time.time(), groups)
                    self._metrics.cost(self._cost.report(time.time()))
                for (model, pool), stats in self._batcher.stats().items():
                    slots = math.ceil(self._client.slots(model, pool) / ingresses)
                    reason = self._client.down_reason(model, pool)
                    self._note_down(model, pool, states, reason)
                    self._batcher.set_slots(model, pool, slots, reason)
                    for capacity_type, running in self._client.running(model, pool).items():
                        self._metrics.pool_replicas(model, pool, capacity_type, running)
                    self._metrics.queue_depth(model, pool, stats.waiting)
            except Exception:  # the controller may be briefly unreachable; keep the last counts
                logger.exception("reading pool replica counts failed")
            waiting = any(not stats.slots and stats.waiting for stats in self._batcher.stats().values())
            await asyncio.sleep(CHANGING_POLL_S if starting or waiting else CAPACITY_POLL_S)
