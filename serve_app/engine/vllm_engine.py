"""`LLMEngine` on vLLM's `AsyncLLM` (CPU build here, upstream vLLM on GPUs)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import psutil

from serve_app.config import EngineConfig
from serve_app.engine.base import (
    EngineError,
    EngineInfo,
    EngineLost,
    EngineRequestError,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
    attempt_budget,
)
from serve_app.engine.cpu_cores import keep_off, session_processes, worker_cores
from serve_app.engine.cpu_dtype import ResolvedDtype, cpu_flags, resolve_cpu_dtype
from serve_app.engine.reaper import start_reaper
from serve_app.engine.stop_strings import StopStrings, unsent_text
from serve_app.logs import logger_for

logger = logger_for(__name__)


class VLLMEngine(LLMEngine):
    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._engine: Any = None
        self._tokenizer: Any = None
        self._max_model_len = 0
        self._reaper: subprocess.Popen | None = None

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
        self._reaper = start_reaper()  # before the engine: a replica killed while it starts leaves nothing
        self._engine = AsyncLLM.from_engine_args(args)
        if current_platform.is_cpu() and self._config.cpu_isolate_workers:
            self._isolate_workers(psutil.Process().children(recursive=True))
        self._tokenizer = self._engine.get_tokenizer()
        model_config = self._engine.model_config
        self._max_model_len = model_config.max_model_len
        dtype = str(model_config.dtype).removeprefix("torch.")
        logger.info("engine %s runs in %s (%s)", self._config.model, dtype, resolved.reason)
        return EngineInfo(max_model_len=self._max_model_len, dtype=dtype, dtype_reason=resolved.reason,
                          quantization=model_config.quantization)

    def _isolate_workers(self, engine_processes: list[psutil.Process]) -> None:
        cores = worker_cores(engine_processes)
        moved = keep_off(cores, session_processes(psutil.Process()))
        logger.info("engine %s workers on cores %s; %d threads of the Ray session moved off them",
                    self._config.model, sorted(cores), moved)

    def _prepare(self, request: GenerationRequest) -> tuple[list[int], str]:
        """Prompt token ids (chat template applied) and the continuation's text the
        client has not received; a template or tokenizer refusal is a 400."""
        try:
            if request.messages is None:
                prompt_ids = self._tokenizer.encode(request.prompt)
            else:
                text = self._tokenizer.apply_chat_template(
                    [{"role": role, "content": content} for role, content in request.messages],
                    tokenize=False,
                    add_generation_prompt=True,
                )
                prompt_ids = self._tokenizer.encode(text, add_special_tokens=False)
        except Exception as exc:  # jinja2 TemplateError, tokenizer errors: the request, not the engine
            raise EngineRequestError(EngineError(f"the prompt cannot be rendered: {exc}"[:500], param="messages")) from None
        carried = ""
        if request.continuation and request.sampling.stop:
            # decoded as vLLM's detokenizer does by default: special tokens skipped
            decoded = self._tokenizer.decode(list(request.continuation), skip_special_tokens=True)
            carried = unsent_text(decoded, request.continuation_chars, request.sampling.stop)
        return prompt_ids, carried

    def _sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        options = request.sampling
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=options.temperature,
                top_p=options.top_p,
                top_k=options.top_k if options.top_k is not None else 0,
                seed=options.seed,
                presence_penalty=options.presence_penalty,
                frequency_penalty=options.frequency_penalty,
                ignore_eos=options.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
                stream_interval=request.stream_interval,
            )
        except ValueError as exc:  # vLLM's own validation of sampling values
            raise EngineRequestError(EngineError(str(exc)[:500], param=getattr(exc, "parameter", None))) from None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            async for chunk in self._generate(request):
                yield chunk
        except EngineDeadError:
            raise EngineLost("vLLM's engine core died") from None

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.inputs import TokensPrompt

        # Chat template and tokenizer are CPU work: off the replica's event loop.
        prompt_ids, carried = await asyncio.to_thread(self._prepare, request)
        context_ids = prompt_ids + list(request.continuation)
        max_tokens = attempt_budget(len(context_ids), request, self._max_model_len)
        params = self._sampling_params(request, max_tokens)
        prompt = TokensPrompt(prompt_token_ids=context_ids)
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        priority = {"priority": request.priority} if self._config.scheduling_policy == "priority" else {}
        stops = StopStrings(request.sampling.stop, carried)
        produced = 0
        async for output in self._engine.generate(prompt, params, request.request_id, **priority):
            completion = output.outputs[0]
            produced += len(completion.token_ids)
            text = stops.feed(completion.text)
            finish = "stop" if stops.stopped else completion.finish_reason
            at_seam = finish == "length" and request.stop_after is not None and produced >= request.stop_after
            if finish is not None and not stops.stopped and not at_seam:
                text += stops.flush()  # the real end: nothing can follow the held-back text
            yield GenerationChunk(
                text=text,
                num_tokens=len(completion.token_ids),
                prompt_tokens=len(prompt_ids),
                finish_reason=finish,
                token_ids=tuple(completion.token_ids),
            )
            if stops.stopped:
                return  # closing the generator aborts the engine request

    async def check_health(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            await self._engine.check_health()
        except EngineDeadError:
            raise EngineLost("vLLM's engine core died") from None

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._reaper is not None:
            self._reaper.terminate()
            self._reaper = None
