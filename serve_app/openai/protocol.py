"""OpenAI-compatible wire models (requests, responses, stream chunks, errors).

Requests forbid unknown fields, as the OpenAI API does, so a typo'd or
unsupported parameter is a 400 naming it rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.openai.templates import ParamValue

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Range of the integer sampling fields (`seed`, `top_k`): engines hold them as int64."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(StrictRequest):
    include_usage: bool = False


class SamplingFields(StrictRequest):
    """Fields both completion endpoints share."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    """vLLM extension: sample from the k most likely tokens (-1: all)."""
    n: Literal[1] = 1
    """Only one choice per request is served."""
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    ignore_eos: bool = False
    """vLLM extension: keep generating past end-of-sequence (benchmarks)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    template: str | None = None
    """Name of a server-side prompt template, sent instead of the prompt."""
    params: dict[str, ParamValue] | None = None
    """Values for the template's placeholders."""
    priority: Literal["realtime", "batch"] | None = None
    """Priority class (also settable with the `X-Priority` header)."""

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("stop strings must not be empty")
        return stop

    @property
    def output_limit(self) -> int | None:
        """The most output tokens the request asks for."""
        return self.max_tokens

    @property
    def output_limit_field(self) -> str:
        """The field `output_limit` comes from."""
        return "max_tokens"

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextContentPart(StrictRequest):
    type: Literal["text"]
    text: str


class ChatMessage(StrictRequest):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextContentPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _prompt_source(self) -> ChatCompletionRequest:
        if self.template is None and not self.messages:
            raise ValueError("send messages, or a template with params")
        if self.template is not None and self.messages:
            raise ValueError("send either messages or a template, not both")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | None = None
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Literal[False] = False
    """Echoing the prompt back is not supported."""

    @model_validator(mode="after")
    def _prompt_source(self) -> CompletionRequest:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ValueError("send one prompt per request (batched prompts are not served)")
            self.prompt = self.prompt[0]
        if self.template is None and self.prompt is None:
            raise ValueError("send a prompt, or a template with params")
        if self.template is not None and self.prompt is not None:
            raise ValueError("send either a prompt or a template, not both")
        return self


# --- responses -------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


class CompletionResponse(BaseModel):
    """Both the full `/v1/completions` answer and each of its stream chunks."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "serve_app"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
