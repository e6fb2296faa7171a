"""The length-bucket batcher: predict, bucket, admit, dispatch, continue.

Each request's output length is predicted (`LengthPredictor`); the prediction
picks the model's pool (its length bucket); the pool's `PoolQueue` admits it or
refuses (`Overloaded`), and hands it a slot realtime-first. The request then
streams from the pool through a `PoolClient`, attempt by attempt
(`serve_app.scheduling.attempts`): on to the next pool at a bucket's edge,
re-sent or resumed when a replica is lost. No Ray and no HTTP here: the
ingress supplies the client and maps the refusals.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace

from serve_app.config import AppConfig, ModelConfig, PoolConfig, Priority
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest, GenerationResult
from serve_app.scheduling.admission import AdmissionPolicy, PoolQueue, PoolStats
from serve_app.scheduling.attempts import RetryPolicy, plan_attempt
from serve_app.scheduling.errors import Overloaded, RateLimited, ReplicaUnavailable, Unavailable
from serve_app.scheduling.predictor import LengthPredictor
from serve_app.scheduling.rate_limit import RateLimiter
from serve_app.scheduling.types import PoolClient, RequestMeta, RequestRecord, SchedulerObserver

RETRYABLE_ENGINE_CODES = frozenset({"replica_draining"})
"""Refusals a replica sends before any output that another replica can serve."""


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
        observer: SchedulerObserver,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._models = config.model_by_name()
        self._client = client
        self._observer = observer
        self._clock = clock
        self._sleep = sleep
        self._retry = RetryPolicy(config.ingress.max_attempts, config.ingress.retry_backoff_s)
        self._predictor = LengthPredictor(config.ingress.predictor)
        self._moves: Counter[str] = Counter()
        """Requests re-bucketed, re-sent and resumed since start."""
        self._limiter = RateLimiter(config.ingress.api_keys, clock)
        policy = AdmissionPolicy(config.ingress.priorities.batch_queue_share)
        self._queues = {
            (model.name, pool.name): PoolQueue(pool.queue_size, policy, slots=0, clock=clock)
            for model in config.models
            for pool in model.pools
        }

    def set_slots(self, model: str, pool: str, slots: int) -> None:
        """Requests the pool may run at once (its running replicas' slots)."""
        self._queues[(model, pool)].set_slots(slots)

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
        """The request's output, one stream over all its attempts. Raises
        `RateLimited`, `Overloaded` or `Unavailable` before any output."""
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
            raise RateLimited(f"rate limit reached for {meta.client}: {decision.reason}", max(1, decision.retry_after_s))
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
        if any(self._queues[(config.name, pool.name)].slots for pool in config.pools):
            return None
        return self._models[config.fallback.model]

    async def _acquire(self, model: str, pool: str, priority: Priority | str, record: RequestRecord) -> PoolQueue:
        queue = self._queues[(model, pool)]
        try:
            wait = await queue.acquire(priority)  # type: ignore[arg-type]
        except Overloaded as exc:
            record.status = "rejected"
            raise Overloaded(f"model {model!r} is at capacity ({pool} pool: {exc.message}); retry later",
                             exc.retry_after_s) from None
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
        try:
            while True:
                pool = config.pools[index]
                attempt = plan_attempt(request, pool, config.overrun == "rebucket", record.attempts, tuple(sent))
                record.attempts += 1
                moved_on = False
                try:
                    async with aclosing(self._client.stream(config.name, pool.name, attempt.request,
                                                            meta.priority)) as chunks:
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
                            moved_on = attempt.moves_on(item, record.output_tokens)
                            if moved_on:
                                item = replace(item, finish_reason=None)
                            if record.ttft_s is None and item.num_tokens:
                                record.ttft_s = self._clock() - started
                            yield item
                            if moved_on or item.finish_reason is not None:
                                break
                except ReplicaUnavailable as exc:
                    failures += 1
                    wait_s = self._retry.wait_s(failures)
                    if wait_s is None:
                        message = (f"model {config.name!r}: no replica could finish the request after "
                                   f"{failures} tries ({exc}); retry later")
                        if not sent:
                            raise Unavailable(message, retry_after_s=1) from None
                        record.status = "error"
                        yield EngineError(message, status=503, code="unavailable")
                        return
                    if sent:
                        record.resumed += 1
                    else:
                        record.resent += 1
                    await self._sleep(wait_s)
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
