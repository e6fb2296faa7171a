"""The app is a drop-in for `vllm serve`: one corpus of requests (`dropin_corpus`) sent to
both, same model and engine settings, answers compared field by field (ids and times
aside), greedy ones token for token; then the field's own tools against the app."""

from __future__ import annotations

import argparse
import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from benchmarks.servers import VLLMServer
from benchmarks.systems import first_app
from tests.conftest import REPO
from tests.e2e.dropin_corpus import MODEL, WEATHER_TOOL, corpus, normalised, stream_summary

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def vllm_serve():
    """`vllm serve` with the engine settings of configs/local.yaml's model, beside the app."""
    (model,) = first_app(REPO / "configs" / "local.yaml").models
    with VLLMServer(model, cwd=REPO) as server:
        yield server.base_url


def comparable(response: httpx.Response) -> dict:
    """What a response says: its status, and its body without volatile fields (a stream
    summarised; an error by its type and param, which say what it means)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return {"status": response.status_code, "stream": normalised(stream_summary(response.text))}
    body = response.json()
    if "error" in body:
        return {"status": response.status_code, "error": {"type": body["error"]["type"]}}
    return {"status": response.status_code, "body": normalised(body)}


def test_every_request_answers_as_vllm_serve_answers_it(live_app, vllm_serve):
    cases = corpus()
    assert len(cases) >= 200
    differing = []
    with httpx.Client(timeout=120) as http:
        for method, path, body in cases:
            answers = [comparable(http.request(method, base.removesuffix("/v1") + path, json=body or None))
                       for base in (vllm_serve, live_app)]
            if answers[0] != answers[1]:
                differing.append((path, json.dumps(body)[:160], *(json.dumps(a)[:600] for a in answers)))
    print(f"\n[drop-in] {len(cases)} requests, {len(differing)} differing")
    for path, body, expected, got in differing[:8]:
        print(f"  {path} {body}\n    vllm serve: {expected}\n    app:        {got}")
    assert not differing


def test_vllm_bench_serve_runs_unchanged_against_the_app(live_app):
    """The field's load generator, both of its OpenAI backends, its default requests."""
    from vllm.benchmarks.serve import add_cli_args, main

    for backend, endpoint in (("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")):
        parser = argparse.ArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args([
            "--backend", backend, "--base-url", live_app.removesuffix("/v1"), "--endpoint", endpoint,
            "--model", MODEL, "--tokenizer", str(REPO / "models" / "SmolLM2-135M-Instruct"),
            "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
            "--num-prompts", "16", "--max-concurrency", "4", "--seed", "0", "--disable-tqdm"])
        result = main(args)
        assert result["completed"] == 16 and result.get("failed", 0) == 0, (backend, result)


class Colour(BaseModel):
    """A schema whose every answer is short (a free string may run to `max_tokens`)."""

    colour: Literal["red", "green", "blue"]
    bright: bool


def test_the_openai_sdk_works_end_to_end(live_app):
    client = openai.OpenAI(base_url=live_app, api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=150,
                                            temperature=0, tool_choice="required")
    assert called.choices[0].message.tool_calls, called.model_dump_json()
    call = called.choices[0].message.tool_calls[0]
    json.loads(call.function.arguments)  # JSON (what it holds is the 135M model's choice)
    assert call.function.name == "get_weather" and call.id
    messages += [called.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=30)
    assert answer.choices[0].message.content

    parsed = client.chat.completions.parse(model=MODEL, max_tokens=60, response_format=Colour, temperature=0,
                                           messages=[{"role": "user", "content": "Pick a colour, as JSON."}])
    assert isinstance(parsed.choices[0].message.parsed, Colour)

    scored = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, logprobs=2, temperature=0)
    assert len(scored.choices[0].logprobs.tokens) == 4 and all(len(t) == 2 for t in scored.choices[0].logprobs.top_logprobs)

    two = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=5)
    assert [choice.index for choice in two.choices] == [0, 1]
    streamed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                              max_tokens=5, stream=True)
    assert {choice.index for chunk in streamed for choice in chunk.choices} == {0, 1}
