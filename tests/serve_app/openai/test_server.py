"""The HTTP surface end to end in-process: the official `openai` client and raw
httpx against the real ingress, replica class and ASGI app, over a fake engine."""

import asyncio
import json

import httpx
import openai
import pytest

from serve_app.config import ApiKeyConfig
from serve_app.scheduling.batcher import ENGINE_PRIORITY_STRIDE
from serve_app.topology import deployment_name
from tests.fakes import FakeEngine, replicas_up, start_ingress
from tests.serve_app.openai.test_adversarial import CLIENT_ERROR_TYPES


@pytest.fixture
async def stack(small_config):
    engines = {model.name: FakeEngine() for model in small_config.models}
    ingress = await start_ingress(
        small_config, {deployment_name(name, "default"): engine for name, engine in engines.items()}
    )
    app = ingress.__serve_build_asgi_app__()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
    yield client, http, engines
    await http.aclose()


async def test_models_list(stack):
    client, _, _ = stack
    models = await client.models.list()
    assert [model.id for model in models.data] == ["fake-a", "fake-b"]


async def test_chat_completion_with_usage_routes_to_the_named_model(stack):
    client, _, engines = stack
    response = await client.chat.completions.create(
        model="fake-b", messages=[{"role": "user", "content": "one two"}], max_tokens=3
    )
    assert response.choices[0].message.content == " w0 w1 w2"
    assert response.choices[0].finish_reason == "length"
    prompt = engines["fake-b"].requests[0].prompt_token_ids  # the chat template applied by vLLM's layer
    assert response.usage.completion_tokens == 3 and response.usage.prompt_tokens == len(prompt) > 3
    assert response.model == "fake-b"
    assert len(engines["fake-b"].requests) == 1 and not engines["fake-a"].requests


async def test_missing_model_uses_the_first(stack):
    _, http, engines = stack
    response = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert response.status_code == 200 and response.json()["model"] == "fake-a"


async def test_streamed_chat_joins_to_the_full_answer(stack):
    client, _, _ = stack
    stream = await client.chat.completions.create(
        model="fake-a",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " w0 w1 w2 w3"
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].choices == []


async def test_streamed_completion(stack):
    client, _, _ = stack
    stream = await client.completions.create(model="fake-a", prompt="a b", max_tokens=2, stream=True)
    texts = [chunk.choices[0].text async for chunk in stream]
    assert texts == [" w0", " w1"]


async def test_template_instead_of_prompt(stack):
    client, http, engines = stack
    await client.chat.completions.create(
        model="fake-a",
        messages=[],
        max_tokens=1,
        extra_body={"template": "summarize", "params": {"topic": "cats", "text": "meow"}},
    )
    prompt = engines["fake-a"].requests[-1].prompt_token_ids
    text = (await http.post("/detokenize", json={"model": "fake-a", "tokens": list(prompt)})).json()["prompt"]
    assert "system\nBe brief about cats.<|im_end|>" in text and "user\nSummarize: meow<|im_end|>" in text


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, 400, "max_model_len=128"),
        ({"messages": [{"role": "user", "content": "x " * 100}]}, 400, "maximum context length is 128 tokens"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": [], "template": "nope"}, 400, "unknown template 'nope'"),
        ({"messages": [], "template": "capital", "params": {}}, 400, "missing params: country"),
    ],
)
async def test_bad_requests_get_openai_errors(stack, body, status, needle):
    _, http, _ = stack
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["type"] in CLIENT_ERROR_TYPES


async def test_unknown_fields_are_ignored_as_vllm_serve_ignores_them(stack):
    _, http, _ = stack
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "temprature": 1}
    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200


async def test_openai_client_raises_typed_errors(stack):
    client, _, _ = stack
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="max_model_len=128"):
        await client.chat.completions.create(
            model="fake-a", messages=[{"role": "user", "content": "x"}], max_tokens=1000, stream=True
        )


@pytest.mark.parametrize(
    "content, needle",
    [(b"{not json", "not valid JSON"), (b'{"prompt": "\xff"}', "not valid UTF-8"), (b"[1, 2]", "JSON object")],
)
async def test_malformed_bodies(stack, content, needle):
    _, http, _ = stack
    response = await http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400 and needle in response.json()["error"]["message"]


async def test_body_over_the_limit_is_413_declared_or_not(stack):
    _, http, _ = stack
    big = json.dumps({"prompt": "x" * 5000}).encode()
    response = await http.post("/v1/completions", content=big)
    assert response.status_code == 413 and "4096 bytes" in response.json()["error"]["message"]

    async def chunked():
        yield big

    response = await http.post("/v1/completions", content=chunked())
    assert response.status_code == 413


async def test_unknown_route_and_wrong_method_are_openai_errors(stack):
    _, http, _ = stack
    assert (await http.get("/v1/nothing")).json()["error"]["message"] == "Not Found"
    assert (await http.get("/v1/chat/completions")).status_code == 405


async def test_large_responses_are_gzipped_small_ones_not(small_config, stack):
    _, http, _ = stack
    threshold = small_config.ingress.gzip_min_bytes
    large_body, small_body = {"prompt": "a", "max_tokens": 100}, {"prompt": "a", "max_tokens": 1}
    plain = {"accept-encoding": "identity"}
    large_raw = await http.post("/v1/completions", json=large_body, headers=plain)
    small_raw = await http.post("/v1/completions", json=small_body, headers=plain)
    assert "content-encoding" not in large_raw.headers
    assert len(small_raw.content) < threshold <= len(large_raw.content)

    large = await http.post("/v1/completions", json=large_body, headers={"accept-encoding": "gzip"})
    assert large.headers["content-encoding"] == "gzip"
    assert int(large.headers["content-length"]) < len(large_raw.content)
    assert large.json()["usage"]["completion_tokens"] == 100  # httpx decodes it transparently
    small = await http.post("/v1/completions", json=small_body, headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in small.headers


async def test_streams_are_never_gzipped(stack):
    _, http, _ = stack
    body = {"prompt": "a", "max_tokens": 60, "stream": True}
    response = await http.post("/v1/completions", json=body, headers={"accept-encoding": "gzip"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in response.headers


async def test_replica_failure_mid_stream_is_an_error_event_and_the_server_keeps_serving(small_config, stack):
    client, http, engines = stack
    engines["fake-a"].fail_after = 2
    response = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": True})
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert '"text":" w1"' in events[1]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["error"]["message"].startswith("model 'fake-a' failed")
    engines["fake-a"].fail_after = None
    answer = await client.completions.create(model="fake-a", prompt="a", max_tokens=1)
    assert answer.choices[0].text == " w0"


async def test_replica_failure_before_output_is_a_500(stack):
    _, http, engines = stack
    engines["fake-a"].fail_after = 0
    response = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 5})
    assert response.status_code == 500 and "RuntimeError" in response.json()["error"]["message"]


async def test_a_client_that_leaves_before_the_answer_gets_nothing_and_its_work_is_cancelled(small_config):
    engine = FakeEngine(max_model_len=64, step_s=0.05)
    ingress = await start_ingress(small_config, {deployment_name("fake-a", "default"): engine,
                                                 deployment_name("fake-b", "default"): FakeEngine()})
    body = json.dumps({"model": "fake-a", "prompt": "a", "max_tokens": 60}).encode()
    sent, received = [], [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if received:
            return received.pop()
        await asyncio.sleep(0.3)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("test", 80)}
    async with asyncio.timeout(2):  # 60 tokens take 3 s
        await ingress.__serve_build_asgi_app__()(scope, receive, send)  # raises if the handler failed
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]
    await asyncio.sleep(0.1)
    assert (await ingress.stats())["pools"]["fake-a/default"]["in_flight"] == 0 and len(engine.requests) == 1


async def test_health(stack):
    _, http, _ = stack
    assert (await http.get("/health")).json() == {"status": "ok"}


@pytest.fixture
async def keyed_stack(small_config):
    from serve_app.openai.auth import key_digest

    ingress_config = small_config.ingress.model_copy(
        update={"api_keys": [ApiKeyConfig(name="team", sha256=key_digest("sk-team"))]}
    )
    config = small_config.model_copy(update={"ingress": ingress_config})
    engines = {deployment_name(model.name, "default"): FakeEngine() for model in config.models}
    ingress = await start_ingress(config, engines)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=ingress.__serve_build_asgi_app__()), base_url="http://t")
    yield http, engines
    await http.aclose()


async def test_without_a_valid_key_nothing_reaches_a_replica(keyed_stack):
    http, engines = keyed_stack
    body = {"prompt": "a", "max_tokens": 1}
    for headers in ({}, {"authorization": "Bearer sk-other"}):
        response = await http.post("/v1/completions", json=body, headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert (await http.get("/v1/models", headers=headers)).status_code == 401
    assert not any(engine.requests for engine in engines.values())
    client = openai.AsyncOpenAI(base_url="http://t/v1", api_key="sk-team", http_client=http, max_retries=0)
    answer = await client.completions.create(model="fake-a", prompt="a", max_tokens=1)
    assert answer.choices[0].text == " w0"
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url="http://t/v1", api_key="bad", http_client=http).models.list()


async def test_priority_from_field_or_header_reaches_the_engine(stack):
    _, http, engines = stack
    await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "priority": "batch"})
    await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers={"x-priority": "batch"})
    await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    # the class first, then the predicted length (here max_tokens, 1)
    assert [r.priority for r in engines["fake-a"].requests] == [ENGINE_PRIORITY_STRIDE + 1] * 2 + [1]
    bad = await http.post("/v1/completions", json={"prompt": "a"}, headers={"x-priority": "urgent"})
    assert bad.status_code == 400 and "X-Priority" in bad.json()["error"]["message"]


async def test_stats_show_pools_and_learned_classes(stack):
    client, http, engines = stack
    engines["fake-a"].answer_tokens = 1  # ends by itself: learned (one cut at max_tokens is not)
    await client.chat.completions.create(model="fake-a", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    stats = (await http.get("/stats")).json()
    pool = stats["pools"]["fake-a/default"]
    assert pool["slots"] == 64 and pool["waiting"] == 0 and pool["queue_wait_p50_s"] is not None
    assert stats["predictor_classes"] == {"fp:*": 1}  # instruction fingerprints, summed


async def test_cost_endpoint_meters_replicas_and_attributes_requests(small_config):
    from serve_app.config import PriceTable

    prices = PriceTable.model_validate({"replicas": {
        name: {"instance_type": "m7i.2xlarge", "vcpus_per_replica": 1} for name in ("fake-a", "fake-b")
    }})
    config = small_config.model_copy(update={"cost": prices})
    engines = {deployment_name(model.name, "default"): FakeEngine() for model in config.models}
    ingress = await start_ingress(config, engines)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ingress.__serve_build_asgi_app__()), base_url="http://t") as http:
        await http.post("/v1/completions", json={"model": "fake-a", "prompt": "a b", "max_tokens": 3})
        cost = (await http.get("/v1/cost")).json()
    assert cost["by_model"]["fake-a"]["requests"] == 1 and cost["by_model"]["fake-a"]["output_tokens"] == 3
    assert cost["replica_hours_by_capacity_type"]["any"] > 0 and "fake-b" in cost["by_model"]


async def test_cost_endpoint_says_when_accounting_is_off(stack):
    _, http, _ = stack
    response = await http.get("/v1/cost")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_configured"


async def test_ready_reflects_the_pools_and_health_only_the_ingress(stack):
    _, http, _ = stack
    ready = await http.get("/ready")
    assert ready.status_code == 200 and ready.json()["models"]["fake-a"]["pools"]["default"]["slots"] == 64
    assert (await http.get("/health")).json() == {"status": "ok"}


async def test_ready_is_503_when_a_model_has_no_replica_and_its_requests_are_refused(small_config):
    from deployments.pool_client import DeploymentState
    from serve_app.topology import deployment_name

    ingress = await start_ingress(small_config, {deployment_name(m.name, "default"): FakeEngine()
                                                  for m in small_config.models})
    down = deployment_name("fake-b", "default")
    ingress._poller.cancel()  # keep the poll from undoing the state below
    ingress._client.set_states({deployment_name("fake-a", "default"): replicas_up(1),
                                down: DeploymentState(status="DEPLOY_FAILED", message="engine refused")})
    ingress._batcher.set_slots("fake-b", "default", 0, ingress._client.down_reason("fake-b", "default"))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=ingress.__serve_build_asgi_app__()), base_url="http://t")
    ready = await http.get("/ready")
    body = ready.json()
    assert ready.status_code == 503 and not body["ready"] and body["models"]["fake-a"]["ready"]
    assert body["models"]["fake-b"]["pools"]["default"]["slots"] == 0
    refused = await http.post("/v1/completions", json={"model": "fake-b", "prompt": "x"})
    message = refused.json()["error"]["message"]
    assert refused.status_code == 503 and "DEPLOY_FAILED" in message and "engine refused" not in message
    assert refused.json()["error"]["code"] == "unavailable" and "retry-after" in refused.headers
