"""The batcher over in-process pools of fake engines: buckets, continuation, retries, admission."""

import asyncio

import pytest

from serve_app.config import ApiKeyConfig, AppConfig
from serve_app.engine.base import (
    REPLICA_ENGINE_LOST,
    EngineError,
    EngineRequestError,
    GenerationRequest,
)
from serve_app.quantile import quantile
from serve_app.scheduling.batcher import ENGINE_PRIORITY_STRIDE, LengthBucketBatcher
from serve_app.scheduling.errors import Overloaded, RateLimited, ReplicaUnavailable, Unavailable
from serve_app.scheduling.long_cap import SHORT_DEMAND_WINDOW_S, LongCapPolicy
from serve_app.scheduling.predictor import PromptClass
from serve_app.scheduling.types import RequestMeta
from tests.fakes import FakeEngine, ManualClock, generation_request


def config(**ingress) -> AppConfig:
    return AppConfig.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "engine": {"model": "unused", "max_model_len": 64},
                    "pools": [
                        {"name": "short", "max_output_tokens": 4, "queue_size": 4},
                        {"name": "long", "queue_size": 4},
                    ],
                }
            ],
            "ingress": {"retry_backoff_s": 0, "predictor": {"min_samples": 2}, **ingress},
        }
    )


class Pools:
    """A `PoolClient` over one fake engine per pool; can lose a replica mid-stream."""

    def __init__(self, **engine_args) -> None:
        self.engines = {"short": FakeEngine(**engine_args), "long": FakeEngine(**engine_args)}
        self.calls: list[tuple[str, GenerationRequest]] = []
        self.lose_after: list[int] = []
        """Chunks after which the next attempts' replica dies, one entry per attempt."""
        self.down: set[str] = set()
        """Pools that have no replica left."""

    def has_replicas(self, model, pool):
        return pool not in self.down

    async def stream(self, model, pool, request, priority):
        self.calls.append((pool, request))
        lose_after = self.lose_after.pop(0) if self.lose_after else None
        sent = 0
        try:
            async for chunk in self.engines[pool].stream(request):
                if sent == lose_after:
                    raise ReplicaUnavailable("ActorDiedError")
                sent += 1
                yield chunk
        except EngineRequestError as exc:  # as LLMServer does: refusals are data
            yield exc.error
        if sent == lose_after:
            raise ReplicaUnavailable("ActorDiedError")


class Observer:
    def __init__(self) -> None:
        self.records = []
        self.waits = []

    def dispatched(self, model, pool, wait_s):
        self.waits.append((pool, wait_s))

    def finished(self, record):
        self.records.append(record)


def batcher_for(pools: Pools, **ingress) -> tuple[LengthBucketBatcher, Observer]:
    observer = Observer()
    batcher = LengthBucketBatcher(config(**ingress), pools, observer)
    batcher.set_slots("m", "short", 2)
    batcher.set_slots("m", "long", 2)
    return batcher, observer


def request(max_tokens=None, prompt="a b", request_id="r"):
    return generation_request(max_tokens, tuple(range(len(prompt.split()))), request_id)


def meta(priority="realtime", template=None, client=None):
    return RequestMeta(priority, client, PromptClass("completion", template, 3))


async def text_of(batcher, req, info=None):
    return "".join([chunk.text async for chunk in batcher.stream("m", req, info or meta())])


async def test_the_prediction_picks_the_bucket():
    pools = Pools()
    batcher, observer = batcher_for(pools)
    await text_of(batcher, request(3))
    await text_of(batcher, request(10))
    assert [pool for pool, _ in pools.calls] == ["short", "long"]
    assert [r.pool for r in observer.records] == ["short", "long"]


async def test_a_request_past_its_bucket_edge_continues_on_the_next_pool_as_one_stream():
    pools = Pools(answer_tokens=7)
    batcher, observer = batcher_for(pools)
    for _ in range(2):  # the class has answered in 2 tokens: predicted short
        batcher._predictor.observe(PromptClass("completion", "t", 3), 2)
    chunks = [c async for c in batcher.stream("m", request(10), meta(template="t"))]
    assert "".join(c.text for c in chunks) == " w0 w1 w2 w3 w4 w5 w6"  # as one uninterrupted run
    assert [c.finish_reason for c in chunks][-1] == "stop" and [c.finish_reason for c in chunks[:-1]] == [None] * 6
    (first_pool, first), (second_pool, second) = pools.calls
    assert (first_pool, second_pool) == ("short", "long")
    assert first.stop_after == 4 and first.max_tokens == 10
    assert second.continuation == (0, 1, 2, 3) and second.max_tokens == 6 and second.stop_after is None
    assert observer.records[-1].pools == ["short", "long"] and observer.records[-1].output_tokens == 7


async def test_overrun_finish_keeps_the_request_in_its_pool():
    pools = Pools()
    batcher = LengthBucketBatcher(config(), pools, Observer())
    batcher._models["m"] = batcher._models["m"].model_copy(update={"overrun": "finish"})
    batcher.set_slots("m", "short", 1)
    batcher._predictor.observe(PromptClass("completion", None, 3), 1)
    batcher._predictor.observe(PromptClass("completion", None, 3), 1)
    assert await text_of(batcher, request(6)) == " w0 w1 w2 w3 w4 w5"
    assert [pool for pool, _ in pools.calls] == ["short"] and pools.calls[0][1].stop_after is None


async def test_a_lost_replica_mid_stream_resumes_with_nothing_lost_or_repeated():
    pools = Pools()
    pools.lose_after = [3, 2]
    batcher, observer = batcher_for(pools)
    assert await text_of(batcher, request(10)) == "".join(f" w{i}" for i in range(10))
    continuations = [call.continuation for _, call in pools.calls]
    assert continuations == [(), (0, 1, 2), (0, 1, 2, 3, 4)]
    record = observer.records[-1]
    assert (record.status, record.resumed, record.resent, record.output_tokens) == ("ok", 2, 0, 10)


async def test_a_request_lost_before_output_is_re_sent():
    pools = Pools()
    pools.lose_after = [0]
    batcher, observer = batcher_for(pools)
    assert await text_of(batcher, request(3)) == " w0 w1 w2"
    assert observer.records[-1].resent == 1 and len(pools.calls) == 2


def exact_only(max_tokens: int, **fields):
    """A request whose state a continuation cannot rebuild (here: seeded, or with penalties)."""
    from vllm.sampling_params import SamplingParams

    return generation_request(max_tokens, params=SamplingParams(max_tokens=max_tokens, **fields))


@pytest.mark.parametrize("fields", [{"seed": 3}, {"presence_penalty": 1.0}, {"repetition_penalty": 1.2}])
async def test_a_request_that_cannot_continue_exactly_ends_with_an_error_when_its_replica_is_lost(fields):
    pools = Pools()
    pools.lose_after = [3]
    batcher, observer = batcher_for(pools)
    items = [item async for item in batcher.stream("m", exact_only(10, **fields), meta())]
    assert [item.text for item in items[:-1]] == [" w0", " w1", " w2"]
    assert isinstance(items[-1], EngineError) and items[-1].status == 503 and "retry it" in items[-1].message
    assert len(pools.calls) == 1 and observer.records[-1].status == "error"


async def test_a_request_that_cannot_continue_exactly_is_re_sent_whole_when_nothing_was_sent():
    pools = Pools()
    pools.lose_after = [0]
    batcher, observer = batcher_for(pools)
    assert await text_of(batcher, exact_only(3, seed=3)) == " w0 w1 w2"
    assert [call.continuation for _, call in pools.calls] == [(), ()] and observer.records[-1].resent == 1


async def test_a_request_that_cannot_continue_exactly_never_crosses_a_bucket_edge():
    pools = Pools(answer_tokens=7)
    batcher, _ = batcher_for(pools)
    for _ in range(2):  # predicted short: it lands in the short pool, and stays there
        batcher._predictor.observe(PromptClass("completion", "t", 3), 2)
    assert await text_of(batcher, exact_only(10, seed=1), meta(template="t")) == "".join(f" w{i}" for i in range(7))
    assert [(pool, call.stop_after) for pool, call in pools.calls] == [("short", None)]


async def test_retries_are_bounded_then_503_before_output_or_an_error_event_after():
    pools = Pools()
    pools.lose_after = [0, 0, 0]
    batcher, _ = batcher_for(pools)
    with pytest.raises(Unavailable) as refused:
        await text_of(batcher, request(3))
    assert refused.value.retry_after_s == 1 and len(pools.calls) == 3
    pools.lose_after = [1, 0, 0]
    items = [item async for item in batcher.stream("m", request(3), meta())]
    assert items[0].text == " w0" and isinstance(items[-1], EngineError) and items[-1].status == 503


async def test_a_draining_replica_refusal_is_retried_elsewhere():
    pools = Pools()
    real = pools.stream
    refusals = [EngineError("draining", status=503, code="replica_draining")]

    async def stream(model, pool, req, priority):
        if refusals:
            yield refusals.pop()
            return
        async for item in real(model, pool, req, priority):
            yield item

    pools.stream = stream
    batcher, _ = batcher_for(pools)
    assert await text_of(batcher, request(2)) == " w0 w1"


async def test_a_dead_engine_mid_stream_resumes_elsewhere_and_later_attempts_avoid_its_replica():
    pools = Pools()
    real = pools.stream
    dies = [True]

    async def stream(model, pool, req, priority):
        sent = 0
        async for item in real(model, pool, req, priority):
            if dies and sent == 2:
                dies.pop()
                yield EngineError("engine died", status=503, code=REPLICA_ENGINE_LOST, replica="actor-1")
                return
            sent += 1
            yield item

    pools.stream = stream
    batcher, observer = batcher_for(pools)
    assert await text_of(batcher, request(4)) == " w0 w1 w2 w3"  # nothing lost, nothing repeated, no 500
    assert [req.avoid_replicas for _, req in pools.calls] == [(), ("actor-1",)]
    assert observer.records[-1].resumed == 1


async def test_the_first_token_has_its_own_limit_and_the_idle_limit_starts_after_it():
    pools = Pools()
    real = pools.stream
    first_waits = [0.3, 0.3]

    async def stream(model, pool, req, priority):
        await asyncio.sleep(first_waits.pop(0))  # queued inside the engine, then prefill
        async for item in real(model, pool, req, priority):
            yield item

    pools.stream = stream
    batcher, observer = batcher_for(pools, first_token_timeout_s=1.0, stream_idle_timeout_s=0.1)
    assert await text_of(batcher, request(3)) == " w0 w1 w2"  # a wait past the idle limit, but a first token
    assert observer.records[-1].resent == 0
    batcher, observer = batcher_for(pools, first_token_timeout_s=0.1, stream_idle_timeout_s=1.0)
    first_waits[:] = [0.3, 0.0]
    assert await text_of(batcher, request(3)) == " w0 w1 w2"
    assert observer.records[-1].resent == 1  # past the first-token limit: a hung replica, sent elsewhere


async def test_engine_refusals_pass_through_and_are_not_learned():
    pools = Pools(max_model_len=8)
    batcher, observer = batcher_for(pools)
    items = [item async for item in batcher.stream("m", request(100), meta())]
    assert isinstance(items[0], EngineError) and items[0].code == "context_length_exceeded"
    assert observer.records[-1].status == "error" and batcher.predictor_classes() == {}


async def test_a_full_queue_is_503_with_retry_after_and_batch_is_refused_first():
    pools = Pools(step_s=0.01)
    batcher, _ = batcher_for(pools)
    batcher.set_slots("m", "long", 1)
    running = [asyncio.create_task(text_of(batcher, request(20, request_id=f"r{i}"))) for i in range(3)]
    await asyncio.sleep(0.01)  # one runs, two wait; the batch share (2 of 4) is full
    with pytest.raises(Overloaded) as batch:
        await text_of(batcher, request(20), meta("batch"))
    assert "past the batch share" in batch.value.message
    running += [asyncio.create_task(text_of(batcher, request(20, request_id="r4")))]
    running += [asyncio.create_task(text_of(batcher, request(20, request_id="r5")))]
    await asyncio.sleep(0.01)  # four wait now: the queue is full
    with pytest.raises(Overloaded) as realtime:
        await text_of(batcher, request(20))
    assert realtime.value.retry_after_s >= 1
    assert "queue full" in realtime.value.message
    results = await asyncio.gather(*running)
    assert all(text.endswith(" w19") for text in results)  # every accepted request completes


async def test_realtime_is_dispatched_before_waiting_batch():
    pools = Pools(step_s=0.01)
    batcher, _ = batcher_for(pools)
    batcher.set_slots("m", "long", 1)
    order = []

    async def run(name, priority):
        await text_of(batcher, request(5, request_id=name), meta(priority))
        order.append(name)

    first = asyncio.create_task(run("first", "batch"))
    await asyncio.sleep(0)
    batch = asyncio.create_task(run("batch", "batch"))
    await asyncio.sleep(0)
    realtime = asyncio.create_task(run("realtime", "realtime"))
    await asyncio.gather(first, batch, realtime)
    assert order == ["first", "realtime", "batch"]


async def test_rate_limits_are_429_with_retry_after():
    pools = Pools()
    keys = [{"name": "team", "sha256": "0" * 64, "requests_per_s": 1}]
    batcher, _ = batcher_for(pools, api_keys=keys)
    batcher.admit_request("team")  # on arrival, before the body is read
    await text_of(batcher, request(1), meta(client="team"))  # charges its tokens, not the request again
    with pytest.raises(RateLimited) as limited:
        batcher.admit_request("team")
    assert limited.value.retry_after_s >= 1 and len(pools.calls) == 1


async def test_queue_waits_are_measured_and_exported_as_stats():
    pools = Pools(step_s=0.02)
    batcher, observer = batcher_for(pools)
    batcher.set_slots("m", "long", 1)
    await asyncio.gather(*(text_of(batcher, request(5, request_id=f"r{i}")) for i in range(3)))
    waits = sorted(wait for pool, wait in observer.waits if pool == "long")
    assert waits[0] < 0.01 and waits[-1] > 0.15
    stats = batcher.stats()[("m", "long")]
    assert stats.queue_wait_p90_s == pytest.approx(quantile(waits, 0.9)) and stats.in_flight == 0


class TieredPools:
    def __init__(self) -> None:
        self.engines = {"big": FakeEngine(), "tiny": FakeEngine()}

    def has_replicas(self, model, pool):
        return True

    async def stream(self, model, pool, request, priority):
        async for chunk in self.engines[model].stream(request):
            yield chunk


async def test_realtime_falls_back_to_the_tiny_tier_while_the_big_model_is_at_zero():
    config = AppConfig.model_validate({
        "models": [
            {"name": "big", "engine": {"model": "unused"}, "fallback": {"model": "tiny", "priorities": ["realtime"]}},
            {"name": "tiny", "engine": {"model": "unused"}},
        ],
    })
    pools = TieredPools()
    batcher = LengthBucketBatcher(config, pools, Observer())
    batcher.set_slots("tiny", "default", 4)
    answering = batcher.route("big", meta("realtime"), 2)
    assert answering == "tiny" and batcher.route("big", meta("batch"), 2) == "big"
    assert await text_of_model(batcher, answering, request(2), meta("realtime")) == " w0 w1"
    assert len(pools.engines["tiny"].requests) == 1
    waiting = asyncio.create_task(text_of_model(batcher, "big", request(2), meta("batch")))
    await asyncio.sleep(0.01)
    big = batcher.stats()[("big", "default")]
    assert not waiting.done() and big.waiting == 1 and big.diverted == 1  # demand that should scale it up
    batcher.set_slots("big", "default", 4)  # a big replica is ready
    assert await waiting == " w0 w1"
    assert batcher.route("big", meta("realtime"), 2) == "big"


async def text_of_model(batcher, model, req, info):
    return "".join([chunk.text async for chunk in batcher.stream(model, req, info)])


def test_a_fallback_must_be_another_model_without_its_own_fallback():
    from pydantic import ValidationError

    def models(fallback_of_tiny):
        return {"models": [
            {"name": "big", "engine": {"model": "x"}, "fallback": {"model": "tiny"}},
            {"name": "tiny", "engine": {"model": "x"}, **fallback_of_tiny},
        ]}

    AppConfig.model_validate(models({}))
    with pytest.raises(ValidationError, match="has a fallback itself"):
        AppConfig.model_validate(models({"fallback": {"model": "big"}}))
    with pytest.raises(ValidationError, match="not another served model"):
        AppConfig.model_validate({"models": [{"name": "a", "engine": {"model": "x"}, "fallback": {"model": "a"}}]})


async def test_when_a_pool_loses_its_only_replica_the_stream_resumes_on_another_pool_at_once():
    pools = Pools()
    pools.lose_after = [3]
    real = pools.stream

    async def losing_the_pool(model, pool, req, priority):
        try:
            async for item in real(model, pool, req, priority):
                yield item
        except ReplicaUnavailable:
            pools.down.add(pool)  # it was the pool's only replica
            raise

    pools.stream = losing_the_pool
    batcher, observer = batcher_for(pools)
    text = await text_of(batcher, request(10))  # predicted 10: the long pool
    assert text == "".join(f" w{i}" for i in range(10))
    assert [pool for pool, _ in pools.calls] == ["long", "short"]
    resumed = pools.calls[1][1]
    assert resumed.continuation == (0, 1, 2) and resumed.stop_after is None  # a shorter pool runs to the end
    assert observer.records[-1].pools == ["long", "short"] and observer.records[-1].resumed == 1


async def test_a_hung_replica_counts_as_lost_and_the_stream_resumes():
    pools = Pools()
    real = pools.stream
    hang = [True]

    async def stream(model, pool, req, priority):
        async for item in real(model, pool, req, priority):
            yield item
            if hang and item.token_ids == (1,):
                hang.clear()
                await asyncio.sleep(3600)  # an engine that stops producing

    pools.stream = stream
    batcher, observer = batcher_for(pools, stream_idle_timeout_s=0.05)
    assert await text_of(batcher, request(5)) == " w0 w1 w2 w3 w4"
    assert pools.calls[1][1].continuation == (0, 1) and observer.records[-1].resumed == 1


async def test_the_request_deadline_is_504_before_output_and_an_error_event_after():
    pools = Pools(step_s=0.05)
    batcher, _ = batcher_for(pools, request_timeout_s=0.12)
    items = [item async for item in batcher.stream("m", request(20), meta())]
    assert items[0].text == " w0" and isinstance(items[-1], EngineError)
    assert (items[-1].status, items[-1].code) == (504, "timeout")
    batcher.set_slots("m", "long", 0)
    with pytest.raises(Overloaded):  # the queue wait is bounded by the deadline too
        await text_of(batcher, request(20))


async def test_engine_priority_is_the_class_then_the_predicted_length():
    pools = Pools()
    batcher, _ = batcher_for(pools)
    await text_of(batcher, request(3), meta("batch"))
    await text_of(batcher, request(9), meta("realtime"))
    await text_of(batcher, request(2), meta("realtime"))
    assert [call.priority for _, call in pools.calls] == [ENGINE_PRIORITY_STRIDE + 3, 9, 2]


async def test_each_ingress_replica_takes_its_share_of_queues_and_rate_limits():
    keys = [ApiKeyConfig(name="team", sha256="0" * 64, tokens_per_min=80)]
    batcher = LengthBucketBatcher(config(api_keys=keys), Pools(), Observer(), clock=ManualClock())
    batcher.set_slots("m", "long", 2)
    batcher.set_ingress_replicas(2)
    assert batcher._pools.queues[("m", "long")]._queue_size == 2  # 4 / 2
    await text_of(batcher, request(40), meta(client="team"))  # 2 + 40 tokens of the 60 here (80 x 1.5 / 2)
    with pytest.raises(RateLimited):
        await text_of(batcher, request(30), meta(client="team"))  # 18 left


async def test_short_requests_tpot_shrinks_the_long_cap_when_over_target():
    pools = Pools()
    batcher = LengthBucketBatcher(config(), pools, Observer())
    model = batcher._models["m"]
    scheduling = model.length_scheduling.model_copy(
        update={"short_tpot_target_s": 1e-9, "long_tokens": 5, "long_slot_share": 0.75})
    batcher._models["m"] = model.model_copy(update={"length_scheduling": scheduling})
    batcher._pools.long_caps[("m", "short")] = LongCapPolicy(scheduling)
    batcher.set_slots("m", "short", 8)
    assert batcher.stats()[("m", "short")].long_cap == 8  # no short request yet: no reserve
    await text_of(batcher, request(4, prompt="a"))  # short, and its TPOT is over the (tiny) target
    # the short arrival put the 0.75 share in force; its TPOT then shrank it at the next update
    batcher.set_slots("m", "short", 8)
    assert batcher.stats()[("m", "short")].long_cap == 4  # 0.75 x 0.8 of 8


async def test_a_long_arrival_lifts_the_long_cap_as_soon_as_short_demand_has_ended():
    clock = ManualClock(1000.0)
    batcher = LengthBucketBatcher(config(), Pools(), Observer(), clock=clock)
    model = batcher._models["m"]
    scheduling = model.length_scheduling.model_copy(update={"long_tokens": 10})
    batcher._models["m"] = model.model_copy(update={"length_scheduling": scheduling})
    batcher._pools.long_caps[("m", "long")] = LongCapPolicy(scheduling, clock)
    batcher.set_slots("m", "long", 8)
    await text_of(batcher, request(6), meta(template="short"))  # predicted 6 < 10 tokens: short
    assert batcher.stats()[("m", "long")].long_cap == 7  # a reserve of the one short request, at once
    clock.now += SHORT_DEMAND_WINDOW_S + 1
    await text_of(batcher, request(20), meta(template="long"))  # no capacity read in between
    assert batcher.stats()[("m", "long")].long_cap == 8


async def test_the_short_reserve_follows_the_short_requests_each_arrival_found():
    batcher = LengthBucketBatcher(config(), Pools(step_s=0.01), Observer())
    model = batcher._models["m"]
    scheduling = model.length_scheduling.model_copy(update={"long_tokens": 10})
    batcher._models["m"] = model.model_copy(update={"length_scheduling": scheduling})
    batcher._pools.long_caps[("m", "long")] = LongCapPolicy(scheduling)
    batcher.set_slots("m", "long", 16)
    # three short requests at once: the third found three short requests, itself included
    await asyncio.gather(*(text_of(batcher, request(6), meta(template="short")) for _ in range(3)))
    assert batcher.stats()[("m", "long")].long_cap == 13  # ceil(p95 of 1, 2, 3) kept for them


async def test_a_request_predicted_short_counts_as_long_once_its_output_reaches_the_long_edge():
    pools = Pools(answer_tokens=6)
    batcher, observer = batcher_for(pools)
    model = batcher._models["m"]
    scheduling = model.length_scheduling.model_copy(update={"long_tokens": 10})
    batcher._models["m"] = model.model_copy(update={"length_scheduling": scheduling})
    batcher._pools.long_caps[("m", "long")] = LongCapPolicy(scheduling)
    batcher.set_slots("m", "long", 8)
    for _ in range(2):  # the class's history: answers of 6 tokens, so the next one is predicted short
        await text_of(batcher, request(20), meta(template="t"))
    pools.engines["long"].answer_tokens = None  # this one runs to its max_tokens
    long_in_flight = [batcher.stats()[("m", "long")].long_in_flight
                      async for _ in batcher.stream("m", request(20), meta(template="t"))]
    assert long_in_flight == [0] * 9 + [1] * 11  # from its tenth token on, it holds a capped long slot
    assert observer.records[-1].predicted_tokens == 6 and observer.records[-1].long
    assert batcher.stats()[("m", "long")].long_in_flight == 0  # and gave it back as a long one


async def test_a_tenant_flooding_a_class_with_long_outputs_leaves_anothers_predictions_alone():
    keys = [ApiKeyConfig(name=name, sha256=digit * 64) for name, digit in (("alpha", "a"), ("beta", "b"))]
    pools = Pools(answer_tokens=2)
    batcher, observer = batcher_for(pools, api_keys=keys)
    for _ in range(2):  # beta's requests of the class end by themselves in 2 tokens
        await text_of(batcher, request(), meta(template="t", client="beta"))
    for engine in pools.engines.values():
        engine.answer_tokens = 30
    for _ in range(10):  # alpha floods the same class with long outputs
        await text_of(batcher, request(), meta(template="t", client="alpha"))
    await text_of(batcher, request(), meta(template="t", client="beta"))
    assert (observer.records[-1].predicted_tokens, observer.records[-1].pools[0]) == (2, "short")


async def test_only_outputs_that_ended_by_themselves_are_learned():
    pools = Pools()  # no answer ends by itself: each is cut at its max_tokens
    batcher, observer = batcher_for(pools)
    for _ in range(3):
        await text_of(batcher, request(3), meta(template="t"))
    assert batcher.predictor_classes() == {}
    assert (observer.records[-1].status, observer.records[-1].finish_reason) == ("ok", "length")
    for engine in pools.engines.values():
        engine.answer_tokens = 2
    for _ in range(2):
        await text_of(batcher, request(3), meta(template="t"))
    assert observer.records[-1].finish_reason == "stop" and batcher.predictor_classes() == {"template:t": 2}
    for engine in pools.engines.values():
        engine.answer_tokens = 7
    await text_of(batcher, request(10), meta(template="t"))  # predicted 2: past the short pool's edge
    assert observer.records[-1].pools == ["short", "long"]  # re-bucketed, and ended by itself: learned
    assert batcher.predictor_classes() == {"template:t": 3}


async def test_an_output_predicted_short_and_cut_past_the_long_edge_is_learned():
    pools = Pools(answer_tokens=2)
    batcher, observer = batcher_for(pools)
    model = batcher._models["m"]
    batcher._models["m"] = model.model_copy(update={
        "length_scheduling": model.length_scheduling.model_copy(update={"long_tokens": 10})})
    for _ in range(2):  # the class answers in 2 tokens
        await text_of(batcher, request(20), meta(template="t"))
    assert batcher._predictor.predict(PromptClass("completion", "t", 3), 20).tokens == 2
    for engine in pools.engines.values():
        engine.answer_tokens = None  # now it runs on: each answer is cut at max_tokens
    await text_of(batcher, request(8), meta(template="t"))  # cut at 8, short of the long edge: says nothing
    assert batcher.predictor_classes() == {"template:t": 2}
    await text_of(batcher, request(12), meta(template="t"))
    assert (observer.records[-1].finish_reason, observer.records[-1].output_tokens) == ("length", 12)
    # 12 is only a lower bound, but past the edge of the class it was predicted in: learned, the prediction moves up
    assert batcher.predictor_classes() == {"template:t": 3}
    assert batcher._predictor.predict(PromptClass("completion", "t", 3), 20).tokens > 2


async def limited_batcher(tokens_per_min: int) -> LengthBucketBatcher:
    """A batcher on a still clock whose client `team` has `tokens_per_min`, and
    whose predictor has seen the client's class answer in 2 tokens."""
    keys = [ApiKeyConfig(name="team", sha256="0" * 64, tokens_per_min=tokens_per_min)]
    batcher = LengthBucketBatcher(config(api_keys=keys), Pools(answer_tokens=2), Observer(), clock=ManualClock())
    batcher.set_slots("m", "short", 2)
    batcher.set_slots("m", "long", 2)
    for _ in range(2):  # each settles to 2 prompt + 2 output tokens
        await text_of(batcher, request(5), meta(client="team"))
    return batcher


async def test_tokens_are_reserved_at_max_tokens_whatever_the_prediction_and_settled_after():
    batcher = await limited_batcher(tokens_per_min=100)  # 92 left
    running = batcher.stream("m", request(60), meta(client="team"))
    await anext(running)  # admitted and running, predicted at 2 tokens: 60 reserved, 32 left
    with pytest.raises(RateLimited):
        await text_of(batcher, request(60), meta(client="team"))
    async for _ in running:  # it ends by itself at 2 + 2 tokens, so 88 left
        pass
    await text_of(batcher, request(60), meta(client="team"))


async def test_without_max_tokens_a_request_reserves_the_models_context():
    batcher = await limited_batcher(tokens_per_min=100)  # 92 left
    running = batcher.stream("m", request(), meta(client="team"))
    await anext(running)  # predicted at 2 tokens, but may run to the context: 64 reserved, 28 left
    with pytest.raises(RateLimited):
        await text_of(batcher, request(), meta(client="team"))
    await running.aclose()


async def test_two_ingress_replicas_refuse_nothing_at_90_percent_of_the_limit_split_70_30():
    clock = ManualClock()
    keys = [ApiKeyConfig(name="team", sha256="0" * 64, tokens_per_min=600)]
    replicas = []
    for _ in range(2):
        batcher = LengthBucketBatcher(config(api_keys=keys), Pools(), Observer(), clock=clock)
        batcher.set_slots("m", "short", 2)
        batcher.set_slots("m", "long", 2)
        batcher.set_ingress_replicas(2)
        replicas.append(batcher)
    refused = 0
    for i in range(540):  # 10 minutes of 0.9 requests/s of 10 tokens (2 prompt, 8 output): 90% of the limit
        clock.now = i / 0.9
        batcher = replicas[0 if (i + 1) * 7 // 10 > i * 7 // 10 else 1]  # 70% to the first, interleaved
        try:
            await text_of(batcher, request(8), meta(client="team"))
        except RateLimited:
            refused += 1
    assert refused == 0
