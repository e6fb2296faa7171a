"""Every error the HTTP app answers, and its status.

The app's own refusals (`APIError`, the scheduler's `Refused` and
`DeadlineExceeded`, unknown routes) are OpenAI-style bodies with OpenAI's error
types. What vLLM's OpenAI layer refuses (validation, sampling values, context
length) is answered as `vllm serve` answers it, with vLLM's types. Either
message is capped at `ingress.max_error_chars`; an unexpected exception is a
500 naming only its type (the traceback goes to the log).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from serve_app.openai.errors import APIError, clip
from serve_app.scheduling.errors import DeadlineExceeded, Refused


def vllm_error_response(result: Any, max_chars: int) -> JSONResponse:
    """vLLM's `ErrorResponse`, its message and param capped at `max_chars`."""
    error = result.error
    error.message = clip(error.message, max_chars)
    error.param = clip(error.param, max_chars) if error.param is not None else None
    return JSONResponse(result.model_dump(), status_code=error.code)


def install_error_handlers(app: FastAPI, max_chars: int, vllm_args: Any) -> None:
    """`vllm_args`: the frontend's `vllm serve` arguments, which vLLM's handlers read."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler
    from vllm.exceptions import VLLMError

    app.state.args = vllm_args

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

    @app.exception_handler(RequestValidationError)
    async def invalid(http: Request, exc: RequestValidationError) -> Response:
        error = json.loads((await validation_exception_handler(http, exc)).body)
        return vllm_error_response(ErrorResponse.model_validate(error), max_chars)

    async def refused_by_vllm(_: Request, exc: Exception) -> Response:
        return vllm_error_response(create_error_response(exc), max_chars)

    for kind in (VLLMError, ValueError, TypeError, OverflowError, NotImplementedError):
        app.add_exception_handler(kind, refused_by_vllm)

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> Response:
        # Starlette re-raises it after this response, so the server logs the traceback.
        return APIError(500, f"internal error: {type(exc).__name__}").response()
