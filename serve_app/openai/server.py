"""The OpenAI-compatible HTTP surface: vLLM's own OpenAI layer behind the app's gates.

Each served model has the serving classes `vllm serve` runs
(`serve_app.openai.frontend`): they parse, render, check and answer requests
as `vllm serve` does, and their `generate` goes through the app's scheduler
(`routed_engine`). Before them the app adds what it owns: API keys and each
key's request rate (charged before the body is read), body bounds (`body`),
server-side templates (`template` + `params`), priority (`X-Priority` or a
`priority` class name), the model's pools; after them, the client watch (a
client that leaves is logged as 499 and its work cancelled, `client_gone`)
and the request deadline. Errors: `error_handlers`.

`/health` and `/ready` (200 when every model can answer, else 503; its detail only
to a valid key when keys are on) are open; every other route needs a valid key
when keys are on; `/docs` and `/redoc` are off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import JSONResponse, Response, StreamingResponse

from serve_app.config import AppConfig
from serve_app.openai.app_fields import AppFields, request_meta, requested_max_tokens
from serve_app.openai.auth import Authenticator
from serve_app.openai.body import BodyReader, check_limits
from serve_app.openai.client_gone import GONE, first_unless_gone, unless_gone
from serve_app.openai.error_handlers import install_error_handlers, vllm_error_response
from serve_app.openai.errors import APIError
from serve_app.openai.frontend import ModelFrontend
from serve_app.openai.routed_engine import CURRENT_REQUEST, ModelBackend, RequestContext
from serve_app.openai.templates import TemplateRegistry
from serve_app.scheduling.types import RequestMeta


class IngressBackend(ModelBackend, Protocol):
    """The scheduler behind the HTTP surface, and what it reports."""

    async def stats(self) -> dict[str, Any]:
        """Operator view of queues and predictions (`GET /stats`)."""
        ...

    def cost(self) -> dict[str, Any]:
        """Metered cost, per 1k requests and per 1M output tokens (`GET /v1/cost`)."""
        ...

    def readiness(self) -> dict[str, Any]:
        """`{"ready": bool, "models": {...}}`: whether each model can answer now."""
        ...

    def route(self, model: str, meta: RequestMeta, max_tokens: int | None) -> str:
        """The model that answers a request for `model` now (it or its fallback)."""
        ...

    def admit(self, client: str | None) -> None:
        """Charge one request to the client's request rate as it arrives, before
        its body is read; raises `RateLimited` when it is over."""
        ...


@dataclass(frozen=True)
class Endpoint:
    """One generating endpoint: vLLM's request model and serving call for it."""

    request_model: Callable[[dict[str, Any]], Any]
    kind: str
    """The prompt class kind: `chat` (messages) or `completion` (a prompt)."""
    serve: Callable[[Any], Callable[..., Any]]
    """The vLLM serving method, from a model's `ModelFrontend.state`."""
    dump: dict[str, Any]
    """How vLLM's own router dumps the response model."""


def endpoints() -> dict[str, Endpoint]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return {
        "/v1/chat/completions": Endpoint(ChatCompletionRequest.model_validate, "chat",
                                         lambda state: state.openai_serving_chat.create_chat_completion, {}),
        "/v1/completions": Endpoint(CompletionRequest.model_validate, "completion",
                                    lambda state: state.openai_serving_completion.create_completion, {}),
        "/v1/responses": Endpoint(ResponsesRequest.model_validate, "chat",
                                  lambda state: state.openai_serving_responses.create_responses,
                                  {"mode": "json", "by_alias": True}),
    }


UNSERVABLE_RETRY_AFTER_S = 60
"""`Retry-After` for a model whose config vLLM refused (it takes a redeploy)."""
CLIENT_CLOSED_REQUEST = 499
"""Status logged for a request whose client left before the answer (nginx's convention)."""


class OpenAIServer:
    """Request handling shared by every endpoint."""

    def __init__(self, config: AppConfig, backend: IngressBackend, frontends: dict[str, ModelFrontend]) -> None:
        self._config = config
        self._backend = backend
        self._frontends = frontends
        self._auth = Authenticator(config.ingress.api_keys)
        self._templates = TemplateRegistry(config.templates)
        self._bodies = BodyReader(config.ingress)

    def authenticate(self, http: Request) -> str | None:
        """The calling client's name (None when keys are off); 401 otherwise."""
        return self._auth.client(http.headers.get("authorization"))

    def resolve_model(self, requested: Any) -> ModelFrontend:
        if requested is None:
            requested = next(iter(self._frontends))
        if requested not in self._frontends:
            raise APIError(404, f"The model `{requested}` does not exist.", param="model", code="model_not_found")
        frontend = self._frontends[requested]
        if frontend.refused is not None:
            raise APIError(503, f"model {requested!r} cannot be served: {frontend.refused}", code="unavailable",
                           retry_after_s=UNSERVABLE_RETRY_AFTER_S)
        return frontend

    async def model_list(self, http: Request) -> Response:
        self.authenticate(http)
        lists = [await f.state.openai_serving_models.show_available_models()
                 for f in self._frontends.values() if f.state is not None]
        return JSONResponse({"object": "list", "data": [card.model_dump() for models in lists for card in models.data]})

    async def stats(self, http: Request) -> dict[str, Any]:
        self.authenticate(http)
        return await self._backend.stats()

    async def cost(self, http: Request) -> dict[str, Any]:
        self.authenticate(http)
        return self._backend.cost()

    async def _body(self, http: Request) -> tuple[str | None, dict[str, Any] | None]:
        client = self.authenticate(http)
        self._backend.admit(client)
        return client, await self._bodies.read(http)

    @staticmethod
    def validated(request_model: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> Any:
        """vLLM's request model of `body`; a `RequestValidationError` (answered
        by vLLM's own handler) when it does not fit."""
        try:
            return request_model(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None

    async def tokenization(self, http: Request, detokenize: bool) -> Response:
        from pydantic import TypeAdapter
        from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest

        _, body = await self._body(http)
        if body is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        frontend = self.resolve_model(body.get("model"))
        model = DetokenizeRequest if detokenize else TypeAdapter(TokenizeRequest)
        request = self.validated(model.model_validate if detokenize else model.validate_python, body)
        serving = frontend.state.serving_tokenization
        result = await (serving.create_detokenize if detokenize else serving.create_tokenize)(request, http)
        return answer(result, {}, self._config.ingress.max_error_chars)

    async def handle(self, http: Request, endpoint: Endpoint) -> Response:
        client, body = await self._body(http)
        if body is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        ingress = self._config.ingress
        fields = AppFields.pop_from(body, ingress.max_error_chars)
        frontend = self.resolve_model(body.get("model"))
        fields.render_into(body, endpoint.kind, self._templates)
        body["model"] = frontend.name
        request = self.validated(endpoint.request_model, body)
        check_limits(request, ingress)
        meta = request_meta(http, fields, request, body, client, ingress.priorities.default)
        answering = self._backend.route(frontend.name, meta, requested_max_tokens(request))
        if answering != frontend.name:  # the fallback tier: rendered with its own tokenizer and template
            frontend = self.resolve_model(answering)
            request = self.validated(endpoint.request_model, {**body, "model": answering})
        # with keys on: no prefix-cache sharing across tenants
        context = RequestContext(frontend.name, meta, self._backend, cache_salt=client)
        CURRENT_REQUEST.set(context)
        serve = endpoint.serve(frontend.state)
        if not getattr(request, "stream", False):
            try:
                result = await unless_gone(http, serve(request, http), ingress.request_timeout_s)
            except TimeoutError:
                raise APIError(504, "the request took longer than the server allows", code="timeout") from None
            if result is GONE:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            return answer(result, endpoint.dump, ingress.max_error_chars)
        result = await serve(request, http)
        if not isinstance(result, AsyncIterator):
            return answer(result, endpoint.dump, ingress.max_error_chars)
        first = await first_unless_gone(http, result)
        if first is GONE:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if context.refusal is not None:  # nothing was sent: an HTTP error, not an error event
            await result.aclose()
            raise context.refusal
        return event_stream(replay(first, result))

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


def answer(result: Any, dump: dict[str, Any], max_error_chars: int) -> Response:
    """vLLM's response or `ErrorResponse` as its own router sends it."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    if isinstance(result, ErrorResponse):
        return vllm_error_response(result, max_error_chars)
    assert isinstance(result, BaseModel), type(result)
    return JSONResponse(result.model_dump(**dump))


async def replay(first: str | None, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The stream's events, the first one already taken."""
    try:
        if first is not None:
            yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def build_openai_app(config: AppConfig, backend: IngressBackend, frontends: dict[str, ModelFrontend]) -> FastAPI:
    """The FastAPI app serving `/v1/*`, `/tokenize`, `/detokenize`, `/stats`,
    `/health` and `/ready` over `backend`, one vLLM frontend per model."""
    server = OpenAIServer(config, backend, frontends)
    max_chars = config.ingress.max_error_chars
    app = FastAPI(title="serve_app", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(GZipMiddleware, minimum_size=config.ingress.gzip_min_bytes)

    install_error_handlers(app, max_chars, next(f.state.args for f in frontends.values() if f.state is not None))

    async def tokenize(http: Request) -> Response:
        return await server.tokenization(http, detokenize=False)

    async def detokenize(http: Request) -> Response:
        return await server.tokenization(http, detokenize=True)

    async def openapi(http: Request) -> Response:
        server.authenticate(http)
        return JSONResponse(app.openapi())

    for path, endpoint in endpoints().items():
        app.add_api_route(path, handler(server, endpoint), methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_api_route("/v1/models", server.model_list, methods=["GET"])
    app.add_api_route("/stats", server.stats, methods=["GET"])
    app.add_api_route("/v1/cost", server.cost, methods=["GET"])
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    app.add_api_route("/ready", server.ready, methods=["GET"])
    app.add_api_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)
    return app


def handler(server: OpenAIServer, endpoint: Endpoint) -> Callable[[Request], Any]:
    async def handle(http: Request) -> Response:
        return await server.handle(http, endpoint)

    return handle
