"""The LLM replica: one engine, served to the router over Serve handles."""

from __future__ import annotations

import logging
from typing import AsyncIterator, Callable

from serve_app.config import ModelConfig
from serve_app.engine import create_engine
from serve_app.engine.coalesce import coalesce
from serve_app.engine.base import (
    EngineError,
    EngineRequestError,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    LLMEngine,
)

logger = logging.getLogger("ray.serve")

EngineFactory = Callable[[ModelConfig], LLMEngine]


class LLMServer:
    """Starts its engine at replica start; answers `generate` and `stream`.

    Refusals (bad sampling, prompt too long) come back as `EngineError` values so
    the router can answer with the right status without unpickling exceptions.
    """

    async def __init__(self, model: ModelConfig, engine_factory: EngineFactory = create_engine) -> None:
        self._model = model
        self._engine = engine_factory(model)
        info = await self._engine.start()
        logger.info("model %s ready (max_model_len=%d)", model.name, info.max_model_len)

    async def generate(self, request: GenerationRequest) -> GenerationResult | EngineError:
        try:
            return await self._engine.generate(request)
        except EngineRequestError as exc:
            return exc.error

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk | EngineError]:
        try:
            chunks = coalesce(self._engine.stream(request), self._model.stream_interval_ms / 1000)
            async for chunk in chunks:
                yield chunk
        except EngineRequestError as exc:
            yield exc.error

    async def check_health(self) -> None:
        await self._engine.check_health()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
