"""The LLM replica: one engine, served to the ingress over Serve handles."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import ray

from deployments.preemption_guard import Node, PreemptionGuard, RayNode
from serve_app.config import EngineConfig, ModelConfig, PreemptionConfig
from serve_app.engine import create_engine
from serve_app.engine.base import (
    REPLICA_DRAINING,
    REPLICA_ENGINE_LOST,
    EngineError,
    EngineInfo,
    EngineLost,
    EngineRequestError,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
)
from serve_app.logs import logger_for

logger = logger_for(__name__)

EngineFactory = Callable[[str, EngineConfig], LLMEngine]

ENGINE_WATCH_S = 1.0
"""How often an idle replica asks its engine whether it is still alive."""
EXIT_DELAY_S = 0.5
"""How long a replica whose engine died waits before it exits, so the refusals
it already sent reach the ingress before Serve's router learns the actor died."""
ENGINE_LOST_EXIT_CODE = 3
"""The replica's exit status after its engine died (Serve then replaces it)."""

_REFUSALS = {
    REPLICA_DRAINING: "this replica's node is being preempted; the ingress retries elsewhere",
    REPLICA_ENGINE_LOST: "this replica's engine died; the ingress retries elsewhere",
}


def own_actor_id() -> str | None:
    """This replica's Ray actor id (hex); None outside Ray."""
    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None


def refusal(code: str, replica: str | None) -> EngineError:
    """The refusal a replica that serves nothing more sends instead of output."""
    return EngineError(_REFUSALS[code], status=503, code=code, replica=replica)


class LLMServer:
    """Starts one pool's engine at replica start; streams generations to the ingress.

    Refusals (bad sampling, prompt too long) come back as `EngineError` values so
    the ingress can answer with the right status without unpickling exceptions.
    On a Spot notice its `PreemptionGuard` drains the node; from then on new
    requests are refused with `replica_draining` (the ingress retries them
    elsewhere) while running ones finish. When its engine dies, every request
    gets `replica_engine_lost` (the ingress re-sends or resumes it elsewhere)
    and the replica exits, so Serve's routers drop it at once and the
    controller replaces it. Its routing stats say `serving: 0` from either
    moment on, and the request router never picks it again.
    """

    async def __init__(
        self,
        model: ModelConfig,
        pool: str,
        preemption: PreemptionConfig,
        engine_factory: EngineFactory = create_engine,
        node_factory: Callable[[], Node] = RayNode,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self._model = model
        self._actor_id = own_actor_id()
        self._exit_process = exit_process
        self._engine_lost = False
        self._engine_config = model.pool_engine(model.pool(pool))
        self._engine = engine_factory(model.backend, self._engine_config)
        self._in_flight: dict[str, int] = {}
        """Output tokens each running request may still produce (load for routing)."""
        self._info = info = await self._engine.start()
        self._max_model_len = info.max_model_len
        self._guard = PreemptionGuard(preemption, node=node_factory())
        self._guard.start()
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_engine())
        logger.info("model %s pool %s ready (max_model_len=%d, dtype %s: %s)", model.name, pool,
                    info.max_model_len, info.dtype, info.dtype_reason)

    def engine_info(self) -> EngineInfo:
        """What the engine resolved at start (dtype, context length, quantization)."""
        return self._info

    def _refusing(self) -> str | None:
        """Why this replica takes no new work, as a refusal code; None while it serves."""
        if self._engine_lost:
            return REPLICA_ENGINE_LOST
        return REPLICA_DRAINING if self._guard.draining else None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk | EngineError]:
        code = self._refusing()
        if code is not None:
            yield refusal(code, self._actor_id)
            return
        request = replace(request, stream_interval=self._model.stream_interval(len(self._in_flight)))
        self._in_flight[request.request_id] = request.max_tokens or self._max_model_len
        try:
            with self._guard.track():
                async for chunk in self._engine.stream(request):
                    self._in_flight[request.request_id] -= chunk.num_tokens
                    yield chunk
        except EngineRequestError as exc:
            yield exc.error
        except EngineLost:
            self._lose_engine()
            yield refusal(REPLICA_ENGINE_LOST, self._actor_id)
        finally:
            self._in_flight.pop(request.request_id, None)

    def record_routing_stats(self) -> dict[str, float]:
        """Load Serve's request router balances on: running requests and their token debt."""
        return {"in_flight": len(self._in_flight), "in_flight_tokens": sum(self._in_flight.values()),
                "serving": int(self._refusing() is None)}

    async def check_health(self) -> None:
        if not self._guard.healthy():
            raise RuntimeError("draining for a preemption, nothing left in flight")
        try:
            await self._engine.check_health()
        except EngineLost:
            self._lose_engine()
            raise

    async def _watch_engine(self) -> None:
        """Notice an engine that died while no request was running."""
        while not self._engine_lost:
            await asyncio.sleep(ENGINE_WATCH_S)
            try:
                await self._engine.check_health()
            except EngineLost:
                self._lose_engine()

    def _lose_engine(self) -> None:
        """The engine died: refuse everything from now on and exit shortly."""
        if self._engine_lost:
            return
        self._engine_lost = True
        logger.error("model %s: the engine died; this replica refuses new work and exits in %.1f s",
                     self._model.name, EXIT_DELAY_S)
        asyncio.get_running_loop().call_later(EXIT_DELAY_S, self._exit_process, ENGINE_LOST_EXIT_CODE)

    def __del__(self) -> None:
        """Serve's graceful shutdown: stop watching for notices, release the engine's processes."""
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.stop()
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.cancel()
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
