"""The length-bucket batcher: predict, bucket, admit, dispatch, continue.

Each request's output length is predicted (`LengthPredictor`); the prediction
picks the model's pool (bucket); the pool's `PoolQueue` admits it or refuses
(503), and hands it a slot realtime-first. The request then streams from the
pool through a `PoolClient`. Two things make it continue elsewhere, both from
the prompt plus the tokens already sent, so the client sees one stream:
- it reaches its bucket's edge unfinished (`overrun: rebucket`): it moves on to
  the next bucket's pool, ahead of that pool's queue;
- its replica is lost (`ReplicaUnavailable`): it is re-sent, or resumed if it
  had started, with bounded retries and backoff.
No Ray here: the router supplies the client and acts on the stats.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Awaitable, Callable, Protocol

from serve_app.admission import AdmissionPolicy, PoolQueue, PoolStats, Priority, QueueFull
from serve_app.auth import RateLimiter
from serve_app.config import AppConfig, ModelConfig, PoolConfig
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.errors import APIError
from serve_app.length_predictor import LengthPredictor, PromptClass

RETRYABLE_ENGINE_CODES = frozenset({"replica_draining"})
"""Refusals a replica sends before any output that another replica can serve."""


class ReplicaUnavailable(Exception):
    """The pool could not serve this attempt (replica died, draining, full): try again."""


@dataclass(frozen=True)
class RequestMeta:
    """What the router knows about a request besides the engine request."""

    priority: Priority
    client: str | None
    """API-key name, when authentication is on."""
    prompt_class: PromptClass


class PoolClient(Protocol):
    def stream(
        self, model: str, pool: str, request: GenerationRequest, priority: Priority
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        """Output of one attempt; raises `ReplicaUnavailable` for a retryable failure."""


@dataclass
class RequestRecord:
    """One finished request, for metrics and the predictor."""

    model: str
    bucket: str
    priority: Priority
    client: str | None
    predicted_tokens: int
    prediction_source: str
    pools: list[str] = field(default_factory=list)
    """Pools that served a part of it, in order (more than one: re-bucketed)."""
    status: str = "error"
    """`ok`, `error` (an engine refusal or failure), `rejected` or `cancelled`."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    queue_wait_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float = 0.0
    attempts: int = 0
    resent: int = 0
    """Retries of an attempt that had sent no output yet."""
    resumed: int = 0
    """Retries continuing a stream that had already sent output."""


class BatcherObserver(Protocol):
    def dispatched(self, model: str, pool: str, wait_s: float) -> None: ...

    def finished(self, record: RequestRecord) -> None: ...


def bucket_index(pools: list[PoolConfig], predicted_tokens: int) -> int:
    """The first pool whose edge holds the prediction (the last has none)."""
    for index, pool in enumerate(pools):
        if pool.max_output_tokens is None or predicted_tokens <= pool.max_output_tokens:
            return index
    return len(pools) - 1


class LengthBucketBatcher:
    def __init__(
        self,
        config: AppConfig,
        client: PoolClient,
        observer: BatcherObserver,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._router = config.router
        self._models = config.model_by_name()
        self._client = client
        self._observer = observer
        self._clock = clock
        self._sleep = sleep
        self._predictor = LengthPredictor(config.router.predictor)
        self._moves: Counter[str] = Counter()
        """Requests re-bucketed, re-sent and resumed since start."""
        self._limiter = RateLimiter(config.router.api_keys, clock)
        policy = AdmissionPolicy(config.router.priorities.batch_queue_share)
        self._queues = {
            (model.name, pool.name): PoolQueue(pool.queue_size, policy, capacity=0, clock=clock)
            for model in config.models
            for pool in model.pools
        }

    def set_capacity(self, model: str, pool: str, slots: int) -> None:
        """Requests the pool may run at once (running replicas x max_ongoing_requests)."""
        self._queues[(model, pool)].set_capacity(slots)

    def stats(self) -> dict[tuple[str, str], PoolStats]:
        return {key: queue.stats() for key, queue in self._queues.items()}

    def predictor_classes(self) -> dict[str, int]:
        return self._predictor.classes()

    def moves(self) -> dict[str, int]:
        return dict(self._moves)

    async def generate(self, model: str, request: GenerationRequest, meta: RequestMeta) -> GenerationResult | EngineError:
        result = GenerationResult()
        async for item in self.stream(model, request, meta):
            if isinstance(item, EngineError):
                return item
            result.add(item)
        return result

    async def stream(
        self, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        config = self._models[model]
        prediction = self._predictor.predict(meta.prompt_class, request.sampling.max_tokens)
        index = bucket_index(config.pools, prediction.tokens)
        fallback = self._fallback(config, meta.priority)
        if fallback is not None:
            self._queues[(model, config.pools[index].name)].note_diverted()
            config = fallback
            index = bucket_index(config.pools, prediction.tokens)
        record = RequestRecord(
            config.name, config.pools[index].name, meta.priority, meta.client, prediction.tokens, prediction.source
        )
        estimate = meta.prompt_class.prompt_chars // 4 + prediction.tokens
        decision = self._limiter.admit(meta.client, estimate)
        if not decision.allowed:
            record.status = "rejected"
            self._observer.finished(record)
            raise APIError(
                429,
                f"rate limit reached for {meta.client}: {decision.reason}",
                code="rate_limit_exceeded",
                retry_after_s=max(1, decision.retry_after_s),
            )
        started = self._clock()
        try:
            async for item in self._run(config, index, request, meta, record, started):
                yield item if fallback is None or isinstance(item, EngineError) else replace(item, model=config.name)
        except (asyncio.CancelledError, GeneratorExit):
            record.status = "cancelled"
            raise
        finally:
            record.latency_s = self._clock() - started
            self._limiter.settle(meta.client, estimate, record.prompt_tokens + record.output_tokens)
            if record.status == "ok":
                self._predictor.observe(meta.prompt_class, record.output_tokens)
            self._moves.update(rebucketed=len(record.pools) > 1, resent=record.resent, resumed=record.resumed)
            self._observer.finished(record)

    def _fallback(self, config: ModelConfig, priority: Priority) -> ModelConfig | None:
        """The model to serve instead while `config`'s pools have no replica."""
        if config.fallback is None or priority not in config.fallback.priorities:
            return None
        if any(self._queues[(config.name, pool.name)].capacity for pool in config.pools):
            return None
        return self._models[config.fallback.model]

    async def _acquire(self, model: str, pool: str, priority: Priority | str, record: RequestRecord) -> PoolQueue:
        queue = self._queues[(model, pool)]
        try:
            wait = await queue.acquire(priority)  # type: ignore[arg-type]
        except QueueFull as exc:
            record.status = "rejected"
            raise APIError(
                503,
                f"model {model!r} is at capacity ({pool} pool: {exc.reason}); retry later",
                code="overloaded",
                retry_after_s=exc.retry_after_s,
            ) from None
        record.queue_wait_s += wait
        record.pools.append(pool)
        self._observer.dispatched(model, pool, wait)
        return queue

    async def _run(
        self,
        config: ModelConfig,
        index: int,
        request: GenerationRequest,
        meta: RequestMeta,
        record: RequestRecord,
        started: float,
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        held: PoolQueue | None = await self._acquire(config.name, config.pools[index].name, meta.priority, record)
        sent: list[int] = []
        failures = 0
        budget = request.sampling.max_tokens
        try:
            while True:
                pool = config.pools[index]
                remaining = None if budget is None else budget - record.output_tokens
                edge = None
                if config.overrun == "rebucket" and pool.max_output_tokens is not None:
                    edge = pool.max_output_tokens - record.output_tokens
                at_edge = edge is not None and (remaining is None or edge < remaining)
                attempt = replace(
                    request,
                    request_id=request.request_id if record.attempts == 0 else f"{request.request_id}-{record.attempts}",
                    sampling=replace(request.sampling, max_tokens=remaining),
                    stop_after=edge if at_edge else None,
                    continuation=tuple(sent),
                )
                record.attempts += 1
                moved_on = False
                try:
                    async with aclosing(self._client.stream(config.name, pool.name, attempt, meta.priority)) as chunks:
                        async for item in chunks:
                            if isinstance(item, EngineError):
                                if item.code in RETRYABLE_ENGINE_CODES:
                                    raise ReplicaUnavailable(item.message)
                                record.status = "error"
                                yield item
                                return
                            sent.extend(item.token_ids)
                            record.output_tokens += item.num_tokens
                            record.prompt_tokens = item.prompt_tokens
                            if at_edge and item.finish_reason == "length" and record.output_tokens >= pool.max_output_tokens:
                                item = replace(item, finish_reason=None)
                                moved_on = True
                            if record.ttft_s is None and item.num_tokens:
                                record.ttft_s = self._clock() - started
                            yield item
                            if moved_on or item.finish_reason is not None:
                                break
                except ReplicaUnavailable as exc:
                    failures += 1
                    if failures >= self._router.max_attempts:
                        error = APIError(
                            503,
                            f"model {config.name!r}: no replica could finish the request after "
                            f"{failures} tries ({exc}); retry later",
                            code="unavailable",
                            retry_after_s=1,
                        )
                        if not sent:
                            raise error from None
                        record.status = "error"
                        yield EngineError(error.message, status=503, code="unavailable", type=error.info().type)
                        return
                    if sent:
                        record.resumed += 1
                    else:
                        record.resent += 1
                    await self._sleep(self._router.retry_backoff_s * 2 ** (failures - 1))
                    continue
                if not moved_on:
                    record.status = "ok"
                    return
                index += 1
                held.release()
                held = None
                held = await self._acquire(config.name, config.pools[index].name, "continuation", record)
        finally:
            if held is not None:
                held.release()
