"""vLLM's `EngineClient`, answered by this app's scheduler instead of one engine.

The ingress runs vLLM's own OpenAI layer (`serve_app.openai.frontend`): it
renders and checks each request, turns it into prompt token ids and
`SamplingParams`, and calls `generate`. Here that call becomes one
`GenerationRequest` per choice (`n` fans out as vLLM's parallel sampling does:
child `i` gets `seed + i`) through the `ModelBackend` (prediction, admission,
pools, resume), and the chunks that come back become the `RequestOutput`s the
OpenAI layer expects, in the output kind it asked for.

What the app knows of the request and vLLM's layer does not (the tenant, the
priority class, the prompt class, the scheduler to use) travels in a
`RequestContext` set per request, so one frontend can serve any scheduler.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from vllm.engine.protocol import EngineClient
from vllm.exceptions import RetryableRequestError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind

from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest
from serve_app.logs import logger_for
from serve_app.openai.errors import APIError
from serve_app.scheduling.errors import DeadlineExceeded, Refused
from serve_app.scheduling.types import RequestMeta

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams


logger = logger_for(__name__)


class ModelBackend(Protocol):
    """Where generation happens: a model name, an engine request and what the
    ingress knows about it (priority, client, prompt class)."""

    def stream(
        self, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        ...


@dataclass
class RequestContext:
    """One HTTP request's app-side facts, for the `generate` calls it makes."""

    model: str
    meta: RequestMeta
    backend: ModelBackend
    cache_salt: str | None = None
    refusal: Exception | None = None
    """What stopped the request before any output (an overload, a replica's
    400): the handler turns it into the HTTP status vLLM's layer cannot send
    once its event stream has begun."""
    sent: bool = False
    """Whether any output reached vLLM's layer (and so, perhaps, the client)."""


CURRENT_REQUEST: contextvars.ContextVar[RequestContext] = contextvars.ContextVar("serve_app_request")


class StreamBroken(RetryableRequestError):
    """A request that failed after some of its output was sent (its replica
    lost, its deadline passed): the client may send it again."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(error.message)
        self.status_code = HTTPStatus(error.status)


class RoutedEngineClient(EngineClient):
    """`generate` through the app's scheduler; the rest of vLLM's engine
    protocol is what a frontend without its own engine can answer."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from vllm.renderers import renderer_from_config
        from vllm.v1.engine.input_processor import InputProcessor

        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer_from_config(vllm_config)
        self.input_processor = InputProcessor(vllm_config, self.renderer)

    is_running = True
    is_stopped = False
    errored = False
    dead_error = RuntimeError("the app's engine client does not die")

    def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str,
                 **_: Any) -> AsyncIterator[RequestOutput]:
        """vLLM's keyword arguments (its integer `priority` among them) are not
        used: the scheduler sets the engine priority from the priority class and
        the predicted length."""
        context = CURRENT_REQUEST.get()
        prompt_ids = tuple(prompt["prompt_token_ids"])
        children = child_params(sampling_params)

        def streams() -> list[AsyncIterator[GenerationChunk | EngineError]]:
            # vLLM's own checks of the parameters, here as in `AsyncLLM.generate`: a
            # `ValueError` at the first step, before the request reaches a replica.
            self.input_processor.process_inputs(request_id, prompt, sampling_params, ("generate",))
            return [context.backend.stream(context.model, GenerationRequest(
                request_id=request_id if len(children) == 1 else f"{request_id}-{index}",
                prompt_token_ids=prompt_ids, params=params, max_tokens=params.max_tokens,
                cache_salt=context.cache_salt), context.meta) for index, params in enumerate(children)]

        return request_outputs(request_id, list(prompt_ids), streams, sampling_params.output_kind, context)

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Nothing to do: closing `generate`'s iterator cancels the work."""

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def is_sleeping(self) -> bool:
        return False

    async def check_health(self) -> None:
        return None


RoutedEngineClient.__abstractmethods__ = frozenset()
"""The rest of vLLM's engine protocol (LoRA, sleep, profiling, KV transfer,
pooling) is left to the protocol's own stubs, which do nothing: this frontend
serves none of it."""


def child_params(params: SamplingParams) -> list[SamplingParams]:
    """One parameter set per choice, as vLLM's `ParentRequest` makes them."""
    if params.n == 1:
        return [params]
    children = []
    for index in range(params.n):
        child = params.clone()
        child.n = 1
        if params.seed is not None:
            child.seed = params.seed + index
        children.append(child)
    return children


async def request_outputs(request_id: str, prompt_ids: list[int],
                          start: Callable[[], list[AsyncIterator[GenerationChunk | EngineError]]],
                          kind: RequestOutputKind, context: RequestContext) -> AsyncIterator[RequestOutput]:
    """The chunks of every choice (one stream each, from `start`) as vLLM's
    `RequestOutput`s of `kind`."""
    streams = start()
    outputs = [CompletionOutput(index=i, text="", token_ids=[], cumulative_logprob=None, logprobs=None)
               for i in range(len(streams))]
    prompt_logprobs = None
    async for index, chunk, finished in guarded(merged(streams), context):
        if isinstance(chunk, EngineError):
            raise failure(chunk, context)
        context.sent = True
        prompt_logprobs = chunk.prompt_logprobs or prompt_logprobs
        delta = CompletionOutput(index=index, text=chunk.text, token_ids=list(chunk.token_ids),
                                 cumulative_logprob=chunk.cumulative_logprob, logprobs=chunk.logprobs,
                                 finish_reason=chunk.finish_reason, stop_reason=chunk.stop_reason)
        whole = outputs[index]
        whole.text += delta.text
        whole.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            whole.logprobs = [*(whole.logprobs or []), *delta.logprobs]
        whole.cumulative_logprob = delta.cumulative_logprob
        whole.finish_reason, whole.stop_reason = delta.finish_reason, delta.stop_reason
        if kind == RequestOutputKind.DELTA:
            shown = [delta]
        elif kind == RequestOutputKind.FINAL_ONLY:
            if not finished:
                continue
            shown = outputs
        else:
            shown = [replace(output, token_ids=list(output.token_ids)) for output in outputs]
        yield RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                            prompt_logprobs=prompt_logprobs, outputs=shown, finished=finished)


async def guarded(items: AsyncIterator, context: RequestContext) -> AsyncIterator:
    """`items`, with an unexpected exception (a bug) logged and replaced by an
    error that names only its type: no exception text reaches a client."""
    async with aclosing(items):
        try:
            async for item in items:
                yield item
        except StreamBroken:
            raise
        except (APIError, Refused, DeadlineExceeded) as exc:  # the scheduler's, before any output
            context.refusal = exc
            raise
        except Exception as exc:
            logger.exception("request failed in the ingress")
            raise failure(EngineError(f"internal error: {type(exc).__name__}", status=500), context) from None


def failure(error: EngineError, context: RequestContext) -> Exception:
    """The exception for an error chunk: before any output the handler answers
    with its status (`context.refusal`); after some, the stream ends with it."""
    if context.sent:
        return StreamBroken(error)
    context.refusal = APIError.from_engine(error)
    return context.refusal


async def merged(streams: list[AsyncIterator[GenerationChunk | EngineError]]
                 ) -> AsyncIterator[tuple[int, GenerationChunk | EngineError, bool]]:
    """(choice index, item, whether every choice has finished) as items arrive."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as stream:
            async for item in stream:
                yield 0, item, isinstance(item, GenerationChunk) and item.finish_reason is not None
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    await queue.put((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, exc))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = finishing = len(streams)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerationChunk) and item.finish_reason is not None:
                finishing -= 1
            yield index, item, finishing == 0
    finally:
        for task in tasks:
            task.cancel()  # each stream closes as its pump is cancelled
        await asyncio.gather(*tasks, return_exceptions=True)
