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

    def _carried_text(self, request: GenerationRequest) -> str:
        """The continuation's text the client has not received (held back by the
        earlier attempt as a possible stop-string start)."""
        if not (request.continuation and request.stops):
            return ""
        # decoded as vLLM's detokenizer does by default: special tokens skipped
        decoded = self._tokenizer.decode(list(request.continuation), skip_special_tokens=True)
        return unsent_text(decoded, request.continuation_chars, request.stops)

    def _sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        params = request.params.clone()
        params.max_tokens = max_tokens
        params.output_kind = RequestOutputKind.DELTA
        params.stream_interval = request.stream_interval
        if request.continuation:
            params.prompt_logprobs = None  # the client has them from the first attempt
        return params

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            async for chunk in self._generate(request):
                yield chunk
        except EngineDeadError:
            raise EngineLost("vLLM's engine core died") from None
        except ValueError as exc:  # vLLM's own checks of the request (before any output)
            raise EngineRequestError(EngineError(str(exc)[:500], param=getattr(exc, "parameter", None))) from None

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm.inputs import TokensPrompt

        carried = await asyncio.to_thread(self._carried_text, request) if request.continuation else ""
        context_ids = [*request.prompt_token_ids, *request.continuation]
        max_tokens = attempt_budget(len(context_ids), request, self._max_model_len)
        params = self._sampling_params(request, max_tokens)
        prompt = TokensPrompt(prompt_token_ids=context_ids)
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        priority = {"priority": request.priority} if self._config.scheduling_policy == "priority" else {}
        # vLLM matches the stop strings within this attempt's output; these match
        # across the seam with the earlier attempt's held-back text.
        stops = StopStrings(request.stops, carried)
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
                prompt_tokens=len(request.prompt_token_ids),
                finish_reason=finish,
                token_ids=tuple(completion.token_ids),
                stop_reason=stops.matched if stops.stopped else completion.stop_reason,
                logprobs=completion.logprobs,
                cumulative_logprob=completion.cumulative_logprob,
                prompt_logprobs=output.prompt_logprobs,
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
