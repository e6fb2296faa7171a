"""The output cap the scheduler reads from each of vLLM's request models."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

from serve_app.openai.app_fields import requested_max_tokens

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("request_model", "body", "expected"), [
    (CompletionRequest, {"prompt": "hi", "max_tokens": 7}, 7),
    (ChatCompletionRequest, {"messages": MESSAGES, "max_tokens": 7}, 7),
    (ChatCompletionRequest, {"messages": MESSAGES, "max_tokens": 7, "max_completion_tokens": 5}, 5),
    (ResponsesRequest, {"input": "hi", "max_output_tokens": 9}, 9),
    (ResponsesRequest, {"input": "hi"}, None),
    (ChatCompletionRequest, {"messages": MESSAGES}, None),
])
def test_the_cap_each_endpoint_names_is_the_one_read(request_model, body, expected):
    assert requested_max_tokens(request_model.model_validate({"model": "m", **body})) == expected
