"""The differential test's corpus: requests `vllm serve` accepts or refuses, for every endpoint
the app serves, and how two answers are compared.

Each case is (method, path, body). Generation cases are greedy (temperature 0) unless
they test sampling with a seed; every one is short, so the corpus runs in minutes.
"""

from __future__ import annotations

import json
from typing import Any

MODEL = "smollm2-135m-instruct"

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "def fibonacci(n):",
    "Translate 'good morning' to Spanish:",
    "Q: What is 12 times 12?\nA:",
]
QUESTIONS = [
    "What is the capital of France? Answer in one sentence.",
    "Name three colours.",
    "Say hello in German.",
    "Is water wet? Answer yes or no.",
    "Give me a JSON object with a key named city.",
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
               "required": ["city", "population"], "additionalProperties": False}

COMPLETION_VARIANTS: list[dict[str, Any]] = [
    {"max_tokens": 12},
    {"max_tokens": 12, "stream": True},
    {"max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}},
    {"max_tokens": 16, "stop": ["\n", "."]},
    {"max_tokens": 16, "stop": [" the"], "stream": True},
    {"max_tokens": 8, "logprobs": 3},
    {"max_tokens": 8, "logprobs": 2, "stream": True},
    {"max_tokens": 6, "echo": True},
    {"max_tokens": 8, "n": 2},
    {"max_tokens": 8, "n": 2, "stream": True},
    {"max_tokens": 10, "presence_penalty": 1.5, "frequency_penalty": 1.0},
    {"max_tokens": 10, "repetition_penalty": 1.3},
    {"max_tokens": 10, "temperature": 0.9, "top_p": 0.9, "seed": 7},
    {"max_tokens": 10, "temperature": 0.7, "top_k": 5, "seed": 11, "stream": True},
    {"max_tokens": 12, "min_tokens": 10, "ignore_eos": True},
    {"max_tokens": 10, "logit_bias": {"28": -100, "30": 5}},
    {"max_tokens": 10, "stop_token_ids": [30]},
    {"max_tokens": 8, "logprobs": None, "repetition_penalty": 1.0, "ignore_eos": True},  # what `vllm bench serve` sends
]
CHAT_VARIANTS: list[dict[str, Any]] = [
    {"max_tokens": 16},
    {"max_completion_tokens": 16, "stream": True, "stream_options": {"include_usage": True}},
    {"max_tokens": 12, "stop": ["."]},
    {"max_tokens": 8, "logprobs": True, "top_logprobs": 2},
    {"max_tokens": 8, "logprobs": True, "top_logprobs": 1, "stream": True},
    {"max_tokens": 8, "n": 2},
    {"max_tokens": 8, "n": 2, "stream": True},
    {"max_tokens": 12, "seed": 3, "temperature": 1.0},
    {"max_tokens": 12, "frequency_penalty": 1.0},
    {"max_tokens": 40, "response_format": {"type": "json_object"}},
    {"max_tokens": 40, "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "city", "schema": CITY_SCHEMA}}},
    {"max_tokens": 30, "tools": [WEATHER_TOOL], "tool_choice": "required"},
    {"max_tokens": 30, "tools": [WEATHER_TOOL],
     "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"max_tokens": 30, "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {
        "name": "get_weather"}}, "stream": True},
    {"max_tokens": 12, "tools": [WEATHER_TOOL], "tool_choice": "none"},
    {"max_tokens": 30, "tools": [WEATHER_TOOL], "tool_choice": "auto"},
    {"max_tokens": 30, "tools": [WEATHER_TOOL], "tool_choice": "auto", "stream": True},
]
BAD: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": -1}),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": -1}),
    ("/v1/completions", {"model": MODEL, "prompt": ""}),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 100}),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 100_000}),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "stop": ""}),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 3000, "max_tokens": 4}),
    ("/v1/completions", {"model": MODEL}),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
    ("/tokenize", {"model": MODEL}),
]


def corpus() -> list[tuple[str, str, dict[str, Any]]]:
    cases: list[tuple[str, str, dict[str, Any]]] = [("GET", "/v1/models", {})]
    for prompt in PROMPTS:
        cases += [("POST", "/v1/completions", {"model": MODEL, "prompt": prompt, "temperature": 0, **variant})
                  for variant in COMPLETION_VARIANTS]
        cases += [("POST", "/tokenize", {"model": MODEL, "prompt": prompt}),
                  ("POST", "/detokenize", {"model": MODEL, "tokens": [504, 3575, 282, 4649, 314]})]
    for question in QUESTIONS:
        messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": question}]
        cases += [("POST", "/v1/chat/completions", {"model": MODEL, "messages": messages, "temperature": 0, **variant})
                  for variant in CHAT_VARIANTS]
        cases += [("POST", "/tokenize", {"model": MODEL, "messages": messages, "add_generation_prompt": True}),
                  ("POST", "/v1/responses", {"model": MODEL, "input": question, "max_output_tokens": 16,
                                             "temperature": 0})]
    cases += [("POST", path, body) for path, body in BAD]
    return cases


VOLATILE = {"id", "created", "created_at", "system_fingerprint", "permission", "root"}
"""Fields that differ between any two servers (or any two runs): left out of the comparison."""


def normalised(value: Any) -> Any:
    """`value` without its volatile fields, at any depth (tool-call ids included)."""
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items() if key not in VOLATILE}
    if isinstance(value, list):
        return [normalised(item) for item in value]
    return value


def stream_summary(text: str) -> dict[str, Any]:
    """A stream as what it says, not how it is chunked: per choice the joined text or
    content, tool-call arguments, reasoning, logprob tokens and finish reason; the usage;
    any error event; whether it ended with `[DONE]`."""
    choices: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {"usage": None, "errors": [], "done": False}
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            summary["done"] = True
            continue
        event = json.loads(data)
        if "error" in event:
            summary["errors"].append(event["error"].get("type"))
            continue
        summary["usage"] = event.get("usage") or summary["usage"]
        for choice in event.get("choices") or []:
            joined = choices.setdefault(choice["index"], {"text": "", "tools": "", "logprobs": [], "finish": None})
            delta = choice.get("delta") or {}
            joined["text"] += choice.get("text") or delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                joined["tools"] += (call.get("function") or {}).get("arguments") or ""
            logprobs = choice.get("logprobs") or {}
            joined["logprobs"] += [entry.get("token") for entry in logprobs.get("content") or []]
            joined["logprobs"] += logprobs.get("tokens") or []
            joined["finish"] = choice.get("finish_reason") or joined["finish"]
    summary["choices"] = [choices[index] for index in sorted(choices)]
    return summary
