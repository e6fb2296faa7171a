"""A fake engine for fast unit tests of the HTTP and replica layers (never e2e).

It "tokenizes" on whitespace and answers with numbered words, so outputs and
token counts are predictable.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from serve_app.engine.base import (
    EngineInfo,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
    attempt_budget,
)


class FakeEngine(LLMEngine):
    """Output token i (counting from the start of the answer) is ` w{i}` with id i,
    so a resumed stream must continue exactly where the last one stopped."""

    def __init__(
        self, max_model_len: int = 64, answer_tokens: int | None = None, step_s: float = 0, fail_after: int | None = None
    ) -> None:
        self.max_model_len = max_model_len
        self.fail_after = fail_after
        """Raise after this many chunks of any attempt (an engine failure, not retried)."""
        self.answer_tokens = answer_tokens
        """Stop (finish reason `stop`) after this many answer tokens; None: never."""
        self.step_s = step_s
        self.requests: list[GenerationRequest] = []

    async def start(self) -> EngineInfo:
        return EngineInfo(max_model_len=self.max_model_len)

    def prompt_tokens(self, request: GenerationRequest) -> int:
        if request.messages is not None:
            text = " ".join(f"<{role}> {content}" for role, content in request.messages)
        else:
            text = request.prompt or ""
        return len(text.split())

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        prompt_tokens = self.prompt_tokens(request)
        start = len(request.continuation)
        budget = attempt_budget(prompt_tokens + start, request, self.max_model_len)
        for step in range(budget):
            position = start + step
            if self.fail_after is not None and step == self.fail_after:
                raise RuntimeError("replica died")
            await asyncio.sleep(self.step_s)
            done = self.answer_tokens is not None and position + 1 >= self.answer_tokens
            yield GenerationChunk(
                text=f" w{position}",
                num_tokens=1,
                prompt_tokens=prompt_tokens,
                finish_reason="stop" if done else "length" if step == budget - 1 else None,
                token_ids=(position,),
            )
            if done:
                return

    async def check_health(self) -> None:
        return None


class _Method:
    def __init__(self, target, name: str, stream: bool) -> None:
        self._target, self._name, self._stream = target, name, stream

    def remote(self, *args):
        call = getattr(self._target, self._name)(*args)
        return _Generator(call) if self._stream else call


class _Generator:
    """Stands in for `DeploymentResponseGenerator`: async iterable + cancel()."""

    def __init__(self, agen) -> None:
        self._agen = agen
        self.cancelled = False

    def __aiter__(self):
        return self._agen.__aiter__()

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """Stands in for a `DeploymentHandle` to an in-process replica object."""

    def __init__(self, target, stream: bool = False) -> None:
        self._target, self._stream = target, stream

    def options(self, stream: bool = False) -> "FakeHandle":
        return FakeHandle(self._target, stream)

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._target, name, self._stream)


async def start_llm_server(model, engine: LLMEngine, pool: str = "default"):
    """Construct an `LLMServer` the way Serve does (its `__init__` is async)."""
    from deployments.llm_server import LLMServer

    server = LLMServer.__new__(LLMServer)
    await server.__init__(model, pool, engine_factory=lambda *_: engine)
    return server


async def start_router(config, engines: dict[str, LLMEngine]):
    """The real `OpenAIRouter` over in-process `LLMServer`s, one per pool
    deployment (`engines` by deployment name), each counted as one replica."""
    from deployments.router import OpenAIRouter
    from serve_app.config import pool_deployment_name

    handles = {}
    for model in config.models:
        for pool in model.pools:
            name = pool_deployment_name(model.name, pool.name)
            handles[name] = FakeHandle(await start_llm_server(model, engines[name], pool.name))

    async def one_replica_each() -> dict[str, int]:
        return {name: 1 for name in handles}

    router = OpenAIRouter.__new__(OpenAIRouter)
    await router.__init__(config, handles, count_replicas=one_replica_each)
    await asyncio.sleep(0)  # let the capacity poll run once
    return router
