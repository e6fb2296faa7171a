"""OpenAI-style errors: one exception type, one JSON shape, the right status.

Engine refusals (`EngineError`) and the scheduler's domain refusals
(`serve_app.scheduling.errors`) become an `APIError` here.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.responses import JSONResponse

from serve_app.engine.base import EngineError
from serve_app.openai.protocol import ErrorInfo, ErrorResponse
from serve_app.scheduling.errors import Overloaded, RateLimited, Refused, Unavailable

_REFUSALS: dict[type[Refused], tuple[int, str]] = {
    RateLimited: (429, "rate_limit_exceeded"),
    Overloaded: (503, "overloaded"),
    Unavailable: (503, "unavailable"),
}

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class APIError(Exception):
    """An error the client should see, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    @classmethod
    def from_engine(cls, error: EngineError) -> APIError:
        return cls(error.status, error.message, param=error.param, code=error.code)

    @classmethod
    def from_refusal(cls, refusal: Refused) -> APIError:
        status, code = _REFUSALS[type(refusal)]
        return cls(status, refusal.message, code=code, retry_after_s=refusal.retry_after_s)

    @classmethod
    def from_validation(cls, exc: ValidationError) -> APIError:
        problems = []
        for item in exc.errors():
            where = ".".join(str(part) for part in item["loc"]) or "body"
            problems.append(f"{where}: {item['msg']}")
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        return cls(400, "; ".join(problems), param=str(first[0]) if first else None)

    def info(self) -> ErrorInfo:
        return ErrorInfo(
            message=self.message,
            type=_TYPE_BY_STATUS.get(self.status, "server_error"),
            param=self.param,
            code=self.code,
        )

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return JSONResponse(
            ErrorResponse(error=self.info()).model_dump(),
            status_code=self.status,
            headers=headers,
        )
