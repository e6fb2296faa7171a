"""Reading and checking request bodies before anything reaches a replica.

The body must arrive within the size limit and read deadline, be UTF-8 JSON
(no `NaN`/`Infinity`, no nesting deeper than the parser allows, no integer
literal past Python's digit limit), hold only valid Unicode text (no lone
surrogates, which break tokenizers and UTF-8 encoding later), and fit the
ingress's limits. Each failure is an `APIError` with a 4xx status. At most
`ingress.max_body_reads` bodies are read at once: past that a request gets 503
at once, so slow bodies cannot take every place a legitimate request needs.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import deque
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from serve_app.config import IngressConfig
from serve_app.openai.errors import APIError

RequestModel = TypeVar("RequestModel", bound=BaseModel)

_SURROGATE = re.compile("[\ud800-\udfff]")
"""A UTF-16 surrogate left in decoded text: JSON can escape one alone (`"\\ud800"`), UTF-8 cannot encode it."""
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""How a surrogate appears in JSON text; bodies without one skip the search."""


BODY_READS_RETRY_AFTER_S = 1
"""`Retry-After` of a request refused because `ingress.max_body_reads` bodies are arriving."""


class BodyReader:
    """Reads request bodies, at most `ingress.max_body_reads` at once."""

    def __init__(self, ingress: IngressConfig) -> None:
        self._ingress = ingress
        self._reading = 0

    async def read(self, http: Request) -> dict[str, Any] | None:
        """The body as a JSON object; None when the client left before all of it
        came. Past `max_body_reads` bodies arriving at once: 503 without reading."""
        limit = self._ingress.max_body_reads
        if self._reading >= limit:
            raise APIError(503, f"the server is already receiving {limit} request bodies",
                           code="overloaded", retry_after_s=BODY_READS_RETRY_AFTER_S)
        self._reading += 1
        try:
            return await read_json_object(http, self._ingress)
        except ClientDisconnect:
            return None
        finally:
            self._reading -= 1


async def read_json_object(request: Request, ingress: IngressConfig) -> dict[str, Any]:
    """The request body as a JSON object of valid text, or an APIError."""
    limit = ingress.max_body_bytes
    too_large = APIError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(ingress.body_read_timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise too_large
    except TimeoutError:
        raise APIError(
            408, f"the request body did not arrive within {ingress.body_read_timeout_s:g} s", code="request_timeout"
        ) from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    value = _loads(text)
    if not isinstance(value, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    where = _lone_surrogate_at(value) if _SURROGATE_ESCAPE.search(text) else None
    if where is not None:
        raise APIError(
            400,
            f"{where} contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text",
            param=where,
            code="invalid_unicode",
        )
    return value


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise APIError(
            400, f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None
    except ValueError:  # the only other one json raises: an integer past the interpreter's digit limit
        raise APIError(
            400, f"request body has an integer longer than {sys.get_int_max_str_digits()} digits",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise APIError(400, "request body nests JSON arrays or objects too deeply", code="invalid_json") from None


def _no_constant(literal: str) -> float:
    raise APIError(400, f"request body is not valid JSON: {literal} is not a JSON number", code="invalid_json")


def _has_surrogate(text: object) -> bool:
    return isinstance(text, str) and not text.isascii() and _SURROGATE.search(text) is not None


def _lone_surrogate_at(body: dict[str, Any]) -> str | None:
    """Dotted path of the first key or string holding a lone surrogate (shallowest
    first), or None. Iterative, so deep nesting cannot overflow the stack; paths
    are kept as (parent, key) links and spelt out only for the one reported."""
    pending: deque[tuple[dict | list, tuple | None]] = deque([(body, None)])
    while pending:
        container, path = pending.popleft()
        for key, child in container.items() if isinstance(container, dict) else enumerate(container):
            if _has_surrogate(key) or _has_surrogate(child):
                return _dotted((path, key))
            if isinstance(child, (dict, list)):
                pending.append((child, (path, key)))
    return None


def _dotted(path: tuple | None) -> str:
    parts = []
    while path is not None:
        path, key = path
        parts.append(str(key).encode("utf-8", "backslashreplace").decode("utf-8"))
    return ".".join(reversed(parts))


def parse(model: type[RequestModel], body: dict[str, Any], max_error_chars: int) -> RequestModel:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise APIError.from_validation(exc, max_error_chars) from None


def check_limits(request: Any, ingress: IngressConfig) -> None:
    """The ingress's bounds on stop strings and messages (vLLM's own request
    model, parsed); vLLM's layer checks the prompt and output against the context."""
    stop = getattr(request, "stop", None)
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > ingress.max_stop_sequences:
        raise APIError(400, f"stop: send at most {ingress.max_stop_sequences} stop strings, not {len(stops)}",
                       param="stop")
    longest = max(map(len, stops), default=0)
    if longest > ingress.max_stop_chars:
        raise APIError(400, f"stop: each stop string may have at most {ingress.max_stop_chars} characters, "
                       f"one has {longest}", param="stop")
    messages = getattr(request, "messages", None)
    if messages is not None and len(messages) > ingress.max_messages:
        raise APIError(400, f"messages: send at most {ingress.max_messages} messages, not {len(messages)}",
                       param="messages")
