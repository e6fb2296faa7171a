"""The request fields this app adds to vLLM's: server-side templates and priority.

They are taken out of the body before vLLM's request model reads it: `template`
with `params` (rendered into `messages` or `prompt`), and `priority` when it
names a priority class (vLLM's own `priority` is an integer and stays).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from serve_app.config import PRIORITIES, Priority
from serve_app.openai.errors import APIError
from serve_app.openai.templates import ParamValue, TemplateError, TemplateRegistry
from serve_app.scheduling.prompt_features import SamplingSummary, describe
from serve_app.scheduling.types import RequestMeta


class AppFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str | None = None
    """Name of a server-side prompt template, sent instead of the prompt."""
    params: dict[str, ParamValue] | None = None
    """Values for the template's placeholders."""
    priority: Literal["realtime", "batch"] | None = None
    """Priority class (also settable with the `X-Priority` header)."""

    @classmethod
    def pop_from(cls, body: dict[str, Any], max_error_chars: int) -> AppFields:
        """This app's fields, removed from `body`."""
        fields = {name: body.pop(name) for name in ("template", "params") if name in body}
        if isinstance(body.get("priority"), str):
            fields["priority"] = body.pop("priority")
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise APIError.from_validation(exc, max_error_chars) from None

    def render_into(self, body: dict[str, Any], kind: str, templates: TemplateRegistry) -> None:
        """Put the rendered template where the endpoint reads its prompt."""
        if self.template is None:
            if self.params is not None:
                raise APIError(400, "params are only read with a template", param="params")
            return
        field = "messages" if kind == "chat" else "prompt"
        if body.get(field) or body.get("input"):
            raise APIError(400, f"send either {field} or a template, not both", param="template")
        try:
            rendered = templates.render(self.template, self.params or {})
        except TemplateError as exc:
            raise APIError(400, str(exc), param=exc.param, code="invalid_template") from None
        if kind == "chat":
            system = [{"role": "system", "content": rendered.system}] if rendered.system is not None else []
            body["messages"] = [*system, {"role": "user", "content": rendered.prompt}]
        else:
            body["prompt"] = rendered.prompt if rendered.system is None else f"{rendered.system}\n\n{rendered.prompt}"


def requested_max_tokens(request: Any) -> int | None:
    """The output cap a vLLM request model carries: chat's `max_completion_tokens`
    before its `max_tokens` (as vLLM reads them), or the Responses API's `max_output_tokens`."""
    for field in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        if (cap := getattr(request, field, None)) is not None:
            return cap
    return None


def request_meta(http: Request, fields: AppFields, request: Any, body: dict[str, Any], client: str | None,
                 default: Priority) -> RequestMeta:
    """What the scheduler knows of a request: its priority class, its client and
    what the length predictor reads (vLLM's parsed `request`, the raw `body`)."""
    header = http.headers.get("x-priority")
    if header is not None and header not in PRIORITIES:
        raise APIError(400, f"X-Priority must be one of {', '.join(PRIORITIES)}", param="priority")
    priority = fields.priority or header or default
    stop = getattr(request, "stop", None)
    sampling = SamplingSummary(
        max_tokens=requested_max_tokens(request),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        temperature=_or(getattr(request, "temperature", None), 1.0),
        top_p=_or(getattr(request, "top_p", None), 1.0),
        ignore_eos=bool(getattr(request, "ignore_eos", False)))
    messages = body.get("messages")
    turns = None if messages is None else tuple((str(m.get("role")), _text(m.get("content"))) for m in messages
                                                if isinstance(m, dict))
    prompt = body.get("prompt") if messages is None else None
    prompt_text = _text(prompt if prompt is not None else body.get("input"))
    prompt_class = describe(turns, prompt_text, sampling, request.model, fields.template)
    return RequestMeta(priority, client, prompt_class)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _text(value: Any) -> str:
    """The text in a message content, a prompt or an input (strings, parts, lists)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text(item) for item in value)
    if isinstance(value, dict):
        return _text(value.get("content")) + _text(value.get("text"))
    return ""
