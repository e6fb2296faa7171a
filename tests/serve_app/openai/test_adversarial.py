"""Hostile and malformed requests: each gets an OpenAI-shaped 4xx (never a 500),
and the server answers a normal request right after."""

import asyncio
import json
import threading

import httpx
import pytest

from serve_app.config import ApiKeyConfig, IngressConfig, PriceTable
from serve_app.engine.base import EngineError, EngineRequestError, GenerationChunk
from serve_app.openai.auth import key_digest
from serve_app.openai.server import build_openai_app
from serve_app.topology import deployment_name
from tests.fakes import FakeEngine, frontends_of, start_ingress

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER_HI = [{"role": "user", "content": "hi"}]
LIMITS = {
    "max_body_bytes": 1_048_576,
    "body_read_timeout_s": 0.3,
    "max_messages": 8,
    "max_stop_chars": 16,
    "max_error_chars": 2048,
}


class RefusingEngine(FakeEngine):
    """Refuses its next request before any output, as vLLM does bad sampling params."""

    def __init__(self) -> None:
        super().__init__(max_model_len=64)
        self.refusal: EngineError | None = None

    async def stream(self, request):
        if self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            raise EngineRequestError(refusal)
        async for chunk in super().stream(request):
            yield chunk


def configured(config, **ingress):
    merged = IngressConfig.model_validate({**config.ingress.model_dump(), **LIMITS, **ingress})
    return config.model_copy(update={"ingress": merged})


async def serve(config, engine_type=FakeEngine):
    engines = {deployment_name(model.name, "default"): engine_type() for model in config.models}
    ingress = await start_ingress(config, engines)
    transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__(), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test"), engines, ingress


@pytest.fixture
async def stack(small_config):
    http, engines, _ = await serve(configured(small_config))
    yield http, engines
    await http.aclose()


CLIENT_ERROR_TYPES = {"invalid_request_error", "BadRequestError", "Bad Request", "NotFoundError"}
"""The app's own 4xx type (OpenAI's), and those of vLLM's layer (as `vllm serve` answers)."""


def assert_error(response, status, *, param=None, code=None, needle=None):
    """An OpenAI error body with `status`; `param`/`code`/`needle` checked when given."""
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    if 400 <= status < 500 and status not in (401, 429):
        assert error["type"] in CLIENT_ERROR_TYPES
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    if needle is not None:
        assert needle in error["message"]
    return error


async def assert_serving(http, headers=None):
    response = await http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 2}, headers=headers)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == " w0 w1"


async def post_raw(http, path, text: str):
    return await http.post(path, content=text.encode(), headers={"content-type": "application/json"})


# --- 1. bodies Python's json and the tokenizers choke on -------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"prompt": "a", "params": {"x": ' + "[" * 5000 + "]" * 5000 + "}}",
        '{"prompt": "a", "user": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}",
    ],
    ids=["unclosed-arrays", "deep-arrays", "deep-objects"],
)
async def test_json_nested_too_deeply_is_400(stack, text):
    http, _ = stack
    assert_error(await post_raw(http, COMPLETIONS, text), 400, code="invalid_json", needle="nest")
    await assert_serving(http)


async def test_json_nested_just_parsable_is_a_validation_400(stack):
    http, _ = stack
    text = '{"prompt": "a", "params": {"x": ' + "[" * 800 + "]" * 800 + "}}"
    assert_error(await post_raw(http, COMPLETIONS, text), 400, param="params")
    await assert_serving(http)


@pytest.mark.parametrize("where", ["max_tokens", "params"])
async def test_integer_literal_over_the_conversion_limit_is_400(stack, where):
    http, _ = stack
    huge = "9" * 5000
    value = huge if where == "max_tokens" else '{"n": ' + huge + "}"
    text = f'{{"prompt": "a", "{where}": {value}}}'
    error = assert_error(await post_raw(http, COMPLETIONS, text), 400, code="invalid_json", needle="longer than 4300 digits")
    assert "set_int_max_str_digits" not in error["message"]
    await assert_serving(http)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_non_json_number_constants_are_400(stack, literal):
    http, _ = stack
    text = f'{{"prompt": "a", "temperature": {literal}}}'
    assert_error(await post_raw(http, COMPLETIONS, text), 400, code="invalid_json", needle=literal)
    await assert_serving(http)


@pytest.mark.parametrize(
    "path, text, param",
    [
        (CHAT, '{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}', "model"),
        (CHAT, '{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages.0.content"),
        (
            CHAT,
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
            "messages.0.content.0.text",
        ),
        (COMPLETIONS, '{"prompt": "x\\ud800"}', "prompt"),
        (COMPLETIONS, '{"prompt": ["\\udc00"]}', "prompt.0"),
        (COMPLETIONS, '{"prompt": "x", "\\ud800": 1}', "\\ud800"),
        (COMPLETIONS, '{"template": "capital", "params": {"country": "\\ud800"}}', "params.country"),
    ],
)
async def test_lone_surrogates_are_400_naming_the_field(stack, path, text, param):
    http, engines = stack
    error = assert_error(await post_raw(http, path, text), 400, param=param, code="invalid_unicode")
    assert "surrogate" in error["message"]
    assert not any(engine.requests for engine in engines.values())
    await assert_serving(http)


async def test_surrogate_pairs_are_fine(stack):
    http, _ = stack
    response = await post_raw(http, COMPLETIONS, '{"prompt": "smile \\ud83d\\ude00", "max_tokens": 1}')
    assert response.status_code == 200


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stop", ["", ["END", ""]])
async def test_empty_stop_strings_are_400(stack, path, stop):
    http, _ = stack
    body = {"messages": USER_HI} if path == CHAT else {"prompt": "a"}
    assert_error(await http.post(path, json={**body, "stop": stop}), 400, needle="empty")
    await assert_serving(http)


@pytest.mark.parametrize(
    "field, value",
    [("seed", 2**63), ("seed", -(2**63) - 1), ("seed", 10**30), ("top_k", -2)],
)
async def test_seed_and_top_k_outside_their_range_are_400_naming_the_field(stack, field, value):
    http, engines = stack
    assert_error(await http.post(COMPLETIONS, json={"prompt": "a", field: value}), 400, needle=field)
    assert not any(engine.requests for engine in engines.values())
    await assert_serving(http)


async def test_int64_edges_are_accepted(stack):
    http, _ = stack
    for body in ({"seed": 2**63 - 1}, {"seed": -(2**63)}, {"top_k": 2**63 - 1}):
        response = await http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 1, **body})
        assert response.status_code == 200, response.text


# --- 2. bounds ---------------------------------------------------------------------


async def test_at_most_four_stop_strings(stack):
    http, _ = stack
    ok = await http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 1, "stop": ["a", "b", "c", "d"]})
    assert ok.status_code == 200
    response = await http.post(COMPLETIONS, json={"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})
    assert_error(response, 400, param="stop", needle="at most 4")
    await assert_serving(http)


@pytest.mark.parametrize("stop", ["x" * 17, ["ok", "y" * 17]])
async def test_stop_strings_over_the_length_limit_are_400(stack, stop):
    http, _ = stack
    response = await http.post(COMPLETIONS, json={"prompt": "a", "stop": stop})
    assert_error(response, 400, param="stop", needle="16 characters")
    await assert_serving(http)


async def test_too_many_chat_messages_is_400(stack):
    http, engines = stack
    ok = await http.post(CHAT, json={"messages": USER_HI * 8, "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    response = await http.post(CHAT, json={"messages": USER_HI * 9})
    assert_error(response, 400, param="messages", needle="at most 8")
    assert len(engines[deployment_name("fake-a", "default")].requests) == 1
    await assert_serving(http)


async def test_validation_errors_of_a_huge_body_are_truncated(stack):
    http, _ = stack
    body = json.dumps({"messages": [{"role": "nobody", "content": 1}] * 20_000})
    assert len(body) > 500_000
    response = await post_raw(http, CHAT, body)
    error = assert_error(response, 400)
    assert len(error["message"]) <= LIMITS["max_error_chars"] and len(response.content) < 3 * LIMITS["max_error_chars"]
    assert error["param"].startswith("messages.0") and error["message"].startswith("460000 validation errors")
    await assert_serving(http)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m" * 100_000, "prompt": "a"}, "model"),
        ({"prompt": "a", "template": "t" * 100_000}, "template"),
    ],
    ids=["long-model-name", "long-template-name"],
)
async def test_any_error_message_and_param_is_capped(stack, body, param):
    http, _ = stack
    response = await http.post(COMPLETIONS, json=body)
    assert response.status_code in (400, 404) and len(response.content) < 3 * LIMITS["max_error_chars"]
    error = assert_error(response, response.status_code)
    assert len(error["message"]) <= LIMITS["max_error_chars"] and error["param"].startswith(param)
    assert len(error["param"]) <= LIMITS["max_error_chars"]
    await assert_serving(http)


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, {"prompt": "a", "max_tokens": 129}, "max_tokens"),
        (CHAT, {"messages": USER_HI, "max_tokens": 10**12}, "max_tokens"),
        (CHAT, {"messages": USER_HI, "max_completion_tokens": 1000}, "max_completion_tokens"),
    ],
)
async def test_max_tokens_over_the_configured_context_is_refused_at_the_ingress(stack, path, body, param):
    http, engines = stack
    error = assert_error(await http.post(path, json=body), 400, param=param)
    assert "max_model_len=128" in error["message"]
    assert not any(engine.requests for engine in engines.values())
    await assert_serving(http)


async def test_without_a_configured_context_the_replica_still_checks(small_config):
    models = [model.model_copy(update={"engine": model.engine.model_copy(update={"max_model_len": None})})
              for model in small_config.models]
    http, engines, _ = await serve(configured(small_config.model_copy(update={"models": models})))
    async with http:
        response = await http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 129})
        assert_error(response, 400, param="max_tokens", code="context_length_exceeded")
        assert engines[deployment_name("fake-a", "default")].requests  # the replica refused it
        await assert_serving(http)


# --- 3. slow bodies ----------------------------------------------------------------


async def test_a_trickling_body_gets_408_at_the_read_deadline(small_config):
    http, _, ingress = await serve(configured(small_config))
    app = ingress.__serve_build_asgi_app__()
    remaining = bytearray(json.dumps({"prompt": "a" * 100, "max_tokens": 1}).encode())
    sent = []

    async def trickle():
        """A byte every 50 ms: ~6 s for the whole body; the deadline is 0.3 s."""
        await asyncio.sleep(0.05)
        if not remaining:
            return {"type": "http.disconnect"}
        part = bytes(remaining[:1])
        del remaining[:1]
        return {"type": "http.request", "body": part, "more_body": bool(remaining)}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": COMPLETIONS, "raw_path": COMPLETIONS.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1234), "server": ("test", 80),
    }
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(10):
        await app(scope, trickle, send)
    assert asyncio.get_running_loop().time() - started < 2
    start = next(message for message in sent if message["type"] == "http.response.start")
    payload = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    assert start["status"] == 408
    error = json.loads(payload)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "request_timeout"
    assert "0.3" in error["message"]
    async with http:
        await assert_serving(http)


# --- 4. the API schema with keys on ------------------------------------------------


@pytest.fixture
async def keyed(small_config):
    config = configured(small_config, api_keys=[ApiKeyConfig(name="team", sha256=key_digest("sk-team"))])
    http, _, _ = await serve(config)
    yield http
    await http.aclose()


async def test_openapi_schema_needs_the_key_when_keys_are_configured(keyed):
    http = keyed
    key = {"authorization": "Bearer sk-team"}
    for headers in ({}, {"authorization": "Bearer sk-other"}):
        assert_error(await http.get("/openapi.json", headers=headers), 401, code="invalid_api_key")
    schema = await http.get("/openapi.json", headers=key)
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]
    for path in ("/docs", "/redoc"):
        assert (await http.get(path, headers=key)).status_code == 404
    assert (await http.get("/health")).json() == {"status": "ok"}
    await assert_serving(http, headers=key)


async def test_openapi_schema_is_open_without_keys(stack):
    http, _ = stack
    assert (await http.get("/openapi.json")).status_code == 200


# --- 5. operator endpoints run on the event loop -----------------------------------


async def test_stats_and_cost_run_on_the_event_loop_and_keep_auth(small_config):
    prices = PriceTable.model_validate({"replicas": {
        name: {"instance_type": "m7i.2xlarge", "vcpus_per_replica": 1} for name in ("fake-a", "fake-b")
    }})
    config = configured(small_config, api_keys=[ApiKeyConfig(name="team", sha256=key_digest("sk-team"))])
    http, _, ingress = await serve(config.model_copy(update={"cost": prices}))
    threads = []
    report, stats = ingress.cost, ingress.stats

    def cost():
        threads.append(threading.get_ident())
        return report()

    async def spied_stats():
        threads.append(threading.get_ident())
        return await stats()

    ingress.cost, ingress.stats = cost, spied_stats  # the app calls its backend's methods per request
    async with http:
        key = {"authorization": "Bearer sk-team"}
        for path in ("/v1/cost", "/stats"):
            assert_error(await http.get(path), 401, code="invalid_api_key")
            assert (await http.get(path, headers=key)).status_code == 200
        await assert_serving(http, headers=key)
    assert threads == [threading.get_ident()] * 2


# --- 6. engine refusals before output ----------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_engine_refusal_before_output_is_400_with_its_message(small_config, path, stream):
    http, engines, _ = await serve(configured(small_config), RefusingEngine)
    body = {"messages": USER_HI} if path == CHAT else {"prompt": "a"}
    async with http:
        engines[deployment_name("fake-a", "default")].refusal = EngineError("top_k must be -1 (disable) or at least 1, got 0.", param="top_k")
        response = await http.post(path, json={**body, "max_tokens": 2, "stream": stream})
        assert_error(response, 400, param="top_k", needle="top_k must be -1")
        engines[deployment_name("fake-a", "default")].refusal = EngineError("chat template error: unknown role", code="invalid_template")
        response = await http.post(path, json={**body, "max_tokens": 2, "stream": stream})
        assert_error(response, 400, code="invalid_template", needle="chat template error")
        await assert_serving(http)


class ExplodingBackend:
    """A backend that fails the way a bug would: an exception with a traceback in its text."""

    SECRET = 'Traceback (most recent call last):\n  File "/srv/secret.py", line 1'

    def __init__(self) -> None:
        self.explode = True

    async def stream(self, model, request, meta):
        if self.explode:
            raise RuntimeError(self.SECRET)
        yield GenerationChunk(text=" ok", num_tokens=1, prompt_tokens=1, finish_reason="stop", token_ids=(1,))

    async def stats(self):
        return {}

    def cost(self):
        return {}

    def admit(self, client):
        return None

    def route(self, model, meta, max_tokens):
        return model


@pytest.mark.parametrize("stream", [False, True])
async def test_unexpected_errors_are_500_without_traceback_text(small_config, stream):
    backend = ExplodingBackend()
    app = build_openai_app(configured(small_config), backend, await frontends_of(small_config))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.post(COMPLETIONS, json={"prompt": "a", "stream": stream})
        error = assert_error(response, 500)
        assert error["message"] == "internal error: RuntimeError" and "secret" not in response.text
        backend.explode = False
        ok = await http.post(COMPLETIONS, json={"prompt": "a"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == " ok"
