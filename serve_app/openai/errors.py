"""OpenAI-style errors: one exception type, one JSON shape, the right status.

Engine refusals (`EngineError`) and the scheduler's domain refusals
(`serve_app.scheduling.errors`) become an `APIError` here.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse

from serve_app.engine.base import EngineError
from serve_app.scheduling.errors import Overloaded, RateLimited, Refused, Unavailable

_REFUSALS: dict[type[Refused], tuple[int, str]] = {
    RateLimited: (429, "rate_limit_exceeded"),
    Overloaded: (503, "overloaded"),
    Unavailable: (503, "unavailable"),
}

_SEPARATOR = "; "
_MORE_RESERVE = 40
"""Characters kept free for the `(and N more problems)` note."""

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


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
    def from_validation(cls, exc: ValidationError, max_chars: int | None = None) -> APIError:
        """A 400 listing the problems, each as `field.path: message`; with
        `max_chars`, only those that fit, and how many more there were."""
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        shown: list[str] = []
        used = 0
        for item in errors:
            where = ".".join(str(part) for part in item["loc"]) or "body"
            problem = f"{where}: {item['msg']}"
            used += len(problem) + len(_SEPARATOR)
            if shown and max_chars is not None and used > max_chars - _MORE_RESERVE:
                break
            shown.append(problem)
        message = _SEPARATOR.join(shown)
        if len(shown) < len(errors):
            message += f" (and {len(errors) - len(shown)} more problems)"
        first = errors[0]["loc"] if errors else ()
        return cls(400, message, param=str(first[0]) if first else None)

    def info(self, max_chars: int | None = None) -> ErrorInfo:
        """The OpenAI error object; `max_chars` caps its message and param."""
        return ErrorInfo(
            message=clip(self.message, max_chars),
            type=_TYPE_BY_STATUS.get(self.status, "server_error"),
            param=clip(self.param, max_chars) if self.param is not None else None,
            code=self.code,
        )

    def response(self, max_chars: int | None = None) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return JSONResponse(
            ErrorResponse(error=self.info(max_chars)).model_dump(),
            status_code=self.status,
            headers=headers,
        )


def clip(text: str, max_chars: int | None) -> str:
    """`text` cut to `max_chars`, saying how long it was."""
    if max_chars is None or len(text) <= max_chars:
        return text
    note = f"... (cut from {len(text)} characters)"
    return text[: max(0, max_chars - len(note))] + note
