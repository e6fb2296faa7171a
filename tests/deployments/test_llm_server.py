from serve_app.config import ModelConfig
from serve_app.engine.base import EngineError, GenerationRequest, GenerationResult, SamplingOptions
from tests.fakes import FakeEngine, start_llm_server

MODEL = ModelConfig(name="m", engine={"model": "unused"})


def request(max_tokens: int | None, prompt: str = "a b c") -> GenerationRequest:
    return GenerationRequest(request_id="r", sampling=SamplingOptions(max_tokens=max_tokens), prompt=prompt)


async def test_generate_returns_the_whole_result():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    result = await server.generate(request(2))
    assert result == GenerationResult(text=" w0 w1", prompt_tokens=3, completion_tokens=2, finish_reason="length")


async def test_refusals_come_back_as_data_not_exceptions():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    refused = await server.generate(request(100))
    assert isinstance(refused, EngineError) and refused.code == "context_length_exceeded"
    streamed = [item async for item in server.stream(request(100))]
    assert len(streamed) == 1 and isinstance(streamed[0], EngineError)


async def test_stream_yields_each_step_when_not_coalescing():
    server = await start_llm_server(MODEL.model_copy(update={"stream_interval_ms": 0}), FakeEngine(max_model_len=16))
    chunks = [item async for item in server.stream(request(3))]
    assert [c.text for c in chunks] == [" w0", " w1", " w2"]
    assert chunks[-1].finish_reason == "length"


async def test_stream_coalesces_steps_after_the_first():
    server = await start_llm_server(MODEL, FakeEngine(max_model_len=16))
    chunks = [item async for item in server.stream(request(5))]
    assert chunks[0].text == " w0" and "".join(c.text for c in chunks) == " w0 w1 w2 w3 w4"
    assert len(chunks) < 5 and sum(c.num_tokens for c in chunks) == 5
