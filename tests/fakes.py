"""Fakes for fast unit tests (never e2e): an engine, Serve handles, a Ray node,
an AWS instance-metadata service on loopback and a clock set by hand.

The engine answers with numbered words (the ingress's real tokenizer makes
the prompt), so outputs and token counts are predictable.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND
from serve_app.capacity.preemption import INSTANCE_ACTION_PATH, TOKEN_HEADER, TOKEN_PATH, TOKEN_TTL_HEADER
from serve_app.engine.base import (
    EngineInfo,
    EngineLost,
    GenerationChunk,
    GenerationRequest,
    LLMEngine,
    attempt_budget,
)


def generation_request(max_tokens: int | None = None, prompt_ids: tuple[int, ...] = (1, 2),
                       request_id: str = "r", params=None, **fields) -> GenerationRequest:
    """An engine request as the ingress makes it: token ids and vLLM's sampling parameters."""
    from vllm.sampling_params import SamplingParams

    params = params or SamplingParams(max_tokens=max_tokens)
    return GenerationRequest(request_id=request_id, prompt_token_ids=prompt_ids, params=params,
                             max_tokens=max_tokens, **fields)


class FakeEngine(LLMEngine):
    """Output token i (counting from the start of the answer) is ` w{i}` with id i,
    so a resumed stream must continue exactly where the last one stopped."""

    def __init__(
        self, max_model_len: int = 128, answer_tokens: int | None = None, step_s: float = 0, fail_after: int | None = None
    ) -> None:
        self.max_model_len = max_model_len
        self.fail_after = fail_after
        """Raise after this many chunks of any attempt (an engine failure, not retried)."""
        self.dies_after: int | None = None
        """Die (`EngineLost`, for good) after this many chunks of any attempt."""
        self.lost = False
        self.answer_tokens = answer_tokens
        """Stop (finish reason `stop`) after this many answer tokens; None: never."""
        self.step_s = step_s
        self.requests: list[GenerationRequest] = []

    async def start(self) -> EngineInfo:
        return EngineInfo(max_model_len=self.max_model_len)

    def prompt_tokens(self, request: GenerationRequest) -> int:
        return len(request.prompt_token_ids)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        prompt_tokens = self.prompt_tokens(request)
        start = len(request.continuation)
        budget = attempt_budget(prompt_tokens + start, request, self.max_model_len)
        for step in range(budget):
            position = start + step
            if self.fail_after is not None and step == self.fail_after:
                raise RuntimeError("replica died")
            if self.lost or (self.dies_after is not None and step == self.dies_after):
                self.lost = True
                raise EngineLost("engine core died")
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
        if self.lost:
            raise EngineLost("engine core died")

    def shutdown(self) -> None:
        return None


class _Method:
    def __init__(self, target, name: str, stream: bool) -> None:
        self._target, self._name, self._stream = target, name, stream

    def remote(self, *args):
        call = getattr(self._target, self._name)(*args)
        if self._stream:
            return _Generator(call)
        return call if inspect.isawaitable(call) else _resolved(call)


async def _resolved(value):
    """A sync method's result, awaitable as a `DeploymentResponse` is."""
    return value


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

    def options(self, stream: bool = False) -> FakeHandle:
        return FakeHandle(self._target, stream)

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._target, name, self._stream)


async def start_llm_server(model, engine: LLMEngine, pool: str = "default", preemption=None, node=None,
                           exits: list[int] | None = None):
    """Construct an `LLMServer` the way Serve does (its `__init__` is async), on
    an on-demand `FakeNode` unless told otherwise; the exit statuses it would
    end its process with go to `exits` instead."""
    from deployments.llm_server import LLMServer
    from serve_app.capacity.preemption import PreemptionConfig

    server = LLMServer.__new__(LLMServer)
    node = node or FakeNode(ON_DEMAND)
    await server.__init__(
        model, pool, preemption or PreemptionConfig(), engine_factory=lambda *_: engine, node_factory=lambda: node,
        exit_process=(exits if exits is not None else []).append,
    )
    return server


def replicas_up(count: int, prefix: str = "replica", **fields):
    """A `DeploymentState` with `count` running replicas, actor ids `{prefix}-0`, `{prefix}-1`, ..."""
    from deployments.pool_client import DeploymentState

    return DeploymentState(replicas=frozenset(f"{prefix}-{i}" for i in range(count)), **fields)


_FRONTENDS: dict[str, object] = {}
"""vLLM's OpenAI layer per model config, built once per test session (2 s each)."""


async def frontends_of(config) -> dict:
    from serve_app.openai.frontend import build_frontend

    for model in config.models:
        key = model.model_dump_json()
        if key not in _FRONTENDS:
            _FRONTENDS[key] = await build_frontend(model)
    return {model.name: _FRONTENDS[model.model_dump_json()] for model in config.models}


async def start_ingress(config, engines: dict[str, LLMEngine]):
    """The real `OpenAIIngress` over in-process `LLMServer`s, one per pool
    deployment (`engines` by deployment name), each counted as one replica."""
    from deployments.ingress import OpenAIIngress
    from serve_app.topology import deployment_name

    handles = {}
    for model in config.models:
        for pool in model.pools:
            name = deployment_name(model.name, pool.name)
            handles[name] = FakeHandle(await start_llm_server(model, engines[name], pool.name))

    async def one_replica_each():
        return {name: replicas_up(1, name) for name in handles}

    ingress = OpenAIIngress.__new__(OpenAIIngress)
    await ingress.__init__(config, handles, read_states=one_replica_each, frontends=await frontends_of(config))
    await asyncio.sleep(0)  # let the capacity poll run once
    return ingress


class FakeNode:
    def __init__(self, capacity_type: str) -> None:
        self.node_id = "ab" * 28
        self.labels = {MARKET_TYPE_LABEL: capacity_type}
        self.drains: list[tuple[float, str]] = []
        self.deadline_ms: int | None = None

    def drain(self, deadline: float, message: str) -> None:
        self.drains.append((deadline, message))

    def draining_deadline_ms(self) -> int | None:
        return self.deadline_ms


class FakeImds:
    """An IMDS stand-in on 127.0.0.1: IMDSv2 tokens, `spot/instance-action` 404 or a notice."""

    def __init__(self, imdsv2: bool = True) -> None:
        self.imdsv2 = imdsv2
        self.notice: dict | None = None
        self.broken = False
        self.tokens: list[str] = []
        self.gets: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                if self.path != TOKEN_PATH or not fake.imdsv2:
                    return self._reply(404, "")
                if not self.headers.get(TOKEN_TTL_HEADER, "").isdigit():
                    return self._reply(400, "missing ttl")
                fake.tokens.append(f"token-{len(fake.tokens)}")
                self._reply(200, fake.tokens[-1])

            def do_GET(self) -> None:
                fake.gets.append(dict(self.headers))
                if fake.broken:
                    return self._reply(500, "oops")
                if fake.imdsv2 and (not fake.tokens or self.headers.get(TOKEN_HEADER) != fake.tokens[-1]):
                    return self._reply(401, "")
                if self.path != INSTANCE_ACTION_PATH or fake.notice is None:
                    return self._reply(404, "")
                self._reply(200, json.dumps(fake.notice))

            def _reply(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def announce(self, in_s: float, action: str = "terminate") -> float:
        """Post a notice due `in_s` from now (whole seconds, as IMDS gives); its deadline."""
        deadline = datetime.fromtimestamp(int(time.time() + in_s), tz=UTC)
        self.notice = {"action": action, "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return deadline.timestamp()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class FailingHandle:
    """A `DeploymentHandle` whose every call fails with `exc` (counted in `calls`)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0

    def options(self, stream: bool = False):
        return self

    def __getattr__(self, name):
        return self

    def remote(self, *args):
        self.calls += 1
        exc = self.exc

        class Failing:
            def __aiter__(self):
                return self

            async def __anext__(self):
                raise exc

            def cancel(self):
                pass

        return Failing()


class ManualClock:
    """A monotonic clock a test sets by hand (`clock.now += 5`)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
