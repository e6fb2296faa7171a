"""The engine interface the LLM replica talks to, and the data that crosses it.

Backends (vLLM today; llama.cpp or TensorRT-LLM later) implement `LLMEngine`.
Requests arrive as prompt token ids with vLLM's `SamplingParams`: the ingress's
copy of vLLM's OpenAI layer rendered and checked them, so the replicas only
generate.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    """The prompt as the ingress rendered it (vLLM's renderer: chat template,
    tokenizer), so every attempt on every replica starts from the same tokens."""
    params: SamplingParams
    """vLLM's sampling parameters, as vLLM's own OpenAI layer made them from the
    request. The engine takes them as they are but for the output cap
    (`max_tokens` below), the output kind and the stream interval."""
    max_tokens: int | None = None
    """Output cap of this attempt; None means whatever the context leaves."""
    continuation: tuple[int, ...] = ()
    """Output token ids already sent to the client by an earlier attempt: the
    engine appends them to the prompt and generates what follows (resume,
    re-bucket). `max_tokens` then counts the new tokens only. Only requests
    whose output a continuation reproduces exactly get one (`resumable`)."""
    continuation_chars: int = 0
    """Characters of the continuation's text the client already has. An engine
    may have held back the rest (a possible stop-string start) when the earlier
    attempt ended; the next attempt sends it, or finds the stop string in it."""
    stop_after: int | None = None
    """Stop after this many new tokens (finish reason `length`) even if
    `max_tokens` allows more: the bucket edge, after which the ingress continues
    the request elsewhere. `max_tokens` is still checked against the context."""
    priority: int = 0
    """Engine scheduling priority, lower first; used when the engine runs with
    `scheduling_policy: priority`."""
    stream_interval: int = 1
    """Output tokens gathered per streamed chunk (the first and last at once)."""
    cache_salt: str | None = None
    """Isolates prefix-cache reuse: requests with different salts never share
    cached blocks (one tenant cannot time another's prompts)."""
    avoid_replicas: tuple[str, ...] = ()
    """Replicas (actor ids) an earlier attempt found gone for good (lost,
    draining, engine dead): the pool's request router never picks them."""

    @property
    def stops(self) -> tuple[str, ...]:
        return tuple(self.params.stop or ())

    @property
    def resumable(self) -> bool:
        """Whether a continuation from prompt + tokens sent produces what the
        uninterrupted request would (`not_resumable` says why not)."""
        return not_resumable(self.params) is None


def not_resumable(params: SamplingParams) -> str | None:
    """Why a request with these parameters cannot continue on another engine
    from its prompt plus the tokens already sent, or None when it can. The
    state these fields carry lives in the engine that ran the first part: a
    seeded generator, the counts penalties read, a grammar's position, a
    banned sequence in progress. Plain text, temperature, top-p/k, min-p,
    `logit_bias`, `stop` and `logprobs` continue exactly."""
    if params.seed is not None:
        return "seed"
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        return "penalties"
    if params.structured_outputs is not None:
        return "structured output"
    if params.bad_words:
        return "bad_words"
    if params.include_stop_str_in_output or params.min_tokens:
        return "include_stop_str_in_output or min_tokens"
    if params.prompt_logprobs is not None:
        return "prompt_logprobs"
    if params.extra_args or params.watermarking or params.thinking_token_budget is not None \
            or params.repetition_detection is not None:
        return "extra_args, watermarking, a thinking budget or repetition detection"
    return None


@dataclass(frozen=True)
class GenerationChunk:
    """One step of output: new text and how many tokens it took."""

    text: str
    num_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None
    token_ids: tuple[int, ...] = ()
    """The new tokens' ids (what a resumed attempt continues from)."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended the output (vLLM's `stop_reason`)."""
    logprobs: list | None = None
    """vLLM's sample logprobs of the new tokens, when the request asked for them."""
    cumulative_logprob: float | None = None
    prompt_logprobs: list | None = None
    """vLLM's prompt logprobs, on the first chunk, when the request asked for them."""


REPLICA_DRAINING = "replica_draining"
"""Refusal code of a replica whose node is being preempted."""
REPLICA_ENGINE_LOST = "replica_engine_lost"
"""Refusal code of a replica whose engine died (the replica exits)."""
REPLICA_GONE_CODES = frozenset({REPLICA_DRAINING, REPLICA_ENGINE_LOST})
"""Refusals meaning the replica serves nothing more: the request goes on
elsewhere (re-sent, or resumed from the tokens already sent)."""


@dataclass(frozen=True)
class EngineError:
    """A request the engine refused, sent back as data (not as an exception)."""

    message: str
    status: int = 400
    param: str | None = None
    code: str | None = None
    replica: str | None = None
    """The refusing replica's actor id, with a `REPLICA_GONE_CODES` refusal."""


class EngineLost(Exception):
    """Raised by engines that can no longer serve anything (their process died)."""


class EngineRequestError(Exception):
    """Raised by engines for a request they cannot serve as asked."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class EngineInfo:
    """What a started engine reports about itself (shown on `/stats`)."""

    max_model_len: int
    dtype: str = "unknown"
    """The dtype it computes in, as the engine resolved it."""
    dtype_reason: str = ""
    """Why that dtype (e.g. `auto: no native bf16 on this CPU`)."""
    quantization: str | None = None
    """The quantization method the engine applies, if any."""


class LLMEngine(abc.ABC):
    """What an LLM replica needs from an inference engine."""

    @abc.abstractmethod
    async def start(self) -> EngineInfo:
        """Load the model; return what the replica reports about it."""

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Yield output as it is produced. Raises `EngineRequestError` before the
        first chunk when the request cannot be served (e.g. prompt too long),
        `EngineLost` when the engine died."""

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise `EngineLost` if the engine can no longer serve."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the engine's processes and memory."""


def attempt_budget(prompt_tokens: int, request: GenerationRequest, max_model_len: int) -> int:
    """Output tokens this attempt may generate (`stop_after` applied), or an `EngineRequestError`."""
    budget = output_budget(prompt_tokens, request.max_tokens, max_model_len)
    return budget if request.stop_after is None else min(budget, request.stop_after)


def output_budget(prompt_tokens: int, requested: int | None, max_model_len: int) -> int:
    """Output tokens a request may generate, or an `EngineRequestError`."""
    room = max_model_len - prompt_tokens
    if room <= 0:
        raise EngineRequestError(
            EngineError(
                f"This model's maximum context length is {max_model_len} tokens; the "
                f"prompt has {prompt_tokens} tokens, which leaves no room for output.",
                code="context_length_exceeded",
            )
        )
    if requested is None:
        return room
    if requested > room:
        raise EngineRequestError(
            EngineError(
                f"This model's maximum context length is {max_model_len} tokens; the "
                f"prompt has {prompt_tokens} tokens and max_tokens asks for {requested} "
                f"more ({prompt_tokens + requested} in all). Lower max_tokens to at most {room}.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        )
    return requested
