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
    output_budget,
)


class FakeEngine(LLMEngine):
    def __init__(self, max_model_len: int = 64, fail_after: int | None = None) -> None:
        self.max_model_len = max_model_len
        self.fail_after = fail_after
        """Raise mid-stream after this many chunks (simulates a dying replica)."""
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
        budget = output_budget(prompt_tokens, request.sampling.max_tokens, self.max_model_len)
        for index in range(budget):
            if self.fail_after is not None and index == self.fail_after:
                raise RuntimeError("replica died")
            await asyncio.sleep(0)
            yield GenerationChunk(
                text=f" w{index}",
                num_tokens=1,
                prompt_tokens=prompt_tokens,
                finish_reason="length" if index == budget - 1 else None,
            )

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


async def start_llm_server(model, engine: LLMEngine):
    """Construct an `LLMServer` the way Serve does (its `__init__` is async)."""
    from deployments.llm_server import LLMServer

    server = LLMServer.__new__(LLMServer)
    await server.__init__(model, engine_factory=lambda _: engine)
    return server
