"""`LLMEngine` on vLLM's `AsyncLLM` (CPU build here, upstream vLLM on GPUs)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from serve_app.config import EngineConfig
from serve_app.engine.base import (
    EngineInfo,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
    attempt_budget,
)
from serve_app.engine.cpu_dtype import ResolvedDtype, cpu_flags, resolve_cpu_dtype
from serve_app.logs import logger_for

logger = logger_for(__name__)


class VLLMEngine(LLMEngine):
    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._engine: Any = None
        self._tokenizer: Any = None
        self._max_model_len = 0

    async def start(self) -> EngineInfo:
        if self._config.cpu_kv_cache_gib is not None:
            # Read by the engine-core process vLLM spawns, so set it before.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self._config.cpu_kv_cache_gib)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = self._config.engine_kwargs()
        resolved = ResolvedDtype(self._config.dtype, "configured")
        if current_platform.is_cpu():
            resolved = resolve_cpu_dtype(self._config.dtype, cpu_flags())
            kwargs["dtype"] = resolved.dtype
        args = AsyncEngineArgs(**kwargs, disable_log_stats=True)
        self._engine = AsyncLLM.from_engine_args(args)
        self._tokenizer = self._engine.get_tokenizer()
        model_config = self._engine.model_config
        self._max_model_len = model_config.max_model_len
        dtype = str(model_config.dtype).removeprefix("torch.")
        logger.info("engine %s runs in %s (%s)", self._config.model, dtype, resolved.reason)
        return EngineInfo(max_model_len=self._max_model_len, dtype=dtype, dtype_reason=resolved.reason,
                          quantization=model_config.quantization)

    def _prompt_token_ids(self, request: GenerationRequest) -> list[int]:
        if request.messages is None:
            return self._tokenizer.encode(request.prompt)
        text = self._tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in request.messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        options = request.sampling
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k if options.top_k is not None else 0,
            stop=list(options.stop),
            seed=options.seed,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            ignore_eos=options.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            stream_interval=request.stream_interval,
        )

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.inputs import TokensPrompt

        # Chat template and tokenizer are CPU work: off the replica's event loop.
        prompt_ids = await asyncio.to_thread(self._prompt_token_ids, request)
        context_ids = prompt_ids + list(request.continuation)
        max_tokens = attempt_budget(len(context_ids), request, self._max_model_len)
        params = self._sampling_params(request, max_tokens)
        priority = {"priority": request.priority} if self._config.scheduling_policy == "priority" else {}
        async for output in self._engine.generate(
            TokensPrompt(prompt_token_ids=context_ids), params, request.request_id, **priority
        ):
            completion = output.outputs[0]
            yield GenerationChunk(
                text=completion.text,
                num_tokens=len(completion.token_ids),
                prompt_tokens=len(prompt_ids),
                finish_reason=completion.finish_reason,
                token_ids=tuple(completion.token_ids),
            )

    async def check_health(self) -> None:
        await self._engine.check_health()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
