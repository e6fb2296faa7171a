"""The ingress: OpenAI HTTP in front, Serve handles to the model replicas behind."""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import FastAPI
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from serve_app.api_server import build_openai_app
from serve_app.config import AppConfig
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.errors import APIError

RETRY_AFTER_S = 1


def _client_error(model: str, exc: Exception) -> APIError:
    """What the client sees when the call to a replica fails."""
    if isinstance(exc, BackPressureError):
        message = f"model {model!r} is at capacity; retry shortly"
    elif isinstance(exc, RayActorError):
        message = f"model {model!r} lost the replica serving this request; retry"
    else:
        # A RayTaskError's text carries the remote traceback; clients get the cause only.
        cause = getattr(exc, "cause", None) or exc
        detail = f"{type(cause).__name__}: {cause}"[:300]
        return APIError(500, f"model {model!r} failed: {detail}", code="engine_error")
    return APIError(503, message, code="unavailable", retry_after_s=RETRY_AFTER_S)


class OpenAIRouter:
    """A `ModelBackend` over one Serve handle per model, plus its HTTP app."""

    def __init__(self, config: AppConfig, models: dict[str, DeploymentHandle]) -> None:
        self._config = config
        self._models = models
        self._streaming = {name: handle.options(stream=True) for name, handle in models.items()}

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_openai_app(self._config, self)

    async def generate(self, model: str, request: GenerationRequest) -> GenerationResult | EngineError:
        try:
            return await self._models[model].generate.remote(request)
        except Exception as exc:
            raise _client_error(model, exc) from exc

    async def stream(
        self, model: str, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        """Chunks from the replica. A failure before the first chunk raises (a plain
        HTTP error); after it, it arrives as an `EngineError` (an SSE error event)."""
        responses = self._streaming[model].stream.remote(request)
        started = False
        try:
            async for chunk in responses:
                started = True
                yield chunk
        except Exception as exc:
            error = _client_error(model, exc)
            if not started:
                raise error from exc
            yield EngineError(error.message, status=error.status, code=error.code, type=error.info().type)
        finally:
            responses.cancel()
