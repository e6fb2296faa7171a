import asyncio

import pytest

from serve_app.engine.base import GenerationChunk
from serve_app.engine.coalesce import coalesce, merge


def chunk(text: str, finish: str | None = None) -> GenerationChunk:
    return GenerationChunk(text=text, num_tokens=1, prompt_tokens=4, finish_reason=finish)


async def steps(texts, delay_s: float, fail_at: int | None = None):
    for index, text in enumerate(texts):
        if index == fail_at:
            raise RuntimeError("engine died")
        await asyncio.sleep(delay_s)
        yield chunk(text, "stop" if index == len(texts) - 1 else None)


def test_merge_keeps_counts_and_the_last_finish_reason():
    merged = merge([chunk("a"), chunk("b", "stop")])
    assert merged == GenerationChunk(text="ab", num_tokens=2, prompt_tokens=4, finish_reason="stop")


async def test_first_chunk_alone_then_batches_and_nothing_lost():
    texts = [f"t{i}" for i in range(20)]
    out = [c async for c in coalesce(steps(texts, 0.002), interval_s=0.02)]
    assert out[0].text == "t0"
    assert "".join(c.text for c in out) == "".join(texts)
    assert sum(c.num_tokens for c in out) == 20 and out[-1].finish_reason == "stop"
    assert len(out) < 10


async def test_zero_interval_passes_every_step_through():
    out = [c async for c in coalesce(steps(["a", "b", "c"], 0), interval_s=0)]
    assert [c.text for c in out] == ["a", "b", "c"]


async def test_errors_arrive_after_the_output_before_them():
    seen = []
    with pytest.raises(RuntimeError, match="engine died"):
        async for c in coalesce(steps(["a", "b", "c", "d"], 0.001, fail_at=2), interval_s=0.01):
            seen.append(c.text)
    assert "".join(seen) == "ab"


async def test_closing_the_consumer_cancels_the_source():
    cancelled = asyncio.Event()

    async def endless():
        try:
            while True:
                await asyncio.sleep(0.001)
                yield chunk("x")
        finally:
            cancelled.set()

    stream = coalesce(endless(), interval_s=0.005)
    await anext(stream)
    await stream.aclose()
    await asyncio.wait_for(cancelled.wait(), 1)
