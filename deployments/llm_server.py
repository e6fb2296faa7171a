"""The LLM replica: one engine, served to the ingress over Serve handles."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from deployments.preemption_guard import Node, PreemptionGuard, RayNode
from serve_app.config import EngineConfig, ModelConfig, PreemptionConfig
from serve_app.engine import create_engine
from serve_app.engine.base import (
    EngineError,
    EngineInfo,
    EngineRequestError,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
)
from serve_app.logs import logger_for

logger = logger_for(__name__)

EngineFactory = Callable[[str, EngineConfig], LLMEngine]

DRAINING = EngineError(
    "this replica's node is being preempted; the ingress retries elsewhere", status=503, code="replica_draining"
)


class LLMServer:
    """Starts one pool's engine at replica start; streams generations to the ingress.

    Refusals (bad sampling, prompt too long) come back as `EngineError` values so
    the ingress can answer with the right status without unpickling exceptions.
    On a Spot notice its `PreemptionGuard` drains the node; from then on new
    requests are refused with `replica_draining` (the ingress retries them
    elsewhere) while running ones finish.
    """

    async def __init__(
        self,
        model: ModelConfig,
        pool: str,
        preemption: PreemptionConfig,
        engine_factory: EngineFactory = create_engine,
        node_factory: Callable[[], Node] = RayNode,
    ) -> None:
        self._model = model
        self._engine_config = model.pool_engine(model.pool(pool))
        self._engine = engine_factory(model.backend, self._engine_config)
        self._in_flight: dict[str, int] = {}
        """Output tokens each running request may still produce (load for routing)."""
        self._info = info = await self._engine.start()
        self._max_model_len = info.max_model_len
        self._guard = PreemptionGuard(preemption, node=node_factory())
        self._guard.start()
        logger.info("model %s pool %s ready (max_model_len=%d, dtype %s: %s)", model.name, pool,
                    info.max_model_len, info.dtype, info.dtype_reason)

    def engine_info(self) -> EngineInfo:
        """What the engine resolved at start (dtype, context length, quantization)."""
        return self._info

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk | EngineError]:
        if self._guard.draining:
            yield DRAINING
            return
        busy = len(self._in_flight) >= self._model.stream_busy_requests
        request = replace(request, stream_interval=self._model.stream_chunk_tokens if busy else 1)
        self._in_flight[request.request_id] = request.sampling.max_tokens or self._max_model_len
        try:
            with self._guard.track():
                async for chunk in self._engine.stream(request):
                    self._in_flight[request.request_id] -= chunk.num_tokens
                    yield chunk
        except EngineRequestError as exc:
            yield exc.error
        finally:
            self._in_flight.pop(request.request_id, None)

    def record_routing_stats(self) -> dict[str, float]:
        """Load Serve's request router balances on: running requests and their token debt."""
        return {"in_flight": len(self._in_flight), "in_flight_tokens": sum(self._in_flight.values())}

    async def check_health(self) -> None:
        if not self._guard.healthy():
            raise RuntimeError("draining for a preemption, nothing left in flight")
        await self._engine.check_health()

    def __del__(self) -> None:
        """Serve's graceful shutdown: stop watching for notices, release the engine's processes."""
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.stop()
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
