"""The OpenAI-compatible HTTP surface, over any `ModelBackend`.

The Ray Serve ingress (`deployments.ingress`) is one backend; tests plug in an
in-process one. Everything HTTP lives here: bodies (`serve_app.openai.body`),
validation errors, SSE, gzip, and OpenAI-style error bodies, each capped at
`ingress.max_error_chars`; an unexpected exception is a 500 naming only its type.

`/health` and `/ready` (200 when every model can answer, else 503; its detail only
to a valid key when keys are on) are open; every other route, `/openapi.json`
included, needs a valid key when keys are on; `/docs` and `/redoc` are off. A
request is charged to its key's rate before its body is read; a client that leaves
before its answer is logged as 499 and its work cancelled (`client_gone`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import JSONResponse, Response, StreamingResponse

from serve_app.config import PRIORITIES, AppConfig, Priority
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.openai.auth import Authenticator
from serve_app.openai.body import BodyReader, check_limits, parse
from serve_app.openai.client_gone import GONE, first_unless_gone, unless_gone
from serve_app.openai.conversion import (
    chat_generation_request,
    chat_response,
    chat_sse,
    completion_generation_request,
    completion_response,
    completion_sse,
)
from serve_app.openai.errors import APIError
from serve_app.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    SamplingFields,
    new_id,
    now,
)
from serve_app.openai.templates import TemplateRegistry
from serve_app.scheduling.errors import DeadlineExceeded, Refused
from serve_app.scheduling.prompt_features import describe
from serve_app.scheduling.types import RequestMeta


class ModelBackend(Protocol):
    """Where generation happens: a model name, an engine request and what the
    ingress knows about it (priority, client, prompt class)."""

    async def generate(self, model: str, request: GenerationRequest, meta: RequestMeta) -> GenerationResult | EngineError:
        ...

    def stream(
        self, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        ...

    async def stats(self) -> dict[str, Any]:
        """Operator view of queues and predictions (`GET /stats`)."""
        ...

    def cost(self) -> dict[str, Any]:
        """Metered cost, per 1k requests and per 1M output tokens (`GET /v1/cost`)."""
        ...

    def readiness(self) -> dict[str, Any]:
        """`{"ready": bool, "models": {...}}`: whether each model can answer now."""
        ...

    def admit(self, client: str | None) -> None:
        """Charge one request to the client's request rate as it arrives, before
        its body is read; raises `RateLimited` when it is over."""
        ...


def request_meta(
    http: Request, request: SamplingFields, generation: GenerationRequest, client: str | None, default: Priority
) -> RequestMeta:
    header = http.headers.get("x-priority")
    if header is not None and header not in PRIORITIES:
        raise APIError(400, f"X-Priority must be one of {', '.join(PRIORITIES)}", param="priority")
    priority = request.priority or header or default
    prompt_class = describe(generation.messages, generation.prompt, generation.sampling, request.model, request.template)
    return RequestMeta(priority, client, prompt_class)


class OpenAIServer:
    """Request handling shared by both completion endpoints."""

    def __init__(self, config: AppConfig, backend: ModelBackend) -> None:
        self._config = config
        self._backend = backend
        self._auth = Authenticator(config.ingress.api_keys)
        self._templates = TemplateRegistry(config.templates)
        self._models = config.model_by_name()
        self._context = {name: model.max_context_tokens() for name, model in self._models.items()}
        self._created = now()
        self._bodies = BodyReader(config.ingress)

    def authenticate(self, http: Request) -> str | None:
        """The calling client's name (None when keys are off); 401 otherwise."""
        return self._auth.client(http.headers.get("authorization"))

    def model_list(self, http: Request) -> ModelList:
        self.authenticate(http)
        return ModelList(
            data=[
                ModelCard(id=name, created=self._created, max_model_len=model.engine.max_model_len)
                for name, model in self._models.items()
            ]
        )

    def resolve_model(self, requested: str | None) -> str:
        if requested is None:
            return self._config.models[0].name
        if requested not in self._models:
            raise APIError(
                404,
                f"The model '{requested}' does not exist (served: {', '.join(self._models)})",
                param="model",
                code="model_not_found",
            )
        return requested

    async def stats(self, http: Request) -> dict[str, Any]:
        self.authenticate(http)
        return await self._backend.stats()

    async def cost(self, http: Request) -> dict[str, Any]:
        self.authenticate(http)
        return self._backend.cost()

    async def _complete(
        self, http: Request, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> GenerationResult | None:
        """The whole answer; None when the client went away first (the work is
        cancelled). Both guards are the ingress's own, so no header a client
        sends to Serve's proxy can turn off the timeout or the cancellation."""
        try:
            result = await unless_gone(http, self._backend.generate(model, request, meta),
                                       self._config.ingress.request_timeout_s)
        except TimeoutError:
            raise APIError(504, "the request took longer than the server allows", code="timeout") from None
        if result is GONE:
            return None
        if isinstance(result, EngineError):
            raise APIError.from_engine(result)
        return result

    async def _open_stream(
        self, http: Request, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> tuple[str, AsyncIterator[GenerationChunk | EngineError]] | None:
        """Start a stream; an error before any output becomes a plain HTTP error.
        Returns the model that answers (the first chunk says) and the chunks, or
        None when the client left before the first chunk (the work is cancelled:
        the ingress watches the client itself, as `_complete` does)."""
        chunks = self._backend.stream(model, request, meta)
        first = await first_unless_gone(http, chunks)
        if first is GONE:
            return None
        if isinstance(first, EngineError):
            await chunks.aclose()
            raise APIError.from_engine(first)

        async def replay() -> AsyncIterator[GenerationChunk | EngineError]:
            try:
                if first is not None:
                    yield first
                async for chunk in chunks:
                    yield chunk
            finally:
                await chunks.aclose()

        return (first.model if first is not None else None) or model, replay()

    def handler(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(http: Request) -> Response:
            return await self.handle(http, endpoint)

        return handle

    async def handle(self, http: Request, endpoint: Endpoint) -> Response:
        client = self.authenticate(http)
        self._backend.admit(client)
        body = await self._bodies.read(http)
        if body is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        ingress = self._config.ingress
        request = parse(endpoint.request_model, body, ingress.max_error_chars)
        model = self.resolve_model(request.model)
        check_limits(request, ingress, self._context[model])
        request_id = new_id(endpoint.id_prefix)
        generation = endpoint.to_generation(request, self._templates, request_id)
        meta = request_meta(http, request, generation, client, ingress.priorities.default)
        generation = replace(generation, cache_salt=client)  # with keys on: no prefix-cache sharing across tenants
        if not request.stream:
            result = await self._complete(http, model, generation, meta)
            if result is None:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            return JSONResponse(endpoint.to_response(request_id, result.model or model, result).model_dump())
        opened = await self._open_stream(http, model, generation, meta)
        if opened is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        answering, chunks = opened
        return event_stream(endpoint.to_events(request_id, answering, chunks, request.include_usage))

    async def ready(self, http: Request) -> Response:
        """200 when every model can answer, else 503. With keys configured, the
        per-model detail goes only to a valid key; anyone else gets `ready` alone."""
        report = self._backend.readiness()
        status = 200 if report["ready"] else 503
        try:
            self.authenticate(http)
        except APIError:
            report = {"ready": report["ready"]}
        return JSONResponse(report, status_code=status)


CLIENT_CLOSED_REQUEST = 499
"""Status logged for a request whose client left before the answer (nginx's convention)."""


@dataclass(frozen=True)
class Endpoint:
    """How one completion endpoint converts its requests and outputs."""

    request_model: type[SamplingFields]
    id_prefix: str
    to_generation: Callable[..., GenerationRequest]
    to_response: Callable[[str, str, GenerationResult], BaseModel]
    to_events: Callable[..., AsyncIterator[str]]


CHAT = Endpoint(ChatCompletionRequest, "chatcmpl", chat_generation_request, chat_response, chat_sse)
COMPLETIONS = Endpoint(CompletionRequest, "cmpl", completion_generation_request, completion_response, completion_sse)


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def build_openai_app(config: AppConfig, backend: ModelBackend) -> FastAPI:
    """The FastAPI app serving `/v1/*`, `/stats`, `/health`, `/ready` and `/openapi.json` over `backend`."""
    server = OpenAIServer(config, backend)
    max_chars = config.ingress.max_error_chars
    app = FastAPI(title="serve_app", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(GZipMiddleware, minimum_size=config.ingress.gzip_min_bytes)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response(max_chars)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> Response:
        return APIError.from_refusal(exc).response(max_chars)

    @app.exception_handler(DeadlineExceeded)
    async def deadline(_: Request, exc: DeadlineExceeded) -> Response:
        return APIError(504, f"the request took longer than the server allows ({exc})", code="timeout").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return APIError(exc.status_code, str(exc.detail)).response(max_chars)

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> Response:
        # Starlette re-raises it after this response, so the server logs the traceback.
        return APIError(500, f"internal error: {type(exc).__name__}").response()

    async def openapi(http: Request) -> Response:
        server.authenticate(http)
        return JSONResponse(app.openapi())

    for path, endpoint in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETIONS)):
        app.add_api_route(path, server.handler(endpoint), methods=["POST"])
    app.add_api_route("/v1/models", server.model_list, methods=["GET"], response_model=ModelList)
    app.add_api_route("/stats", server.stats, methods=["GET"])
    app.add_api_route("/v1/cost", server.cost, methods=["GET"])
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    app.add_api_route("/ready", server.ready, methods=["GET"])
    app.add_api_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)
    return app
