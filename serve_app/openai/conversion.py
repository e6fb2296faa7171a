"""Convert between OpenAI wire models and engine requests/outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel

from serve_app.engine.base import (
    EngineError,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    SamplingOptions,
)
from serve_app.openai.errors import APIError
from serve_app.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    SamplingFields,
    UsageInfo,
    now,
)
from serve_app.openai.templates import TemplateError, TemplateRegistry


def _sampling(request: SamplingFields, max_tokens: int | None) -> SamplingOptions:
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=tuple(request.stop_list()),
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        ignore_eos=request.ignore_eos,
    )


def _render(templates: TemplateRegistry, request: SamplingFields):
    try:
        return templates.render(request.template, request.params or {})
    except TemplateError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_template") from None


def chat_generation_request(
    request: ChatCompletionRequest, templates: TemplateRegistry, request_id: str
) -> GenerationRequest:
    if request.template is not None:
        rendered = _render(templates, request)
        messages = [("user", rendered.prompt)]
        if rendered.system is not None:
            messages.insert(0, ("system", rendered.system))
    else:
        messages = [(message.role, message.text()) for message in request.messages]
    return GenerationRequest(
        request_id=request_id,
        sampling=_sampling(request, request.output_limit),
        messages=tuple(messages),
    )


def completion_generation_request(
    request: CompletionRequest, templates: TemplateRegistry, request_id: str
) -> GenerationRequest:
    if request.template is not None:
        rendered = _render(templates, request)
        prompt = rendered.prompt
        if rendered.system is not None:
            prompt = f"{rendered.system}\n\n{prompt}"
    else:
        prompt = request.prompt
    return GenerationRequest(
        request_id=request_id,
        sampling=_sampling(request, request.output_limit),
        prompt=prompt,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def chat_response(request_id: str, model: str, result: GenerationResult) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=request_id,
        created=now(),
        model=model,
        choices=[
            ChatChoice(
                message=AssistantMessage(content=result.text),
                finish_reason=result.finish_reason,
            )
        ],
        usage=usage(result.prompt_tokens, result.completion_tokens),
    )


def completion_response(request_id: str, model: str, result: GenerationResult) -> CompletionResponse:
    return CompletionResponse(
        id=request_id,
        created=now(),
        model=model,
        choices=[CompletionChoice(text=result.text, finish_reason=result.finish_reason)],
        usage=usage(result.prompt_tokens, result.completion_tokens),
    )


def _sse(event: BaseModel) -> str:
    return f"data: {event.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def sse_events(
    chunks: AsyncIterator[GenerationChunk | EngineError],
    chunk_event: Callable[[GenerationChunk], BaseModel],
    usage_event: Callable[[UsageInfo], BaseModel] | None,
    opening_event: BaseModel | None = None,
) -> AsyncIterator[str]:
    """Server-sent events for a stream of engine chunks, ending in `[DONE]`.

    An engine error mid-stream becomes an OpenAI `error` event (clients raise it).
    """
    result = GenerationResult()
    if opening_event is not None:
        yield _sse(opening_event)
    async for chunk in chunks:
        if isinstance(chunk, EngineError):
            yield _sse(ErrorResponse(error=APIError.from_engine(chunk).info()))
            return
        result.add(chunk)
        yield _sse(chunk_event(chunk))
    if usage_event is not None:
        yield _sse(usage_event(usage(result.prompt_tokens, result.completion_tokens)))
    yield SSE_DONE


def chat_sse(
    request_id: str, model: str, chunks: AsyncIterator[GenerationChunk | EngineError], include_usage: bool
) -> AsyncIterator[str]:
    created = now()

    def chunk_event(chunk: GenerationChunk) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=request_id,
            created=created,
            model=model,
            choices=[
                ChatChunkChoice(
                    delta=ChatDelta(content=chunk.text), finish_reason=chunk.finish_reason
                )
            ],
        )

    def usage_event(info: UsageInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, created=created, model=model, choices=[], usage=info)

    opening = ChatCompletionChunk(
        id=request_id,
        created=created,
        model=model,
        choices=[ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))],
    )
    return sse_events(chunks, chunk_event, usage_event if include_usage else None, opening)


def completion_sse(
    request_id: str, model: str, chunks: AsyncIterator[GenerationChunk | EngineError], include_usage: bool
) -> AsyncIterator[str]:
    created = now()

    def chunk_event(chunk: GenerationChunk) -> CompletionResponse:
        return CompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=[CompletionChoice(text=chunk.text, finish_reason=chunk.finish_reason)],
        )

    def usage_event(info: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=created, model=model, choices=[], usage=info)

    return sse_events(chunks, chunk_event, usage_event if include_usage else None)
