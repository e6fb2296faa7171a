import pytest
from pydantic import ValidationError

from serve_app.config import TemplateConfig
from serve_app.engine.base import EngineRequestError, GenerationChunk, GenerationRequest, SamplingOptions, output_budget
from serve_app.openai.conversion import chat_generation_request, completion_generation_request, completion_sse
from serve_app.openai.errors import APIError
from serve_app.openai.protocol import ChatCompletionRequest, CompletionRequest
from serve_app.openai.templates import TemplateRegistry

TEMPLATES = TemplateRegistry(
    {"capital": TemplateConfig(system="Be brief.", prompt="Capital of {country}?")}
)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_chat_messages_become_role_content_pairs_with_sampling():
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            "max_completion_tokens": 7,
            "temperature": 0,
            "stop": "END",
            "seed": 3,
        }
    )
    generation = chat_generation_request(request, TEMPLATES, "id-1")
    assert generation.messages == (("system", "sys"), ("user", "ab"))
    assert generation.prompt is None
    assert generation.sampling == SamplingOptions(max_tokens=7, temperature=0, stop=("END",), seed=3)


def test_chat_template_renders_system_and_user_messages():
    request = ChatCompletionRequest.model_validate({"template": "capital", "params": {"country": "Peru"}})
    generation = chat_generation_request(request, TEMPLATES, "id-2")
    assert generation.messages == (("system", "Be brief."), ("user", "Capital of Peru?"))


def test_completion_template_prefixes_system_text():
    request = CompletionRequest.model_validate({"template": "capital", "params": {"country": "Peru"}})
    generation = completion_generation_request(request, TEMPLATES, "id-3")
    assert generation.prompt == "Be brief.\n\nCapital of Peru?"
    assert generation.sampling.max_tokens == 16  # OpenAI's completions default


def test_template_errors_are_400_naming_the_param():
    request = ChatCompletionRequest.model_validate({"template": "capital", "params": {}})
    with pytest.raises(APIError) as info:
        chat_generation_request(request, TEMPLATES, "id")
    assert info.value.status == 400 and info.value.param == "params"


@pytest.mark.parametrize(
    "fields, where",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"messages": []}, "send messages"),
        ({"template": "capital"}, "not both"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ],
)
def test_invalid_chat_requests_fail_naming_the_field(fields, where):
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert where in str(APIError.from_validation(info.value))


def test_batched_completion_prompts_are_refused_but_a_single_list_item_is_fine():
    assert CompletionRequest.model_validate({"prompt": ["one"]}).prompt == "one"
    with pytest.raises(ValidationError, match="one prompt per request"):
        CompletionRequest.model_validate({"prompt": ["one", "two"]})


def test_output_budget_fills_the_context_or_refuses():
    assert output_budget(10, None, 64) == 54
    assert output_budget(10, 54, 64) == 54
    with pytest.raises(EngineRequestError, match="at most 54") as info:
        output_budget(10, 55, 64)
    assert info.value.error.param == "max_tokens"
    with pytest.raises(EngineRequestError, match="no room for output"):
        output_budget(64, None, 64)


def test_generation_request_needs_exactly_one_prompt_source():
    with pytest.raises(ValueError):
        GenerationRequest(request_id="x", sampling=SamplingOptions())
    with pytest.raises(ValueError):
        GenerationRequest(request_id="x", sampling=SamplingOptions(), prompt="a", messages=(("user", "b"),))


async def _chunks():
    yield GenerationChunk(text="a", num_tokens=1, prompt_tokens=3)
    yield GenerationChunk(text="b", num_tokens=2, prompt_tokens=3, finish_reason="stop")


async def test_completion_sse_ends_with_usage_then_done():
    events = [event async for event in completion_sse("cmpl-1", "m", _chunks(), include_usage=True)]
    assert events[-1] == "data: [DONE]\n\n"
    assert '"text":"a"' in events[0] and '"finish_reason":"stop"' in events[1]
    assert '"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}' in events[2]
