"""Requests through the app's real `LengthBucketBatcher` into a simulated fleet.

A `SimRequest` carries what a client sends (messages, `max_tokens`,
`ignore_eos`, priority) and, apart, what only the served model knows: how
long its answer runs (`answer_tokens`), which the engines read and the
batcher never sees. The batcher predicts, queues, caps and retries with the
app's own code on the loop's virtual clock; each request's chunks are timed
as `vllm bench serve` times a stream (`benchmarks.metrics`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from benchmarks import metrics
from benchmarks.fleetsim.engine import EngineShape, SimEngine, cpu_kv_cache_tokens
from benchmarks.fleetsim.fleet import Router, SimFleet, SimReplica
from benchmarks.fleetsim.step_time import StepTimeModel
from serve_app.config import AppConfig, EngineConfig, Priority
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest
from serve_app.openai.errors import APIError
from serve_app.scheduling.batcher import LengthBucketBatcher
from serve_app.scheduling.errors import Refused
from serve_app.scheduling.prompt_features import SamplingSummary, describe
from serve_app.scheduling.types import RequestMeta, RequestRecord

ATTEMPT_SUFFIX = "-"
"""Attempts after the first carry the request's id and `-<n>` (`serve_app.scheduling.attempts`)."""


@dataclass(frozen=True)
class SimRequest:
    prompt_tokens: int
    answer_tokens: int
    """How long the served model's answer runs if nothing cuts it (the engines' oracle)."""
    max_tokens: int | None
    messages: tuple[tuple[str, str], ...] = ()
    """(role, content) pairs the predictor reads; the token count is `prompt_tokens`."""
    ignore_eos: bool = False
    priority: Priority = "realtime"
    kind: str = "all"
    arrival_s: float = 0.0
    """When an open-loop run sends it."""
    seed: int | None = None
    """A seeded request, which no other engine continues exactly (not resumable)."""


class _Unobserved:
    """The batcher's observer (the ingress's metrics): the simulation reads its clients' records instead."""

    def dispatched(self, model: str, pool: str, wait_s: float) -> None:
        pass

    def finished(self, record: RequestRecord) -> None:
        pass


class AnswerOracle:
    """What the served model would answer, by request: the engines ask it, nothing else does."""

    def __init__(self) -> None:
        self._answers: dict[str, int] = {}
        self._ids = itertools.count()

    def register(self, request: SimRequest) -> str:
        """A new request id for `request`."""
        request_id = f"r{next(self._ids)}"
        self._answers[request_id] = request.answer_tokens
        return request_id

    def __call__(self, generation: GenerationRequest) -> int:
        return self._answers[generation.request_id.split(ATTEMPT_SUFFIX)[0]]


class SimApp:
    """The batcher over a fleet of `replicas` engines per pool of one model (or so many
    by pool name), each with `kv_cache_tokens` of KV cache (default: what the config
    gives a CPU engine here)."""

    def __init__(self, config: AppConfig, step_time: StepTimeModel, router: Router, replicas: int | dict[str, int] = 1,
                 kv_cache_tokens: int | None = None) -> None:
        self.model = config.models[0]
        self.fleet = SimFleet(router)
        self.batcher = LengthBucketBatcher(config, client=self.fleet, observer=_Unobserved(),
                                           clock=asyncio.get_running_loop().time)
        self._oracle = AnswerOracle()
        self._step_time, self._kv_cache_tokens = step_time, kv_cache_tokens
        for pool in self.model.pools:
            for _ in range(replicas if isinstance(replicas, int) else replicas[pool.name]):
                self.add_replica(pool.name)

    def add_replica(self, pool: str) -> SimReplica:
        """A new replica of `pool`, serving at once."""
        config = self.model.pool(pool)
        engine = self.model.pool_engine(config)
        slots = min(self.model.pool_deployment(config).max_ongoing_requests, engine.max_num_seqs)
        shape = engine_shape(engine, self._kv_cache_tokens)
        replica = self.fleet.add_replica(self.model, pool, SimEngine(shape, self._step_time, self._oracle), slots)
        self.pool_changed(pool)
        return replica

    def pool_changed(self, pool: str) -> None:
        """Tell the batcher the pool's slots, as the ingress's capacity poll does."""
        self.batcher.set_slots(self.model.name, pool, self.fleet.slots(self.model.name, pool))

    async def send(self, request: SimRequest, origin: float) -> metrics.RequestRecord:
        """One request's record, timed as a client of the ingress would time it."""
        sampling = SamplingSummary(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=request.ignore_eos)
        meta = RequestMeta(request.priority, None, describe(list(request.messages), None, sampling, self.model.name))
        generation = generation_request(self._oracle.register(request), request)
        try:
            return await timed(self.batcher.stream(self.model.name, generation, meta), request, origin)
        except Refused as exc:
            status = APIError.from_refusal(exc).status
            return metrics.failed(f"http_{status}", _now() - origin, retry_after=str(exc.retry_after_s))


class VllmServeSim:
    """`vllm serve` on one engine: no queue of its own, every request straight into
    the engine's waiting queue, streamed every `stream_interval` tokens."""

    def __init__(self, config: AppConfig, step_time: StepTimeModel, stream_interval: int = 1) -> None:
        model = config.models[0]
        self._oracle = AnswerOracle()
        self._stream_interval = stream_interval
        self.engine = SimEngine(engine_shape(model.pool_engine(model.pools[0])), step_time, self._oracle)
        self.engine.start()

    async def send(self, request: SimRequest, origin: float) -> metrics.RequestRecord:
        generation = replace(generation_request(self._oracle.register(request), request),
                             stream_interval=self._stream_interval)
        return await timed(self.engine.stream(generation), request, origin)


def engine_shape(engine: EngineConfig, kv_cache_tokens: int | None = None) -> EngineShape:
    return EngineShape(engine.max_num_seqs, engine.max_num_batched_tokens or engine.max_model_len,
                       engine.max_model_len, kv_cache_tokens or cpu_kv_cache_tokens(engine))


def generation_request(request_id: str, request: SimRequest) -> GenerationRequest:
    """The engine request the ingress would render: `prompt_tokens` ids, greedy."""
    from vllm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=request.ignore_eos, temperature=0.0,
                            seed=request.seed)
    return GenerationRequest(request_id, (0,) * request.prompt_tokens, params, max_tokens=request.max_tokens)


def _now() -> float:
    return asyncio.get_running_loop().time()


async def timed(chunks: AsyncIterator[GenerationChunk | EngineError], request: SimRequest,
                origin: float) -> metrics.RequestRecord:
    """A stream's record as `vllm bench serve` times it: a chunk with tokens is a
    chunk with `choices`; the token count is the usage."""
    sent = _now()
    timer = metrics.StreamTimer(sent, origin)
    timer.record.kind = request.kind
    output = 0
    async for item in chunks:
        if isinstance(item, EngineError):
            return metrics.failed("stream_error", sent - origin, error=f"{item.status} {item.code}: {item.message}")
        output += item.num_tokens
        timer.feed({"choices": [{}]} if item.num_tokens else {}, _now())
    timer.feed({"usage": {"completion_tokens": output, "prompt_tokens": request.prompt_tokens}}, _now())
    return timer.finish()


class Client(Protocol):
    async def send(self, request: SimRequest, origin: float) -> metrics.RequestRecord:
        """The request's record, timed from `origin` (the run's start)."""
        ...


async def closed_loop(app: Client, requests: Iterable[SimRequest], concurrency: int) -> tuple[list, float]:
    """`concurrency` clients, each sending its next request when the last one ended
    (`vllm bench serve --max-concurrency` with every request sent at once)."""
    loop = asyncio.get_running_loop()
    origin = loop.time()
    pending = iter(requests)
    records: list[metrics.RequestRecord] = []

    async def client() -> None:
        for request in pending:
            records.append(await app.send(request, origin))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records, loop.time() - origin


async def open_loop(app: Client, requests: Iterable[SimRequest]) -> tuple[list, float]:
    """Each request sent at its `arrival_s` (seeded arrivals, as `--request-rate`)."""
    loop = asyncio.get_running_loop()
    origin = loop.time()
    tasks = []
    for request in sorted(requests, key=lambda r: r.arrival_s):
        await asyncio.sleep(max(0.0, origin + request.arrival_s - loop.time()))
        tasks.append(asyncio.create_task(app.send(request, origin)))
    records = list(await asyncio.gather(*tasks))
    return records, loop.time() - origin
