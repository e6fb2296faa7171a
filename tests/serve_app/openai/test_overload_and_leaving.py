"""Overload and clients that leave, in-process over raw ASGI: a key over its request
rate is refused before its body is read, bodies read at once are bounded, a client
that leaves mid-body or before a stream's first chunk is a 499 with nothing left
running, and `/ready` keeps its detail (never Serve's messages) to a valid key."""

import asyncio
import json

import httpx
import pytest

from deployments.pool_client import DeploymentState
from serve_app.config import ApiKeyConfig, IngressConfig
from serve_app.openai.auth import key_digest
from serve_app.topology import deployment_name
from tests.fakes import FakeEngine, replicas_up, start_ingress

COMPLETIONS = "/v1/completions"
BODY = json.dumps({"model": "fake-a", "prompt": "a", "max_tokens": 2}).encode()
STREAM_HEADERS = [(b"x-request-disconnect-disabled", b"?1")]
"""What a client sends Serve's proxy so it stops watching for the disconnect itself."""


def with_ingress(config, **ingress):
    merged = IngressConfig.model_validate({**config.ingress.model_dump(), **ingress})
    return config.model_copy(update={"ingress": merged})


async def ingress_over(config, **engines):
    engines = {deployment_name(m.name, "default"): engines.get(m.name.replace("-", "_"), FakeEngine())
               for m in config.models}
    return await start_ingress(config, engines)


class Client:
    """One raw ASGI request: `parts` of its body are handed out in turn (the last
    ends it if `complete`); then `receive` waits for `leave` and reports the disconnect."""

    def __init__(self, parts: list[bytes], headers: list[tuple[bytes, bytes]] = (), complete: bool = True) -> None:
        self.parts = list(parts)
        self.complete = complete
        self.headers = [(b"content-type", b"application/json"), *headers]
        self.leave = asyncio.Event()
        self.receives = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        self.receives += 1
        if self.parts:
            part = self.parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(self.parts) or not self.complete}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def call(self, app, path: str = COMPLETIONS) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": self.headers, "client": ("127.0.0.1", 1), "server": ("test", 80)}
        await app(scope, self.receive, self.send)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    def header(self, name: bytes) -> bytes | None:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"]).get(name)

    def json(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"))


async def until(condition, timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_key_over_its_request_rate_is_429_before_its_body_is_read(small_config):
    config = with_ingress(small_config, api_keys=[
        ApiKeyConfig(name="team", sha256=key_digest("sk-team"), requests_per_s=2)])
    app = (await ingress_over(config)).__serve_build_asgi_app__()
    key = [(b"authorization", b"Bearer sk-team")]
    for _ in range(2):  # the burst of 2, each charged once (not again when its tokens are)
        ok = Client([BODY], key)
        await ok.call(app)
        assert ok.status == 200
    stalled = Client([], key, complete=False)  # its body never comes
    async with asyncio.timeout(1):
        await stalled.call(app)
    assert stalled.status == 429 and stalled.header(b"retry-after") == b"1"
    assert stalled.json()["error"]["code"] == "rate_limit_exceeded" and stalled.receives == 0


async def test_past_max_body_reads_a_request_is_503_at_once_and_the_server_then_serves(small_config):
    app = (await ingress_over(with_ingress(small_config, max_body_reads=2))).__serve_build_asgi_app__()
    slow = [Client([b'{"prompt": "a", '], complete=False) for _ in range(2)]  # a few bytes, then nothing
    calls = [asyncio.create_task(client.call(app)) for client in slow]
    await until(lambda: all(client.receives == 2 for client in slow))
    refused = Client([BODY])
    async with asyncio.timeout(1):
        await refused.call(app)
    assert refused.status == 503 and refused.header(b"retry-after") == b"1"
    assert refused.json()["error"]["code"] == "overloaded" and refused.receives == 0
    for client in slow:
        client.leave.set()
    await asyncio.gather(*calls)
    assert [client.status for client in slow] == [499, 499]
    served = Client([BODY])
    await served.call(app)
    assert served.status == 200


async def test_a_client_that_leaves_mid_body_is_a_499_and_nothing_runs(small_config):
    engine = FakeEngine()
    ingress = await ingress_over(small_config, fake_a=engine)
    app = ingress.__serve_build_asgi_app__()
    leaving = Client([BODY[:10]], complete=False)
    leaving.leave.set()
    await leaving.call(app)  # raises if the handler failed
    assert leaving.status == 499 and not engine.requests
    served = Client([BODY])
    await served.call(app)
    assert served.status == 200


async def test_a_stream_whose_client_leaves_before_the_first_chunk_is_cancelled_at_once(small_config):
    engine = FakeEngine(step_s=30)  # the first chunk would take 30 s
    ingress = await ingress_over(small_config, fake_a=engine)
    app = ingress.__serve_build_asgi_app__()
    body = json.dumps({"model": "fake-a", "prompt": "a", "max_tokens": 4, "stream": True}).encode()
    leaving = Client([body], STREAM_HEADERS)
    call = asyncio.create_task(leaving.call(app))
    await until(lambda: engine.requests)
    leaving.leave.set()
    async with asyncio.timeout(1):
        await call
    assert leaving.status == 499
    await until(lambda: ingress._batcher.stats()[("fake-a", "default")].in_flight == 0)


@pytest.fixture
async def one_pool_failed(small_config):
    """Each test's ingress, with fake-b's deployment failed at start (Serve's message
    holding text no client may see)."""

    async def make(config):
        ingress = await ingress_over(config)
        failed = DeploymentState(status="DEPLOY_FAILED", message="engine refused: Traceback /srv/secret.py")

        async def states():
            return {deployment_name("fake-a", "default"): replicas_up(1), deployment_name("fake-b", "default"): failed}

        ingress._poller.cancel()
        ingress._read_states = states
        ingress._poller = asyncio.create_task(ingress._poll_capacity())
        await until(lambda: not ingress.readiness()["ready"])
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=ingress.__serve_build_asgi_app__()),
                                 base_url="http://t")

    return make


async def test_ready_gives_codes_not_serve_messages(small_config, one_pool_failed):
    async with await one_pool_failed(small_config) as http:
        ready = await http.get("/ready")
    body = ready.json()
    assert ready.status_code == 503 and not body["ready"] and body["models"]["fake-a"]["ready"]
    assert body["models"]["fake-b"]["pools"]["default"] == {"slots": 0, "down": "DEPLOY_FAILED"}
    assert "secret" not in ready.text and "refused" not in ready.text


async def test_ready_with_keys_on_says_only_ready_without_a_valid_key(small_config, one_pool_failed):
    config = with_ingress(small_config, api_keys=[ApiKeyConfig(name="team", sha256=key_digest("sk-team"))])
    async with await one_pool_failed(config) as http:
        for headers in ({}, {"authorization": "Bearer sk-other"}):
            ready = await http.get("/ready", headers=headers)
            assert ready.status_code == 503 and ready.json() == {"ready": False}
        keyed = await http.get("/ready", headers={"authorization": "Bearer sk-team"})
    assert keyed.status_code == 503 and keyed.json()["models"]["fake-b"]["pools"]["default"]["down"] == "DEPLOY_FAILED"
