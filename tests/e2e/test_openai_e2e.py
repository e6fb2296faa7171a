"""The shipped local app, on the real SmolLM2 via vLLM CPU, driven by the
official `openai` client and raw HTTP."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from serve_app.config import IngressConfig
from tests.conftest import CAPITAL_QUESTION as CAPITAL
from tests.serve_app.openai.test_adversarial import CLIENT_ERROR_TYPES

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def client(live_app) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_app, api_key="unused", max_retries=0, timeout=120)


def test_models_list(client):
    assert [model.id for model in client.models.list().data] == [MODEL]


def test_chat_greedy_answer_from_the_real_model(client):
    response = client.chat.completions.create(model=MODEL, messages=CAPITAL, temperature=0, max_tokens=20)
    assert "Paris" in response.choices[0].message.content
    assert response.choices[0].finish_reason == "stop"
    usage = response.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 20
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_chat_equals_the_non_streamed_answer(client):
    full = client.chat.completions.create(model=MODEL, messages=CAPITAL, temperature=0, max_tokens=20)
    stream = client.chat.completions.create(
        model=MODEL, messages=CAPITAL, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completion_and_streamed_completion(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8)
    assert "Paris" in full.choices[0].text and full.usage.completion_tokens == 8
    streamed = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == full.choices[0].text


def test_template_is_rendered_server_side(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[], temperature=0, max_tokens=20,
        extra_body={"template": "capital", "params": {"country": "Italy"}},
    )
    assert "Rome" in response.choices[0].message.content


def test_concurrent_requests_all_complete(live_app):
    async def run() -> list[int]:
        client = openai.AsyncOpenAI(base_url=live_app, api_key="unused", max_retries=0, timeout=120)
        responses = await asyncio.gather(
            *(
                client.completions.create(
                    model=MODEL, prompt=f"Count to {n}:", max_tokens=16, extra_body={"ignore_eos": True}
                )
                for n in range(16)
            )
        )
        return [response.usage.completion_tokens for response in responses]

    assert asyncio.run(run()) == [16] * 16


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"model": "no-such-model"}, openai.NotFoundError, "does not exist"),
        ({"max_tokens": -1}, openai.BadRequestError, "max_tokens"),
        ({"max_tokens": 10_000_000}, openai.BadRequestError, "max_model_len=2048"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, openai.BadRequestError, "maximum context length"),
        ({"temperature": "hot"}, openai.BadRequestError, "temperature"),
        ({"extra_body": {"template": "capital", "params": {}}, "messages": []}, openai.BadRequestError, "missing params: country"),
        ({"extra_body": {"template": "nope"}, "messages": []}, openai.BadRequestError, "unknown template 'nope'"),
    ],
)
def test_bad_inputs_get_openai_errors_and_the_server_keeps_serving(client, kwargs, error, needle):
    args = {"model": MODEL, "messages": CAPITAL, "max_tokens": 4, **kwargs}
    with pytest.raises(error, match=needle):
        client.chat.completions.create(**args)
    assert client.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=1).usage.completion_tokens == 1


@pytest.mark.parametrize(
    "content, status, needle",
    [
        (b'{"messages": [', 400, "not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "not valid UTF-8"),
        (b'{"messages": [{"role": "user", "content": "' + b"x" * 1_100_000 + b'"}]}', 413, "exceeds the limit"),
    ],
)
def test_malformed_and_oversized_bodies(live_app, client, content, status, needle):
    response = httpx.post(
        f"{live_app}/chat/completions", content=content, headers={"content-type": "application/json"}, timeout=60
    )
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]
    assert client.models.list().data


def test_large_responses_are_gzipped(live_app):
    # greedy: 300 tokens sampled at temperature 1 are sometimes under gzip_min_bytes
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    gzipped = httpx.post(f"{live_app}/completions", json=body, headers={"accept-encoding": "gzip"}, timeout=120)
    assert len(gzipped.content) >= IngressConfig().gzip_min_bytes, f"the answer is too short to test gzip: {gzipped.content!r}"
    assert gzipped.headers.get("content-encoding") == "gzip"
    assert gzipped.json()["usage"]["completion_tokens"] == 300
    small = httpx.post(
        f"{live_app}/completions", json={**body, "max_tokens": 1}, headers={"accept-encoding": "gzip"}, timeout=60
    )
    assert "content-encoding" not in small.headers


def test_health(live_app):
    assert httpx.get(live_app.removesuffix("/v1") + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize(
    "content, needle",
    [
        (b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests"),
        (b'{"max_tokens": ' + b"9" * 5000 + b', "messages": []}', "digits"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ""}', "stop"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "seed": 99999999999999999999}', "seed"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    ],
)
def test_adversarial_bodies_are_400_through_the_real_proxy(live_app, client, content, needle):
    response = httpx.post(f"{live_app}/chat/completions", content=content,
                          headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] in CLIENT_ERROR_TYPES and needle in (error["message"] + str(error["param"])).lower()
    assert client.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=1).usage.completion_tokens == 1
