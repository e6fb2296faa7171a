"""`generate` through the app's scheduler: choices fan out as vLLM's parallel sampling does,
chunks come back in the output kind vLLM's layer asked for, and failures say what they
should and no more."""

import pytest
from vllm.sampling_params import RequestOutputKind, SamplingParams

from serve_app.engine.base import EngineError, GenerationChunk, not_resumable
from serve_app.openai.errors import APIError
from serve_app.openai.routed_engine import RequestContext, StreamBroken, child_params, request_outputs
from serve_app.scheduling.errors import Overloaded
from serve_app.scheduling.predictor import PromptClass
from serve_app.scheduling.types import RequestMeta


def context() -> RequestContext:
    return RequestContext("m", RequestMeta("realtime", None, PromptClass("chat", None, 1)), backend=None)


async def chunks(*items):
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


def chunk(text: str, token: int, finish: str | None = None) -> GenerationChunk:
    return GenerationChunk(text=text, num_tokens=1, prompt_tokens=2, finish_reason=finish, token_ids=(token,))


async def collected(streams, kind, ctx=None):
    return [output async for output in request_outputs("r", [1, 2], lambda: streams, kind, ctx or context())]


def test_choices_get_their_own_seeds_as_vllms_parallel_sampling_gives_them():
    children = child_params(SamplingParams(n=3, seed=10, max_tokens=4))
    assert [(child.n, child.seed) for child in children] == [(1, 10), (1, 11), (1, 12)]
    unseeded = child_params(SamplingParams(n=2))
    assert [child.seed for child in unseeded] == [None, None]
    one = SamplingParams(n=1)
    assert child_params(one) == [one]


async def test_delta_outputs_carry_each_chunk_and_the_last_one_finishes():
    outputs = await collected([chunks(chunk(" a", 5), chunk(" b", 6, "stop"))], RequestOutputKind.DELTA)
    assert [o.outputs[0].text for o in outputs] == [" a", " b"]
    assert [o.finished for o in outputs] == [False, True] and outputs[-1].outputs[0].finish_reason == "stop"
    assert outputs[0].prompt_token_ids == [1, 2]


async def test_final_only_is_one_output_with_every_choice_whole():
    streams = [chunks(chunk(" a", 5), chunk(" b", 6, "length")), chunks(chunk(" c", 7, "stop"))]
    (output,) = await collected(streams, RequestOutputKind.FINAL_ONLY)
    assert output.finished and [(o.index, o.text, o.token_ids) for o in output.outputs] == [
        (0, " a b", [5, 6]), (1, " c", [7])]


async def test_cumulative_outputs_grow():
    outputs = await collected([chunks(chunk(" a", 5), chunk(" b", 6, "stop"))], RequestOutputKind.CUMULATIVE)
    assert [o.outputs[0].text for o in outputs] == [" a", " a b"]


async def test_a_refusal_before_output_is_kept_for_the_handler_and_one_after_ends_the_stream():
    ctx = context()
    with pytest.raises(APIError):
        await collected([chunks(EngineError("too long", status=400))], RequestOutputKind.DELTA, ctx)
    assert isinstance(ctx.refusal, APIError) and ctx.refusal.status == 400
    ctx = context()
    with pytest.raises(StreamBroken) as info:
        await collected([chunks(chunk(" a", 5), EngineError("lost", status=503))], RequestOutputKind.DELTA, ctx)
    assert ctx.refusal is None and info.value.status_code == 503
    ctx = context()
    with pytest.raises(Overloaded):
        await collected([chunks(Overloaded("full", 1))], RequestOutputKind.DELTA, ctx)
    assert isinstance(ctx.refusal, Overloaded)


async def test_an_unexpected_exception_reaches_the_client_as_its_type_only():
    ctx = context()
    with pytest.raises(APIError) as info:
        await collected([chunks(RuntimeError("/srv/secret.py line 1"))], RequestOutputKind.DELTA, ctx)
    assert info.value.status == 500 and info.value.message == "internal error: RuntimeError"


@pytest.mark.parametrize("fields, reason", [
    ({}, None), ({"temperature": 0.7, "top_p": 0.9, "top_k": 5, "logit_bias": {1: 2.0}, "logprobs": 2}, None),
    ({"seed": 1}, "seed"), ({"frequency_penalty": 0.5}, "penalties"), ({"repetition_penalty": 1.1}, "penalties"),
    ({"min_tokens": 3}, "min_tokens"), ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_which_requests_continue_exactly_on_another_engine(fields, reason):
    found = not_resumable(SamplingParams(**fields))
    assert (found is None) if reason is None else (reason in found)
