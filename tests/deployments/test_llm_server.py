import asyncio

from deployments.llm_server import ENGINE_LOST_EXIT_CODE, ENGINE_WATCH_S, EXIT_DELAY_S, refusal
from serve_app.config import ModelConfig
from serve_app.engine.base import (
    REPLICA_DRAINING,
    REPLICA_ENGINE_LOST,
    EngineError,
    GenerationChunk,
    GenerationRequest,
)
from tests.fakes import FakeEngine, generation_request, start_llm_server

MODEL = ModelConfig(name="m", engine={"model": "unused"})


def request(max_tokens: int | None, prompt: str = "a b c", request_id: str = "r", **fields) -> GenerationRequest:
    return generation_request(max_tokens, tuple(range(len(prompt.split()))), request_id, **fields)


async def test_refusals_come_back_as_data_not_exceptions():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    streamed = [item async for item in server.stream(request(100))]
    assert len(streamed) == 1 and isinstance(streamed[0], EngineError)
    assert streamed[0].code == "context_length_exceeded"


async def test_stream_yields_each_step_when_not_coalescing():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    chunks = [item async for item in server.stream(request(3))]
    assert [c.text for c in chunks] == [" w0", " w1", " w2"]
    assert [c.token_ids for c in chunks] == [(0,), (1,), (2,)]
    assert chunks[-1].finish_reason == "length"


async def test_a_busy_replica_asks_the_engine_for_larger_chunks():
    model = MODEL.model_copy(update={"stream_chunk_tokens": 3, "stream_busy_requests": 2})
    engine = FakeEngine(max_model_len=64)
    server = await start_llm_server(model, engine)
    first = server.stream(request(5, request_id="a"))
    await anext(first)
    second = server.stream(request(5, request_id="b"))
    await anext(second)
    third = server.stream(request(5, request_id="c"))
    await anext(third)  # two already in flight: busy
    assert [r.stream_interval for r in engine.requests] == [1, 1, 3]
    for stream in (first, second, third):
        [item async for item in stream]
    [item async for item in server.stream(request(2))]
    assert engine.requests[-1].stream_interval == 1  # idle again


async def test_continuation_and_stop_after_reach_the_engine():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    chunks = [item async for item in server.stream(request(6, continuation=(0, 1), stop_after=2))]
    assert "".join(c.text for c in chunks) == " w2 w3" and chunks[-1].finish_reason == "length"


async def test_routing_stats_count_running_requests_and_their_token_debt():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    stream = server.stream(request(5))
    await anext(stream)
    assert server.record_routing_stats() == {"in_flight": 1, "in_flight_tokens": 4, "serving": 1}
    [item async for item in stream]
    assert server.record_routing_stats() == {"in_flight": 0, "in_flight_tokens": 0, "serving": 1}


async def test_a_spot_notice_drains_refuses_new_work_and_finishes_running_work():
    import asyncio

    import pytest

    from serve_app.capacity import SPOT
    from serve_app.capacity.preemption import PreemptionConfig
    from tests.fakes import FakeImds, FakeNode

    imds, node = FakeImds(), FakeNode(SPOT)
    try:
        config = PreemptionConfig(imds_url=imds.url, poll_interval_s=0.05, imds_timeout_s=0.5)
        server = await start_llm_server(MODEL, FakeEngine(max_model_len=64, step_s=0.05), preemption=config, node=node)
        running = server.stream(request(10))
        first = await anext(running)
        imds.announce(in_s=60)
        for _ in range(40):
            await asyncio.sleep(0.05)
            if server._guard.draining:
                break
        refused = [item async for item in server.stream(request(2))]
        assert refused == [refusal(REPLICA_DRAINING, None)]
        assert server.record_routing_stats()["serving"] == 0  # the request router skips it from now on
        await server.check_health()  # still finishing the running request
        rest = [item async for item in running]
        assert first.text + "".join(chunk.text for chunk in rest) == "".join(f" w{i}" for i in range(10))
        with pytest.raises(RuntimeError, match="draining"):
            await server.check_health()
        await asyncio.sleep(0.05)
        assert len(node.drains) == 1
    finally:
        imds.close()


async def test_a_dead_engine_is_a_lost_replica_every_stream_refused_and_the_replica_exits():
    engine, exits = FakeEngine(max_model_len=64, step_s=0.01), []
    server = await start_llm_server(MODEL, engine, exits=exits)
    engine.dies_after = 3
    running = [item async for item in server.stream(request(10, request_id="a"))]
    assert [type(item) for item in running] == [GenerationChunk] * 3 + [EngineError]
    assert running[-1].code == REPLICA_ENGINE_LOST and running[-1].status == 503  # retried, not a 500
    assert [item async for item in server.stream(request(2, request_id="b"))] == [refusal(REPLICA_ENGINE_LOST, None)]
    assert server.record_routing_stats()["serving"] == 0
    assert exits == []
    await asyncio.sleep(EXIT_DELAY_S + 0.1)
    assert exits == [ENGINE_LOST_EXIT_CODE]  # out of every router at once; Serve replaces it


async def test_an_engine_that_dies_while_idle_is_noticed_without_a_request():
    engine, exits = FakeEngine(max_model_len=64), []
    server = await start_llm_server(MODEL, engine, exits=exits)
    engine.lost = True
    for _ in range(int((ENGINE_WATCH_S + EXIT_DELAY_S) / 0.05) + 20):
        if exits:
            break
        await asyncio.sleep(0.05)
    assert exits == [ENGINE_LOST_EXIT_CODE]
    assert server.record_routing_stats()["serving"] == 0
