"""The length-bucket batcher: predict, bucket, admit, dispatch, continue.

Each request's output length is predicted (`LengthPredictor`); the prediction
picks the model's pool (its length bucket) and, under length-aware scheduling,
its place in the pool's queue, whether it counts as long (capped by
`LongCapPolicy`; a short one counts as long once its output reaches the long
edge) and its engine priority. The pool's `PoolQueue` admits it or
refuses (`Overloaded`). The request then streams from the pool through a
`PoolClient`, attempt by attempt (`serve_app.scheduling.attempts`): on to the
next pool at a bucket's edge, re-sent or resumed when a replica is lost or
hangs, on another pool of the model when its own has no replica left. No Ray
and no HTTP here: the ingress supplies the client and maps the refusals.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace

from serve_app.config import PRIORITIES, AppConfig, ModelConfig, PoolConfig, Priority
from serve_app.engine.base import REPLICA_GONE_CODES, EngineError, GenerationChunk, GenerationRequest, not_resumable
from serve_app.scheduling.admission import PoolStats, Rank, Slot
from serve_app.scheduling.attempts import RetryPolicy, plan_attempt
from serve_app.scheduling.errors import (
    DeadlineExceeded,
    Overloaded,
    RateLimited,
    Refused,
    ReplicaUnavailable,
    Unavailable,
)
from serve_app.scheduling.pool_queues import PoolQueues
from serve_app.scheduling.predictor import LengthPredictor, worth_learning
from serve_app.scheduling.rate_limit import RateLimiter, request_token_bound
from serve_app.scheduling.types import PoolClient, RequestMeta, RequestRecord, SchedulerObserver

ENGINE_PRIORITY_STRIDE = 1_000_000
"""Engine priority = priority class x this + predicted tokens (lower first)."""


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
        self._ingress = config.ingress
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
        self._context_tokens = {model.name: model.max_context_tokens() for model in config.models}
        self._pools = PoolQueues(config, clock)

    def set_slots(self, model: str, pool: str, slots: int, down_reason: str | None = None) -> None:
        """Requests the pool may run at once (its running replicas' slots), and
        why it has none and none starting, if so."""
        self._pools.set_slots(model, pool, slots, down_reason)

    def set_ingress_replicas(self, count: int) -> None:
        """Each of `count` ingress replicas takes its share of queues and rate limits
        (`RateLimiter.set_replicas`: a share with room for uneven spreading)."""
        count = max(1, count)
        self._limiter.set_replicas(count)
        self._pools.set_ingress_replicas(count)

    def admit_request(self, client: str | None) -> None:
        """Charge one request to the client's requests/s as it arrives, before its
        body is read; raises `RateLimited`. `stream` then reserves its tokens."""
        decision = self._limiter.admit_request(client)
        if not decision.allowed:
            raise RateLimited(f"rate limit reached for {client}: {decision.reason}", max(1, decision.retry_after_s))

    def stats(self) -> dict[tuple[str, str], PoolStats]:
        return self._pools.stats()

    def predictor_classes(self) -> dict[str, int]:
        return self._predictor.classes()

    def moves(self) -> dict[str, int]:
        return dict(self._moves)

    def route(self, model: str, meta: RequestMeta, max_tokens: int | None) -> str:
        """The model that answers a request for `model` now (the ingress renders it
        for that model): `model`, or its fallback while `model` has no replica. A
        diverted request counts as demand on the pool it would have waited in."""
        config = self._models[model]
        fallback = self._fallback(config, meta.priority)
        if fallback is None:
            return model
        prediction = self._predictor.predict(meta.prompt_class, max_tokens, meta.client)
        self._pools.queues[(model, config.pools[bucket_index(config.pools, prediction.tokens)].name)].note_diverted()
        return fallback.name

    async def stream(
        self, model: str, request: GenerationRequest, meta: RequestMeta
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        """The request's output, one stream over all its attempts. Raises
        `RateLimited`, `Overloaded`, `Unavailable` or `DeadlineExceeded` before
        any output; after it, failures end the stream with an `EngineError`."""
        config = self._models[model]
        prediction = self._predictor.predict(meta.prompt_class, request.max_tokens, meta.client)
        index = bucket_index(config.pools, prediction.tokens)
        scheduling = config.length_scheduling
        long = scheduling.long_edge is not None and prediction.tokens >= scheduling.long_edge
        record = RequestRecord(config.name, config.pools[index].name, meta.priority, meta.client,
                               prediction.tokens, prediction.source, long=long)
        self._pools.note_arrival(config.name, record.pool, long)
        token_bound = request_token_bound(len(request.prompt_token_ids), request.max_tokens,
                                          self._context_tokens[config.name])
        decision = self._limiter.admit(meta.client, token_bound)
        if not decision.allowed:
            record.status = "rejected"
            self._observer.finished(record)
            raise RateLimited(f"rate limit reached for {meta.client}: {decision.reason}", max(1, decision.retry_after_s))
        rank = PRIORITIES.index(meta.priority)
        length_rank = prediction.tokens if scheduling.enabled else 0
        request = replace(request, priority=rank * ENGINE_PRIORITY_STRIDE + min(length_rank, ENGINE_PRIORITY_STRIDE - 1))
        started = self._clock()
        try:
            async for item in self._run(config, index, request, meta, record, started):
                if isinstance(item, GenerationChunk) and item.finish_reason is not None:
                    record.finish_reason = item.finish_reason
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            record.status = "cancelled"
            raise
        finally:
            record.latency_s = self._clock() - started
            self._limiter.settle(meta.client, decision.reserved_tokens, record.prompt_tokens + record.output_tokens)
            if record.status == "ok":
                if worth_learning(record.finish_reason, record.output_tokens, record.predicted_tokens, scheduling.long_edge):
                    self._predictor.observe(meta.prompt_class, record.output_tokens, meta.client)
                self._pools.observe_finished(record)
            self._moves.update(rebucketed=len(record.pools) > 1, resent=record.resent, resumed=record.resumed)
            self._observer.finished(record)

    def _fallback(self, config: ModelConfig, priority: Priority) -> ModelConfig | None:
        """The model to serve instead while `config`'s pools have no replica."""
        if config.fallback is None or priority not in config.fallback.priorities:
            return None
        if self._pools.has_slots(config.name):
            return None
        return self._models[config.fallback.model]

    def _alternative_pool(self, config: ModelConfig, index: int) -> int | None:
        """Another pool of the model with replicas, later (longer) ones first."""
        order = [*range(index + 1, len(config.pools)), *range(index - 1, -1, -1)]
        return next((i for i in order if self._client.has_replicas(config.name, config.pools[i].name)), None)

    def _remaining_s(self, started: float) -> float:
        return self._ingress.request_timeout_s - (self._clock() - started)

    async def _acquire(self, model: str, pool: str, rank: Rank, record: RequestRecord, started: float) -> Slot:
        queue = self._pools.queues[(model, pool)]
        timeout_s = min(self._ingress.queue_timeout_s, max(0.0, self._remaining_s(started)))
        try:
            slot = await queue.acquire(rank, record.predicted_tokens, record.long, timeout_s)
        except Overloaded as exc:
            record.status = "rejected"
            raise Overloaded(f"model {model!r} is at capacity ({pool} pool: {exc.message}); retry later",
                             exc.retry_after_s) from None
        record.queue_wait_s += slot.waited_s
        record.pools.append(pool)
        self._observer.dispatched(model, pool, slot.waited_s)
        return slot

    async def _attempt(self, model: str, pool: str, request: GenerationRequest, priority: Priority,
                       started: float) -> AsyncIterator[GenerationChunk | EngineError]:
        """One attempt's output. No first chunk within `first_token_timeout_s`, or
        no next one within `stream_idle_timeout_s`, means a hung replica
        (`ReplicaUnavailable`); past the request's deadline, `DeadlineExceeded`."""
        limit_s = self._ingress.first_token_timeout_s
        async with aclosing(self._client.stream(model, pool, request, priority)) as chunks:
            while True:
                remaining = self._remaining_s(started)
                try:
                    async with asyncio.timeout(min(limit_s, max(0.0, remaining))):
                        item = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if self._remaining_s(started) <= 0:
                        raise DeadlineExceeded(f"over the {self._ingress.request_timeout_s:g}s request limit") from None
                    raise ReplicaUnavailable(f"no output for {limit_s:g}s") from None
                limit_s = self._ingress.stream_idle_timeout_s
                yield item

    async def _run(
        self,
        config: ModelConfig,
        index: int,
        request: GenerationRequest,
        meta: RequestMeta,
        record: RequestRecord,
        started: float,
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        slot: Slot | None = await self._acquire(config.name, config.pools[index].name, meta.priority, record, started)
        sent: list[int] = []
        sent_chars = failures = 0
        avoid: list[str] = []
        """Replicas found gone for good by earlier attempts: Serve's router skips them."""
        rebucket = config.overrun == "rebucket" and request.resumable
        long_edge = config.length_scheduling.long_edge
        try:
            while True:
                pool = config.pools[index]
                attempt = plan_attempt(replace(request, avoid_replicas=tuple(avoid)), pool, rebucket,
                                       record.attempts, tuple(sent), sent_chars)
                record.attempts += 1
                moved_on = False
                try:
                    async for item in self._attempt(config.name, pool.name, attempt.request, meta.priority, started):
                        if isinstance(item, EngineError):
                            if item.code in REPLICA_GONE_CODES:
                                raise ReplicaUnavailable(item.message, item.replica)
                            record.status = "error"
                            yield item
                            return
                        sent.extend(item.token_ids)
                        sent_chars += len(item.text)
                        record.output_tokens += item.num_tokens
                        record.prompt_tokens = item.prompt_tokens
                        if long_edge is not None and record.output_tokens >= long_edge and not slot.long:
                            record.long = slot.count_as_long()  # predicted short, runs long: capped from now on
                        moved_on = attempt.moves_on(item, record.output_tokens)
                        if moved_on:
                            item = replace(item, finish_reason=None)
                        if record.ttft_s is None and item.num_tokens:
                            record.ttft_s = self._clock() - started
                        yield item
                        if moved_on or item.finish_reason is not None:
                            break
                except ReplicaUnavailable as exc:
                    if sent and not request.resumable:
                        record.status = "error"
                        yield EngineError(f"the replica serving this request was lost after part of the answer "
                                          f"was sent, and a request with {not_resumable(request.params)} cannot "
                                          f"continue exactly elsewhere; retry it", status=503, code="unavailable")
                        return
                    failures += 1
                    if exc.replica is not None:
                        avoid.append(exc.replica)
                    wait_s = self._retry.wait_s(failures)
                    if wait_s is None:
                        raise Unavailable(f"model {config.name!r}: no replica could finish the request after "
                                          f"{failures} tries ({exc}); retry later", retry_after_s=1) from None
                    record.resumed += bool(sent)
                    record.resent += not sent
                    await self._sleep(wait_s)
                    if not self._client.has_replicas(config.name, pool.name):
                        alternative = self._alternative_pool(config, index)
                        if alternative is not None:  # the same model: resume there at once
                            slot.release()
                            slot = None
                            slot = await self._acquire(config.name, config.pools[alternative].name, "continuation",
                                                       record, started)
                            rebucket = rebucket and alternative > index  # a shorter pool runs to the end
                            index = alternative
                    continue
                if not moved_on:
                    record.status = "ok"
                    return
                index += 1
                slot.release()
                slot = None
                slot = await self._acquire(config.name, config.pools[index].name, "continuation", record, started)
        except (Refused, DeadlineExceeded) as exc:
            if not sent:
                raise
            record.status = "error"
            timed_out = isinstance(exc, DeadlineExceeded)
            yield EngineError(str(exc), status=504 if timed_out else 503, code="timeout" if timed_out else "unavailable")
        finally:
            if slot is not None:
                slot.release()
