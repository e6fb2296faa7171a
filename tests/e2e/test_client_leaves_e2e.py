"""Clients that leave, through the real Serve proxy, with `x-request-disconnect-disabled`
(the proxy then leaves watching the client to the ingress): one that closes mid-body
is logged as 499, not a 500, and the app keeps serving; a stream whose client leaves
while it waits for its first chunk leaves the pool's queue at once."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest
from ray._common.utils import get_default_ray_temp_dir

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
POOL = f"{MODEL}/default"
DISCONNECT_DISABLED = "x-request-disconnect-disabled: ?1\r\n"
FILLER_TOKENS = 1600
"""Most of the shipped configs' 2048-token context: minutes of output per filler on these CPUs."""


async def post_raw(url: httpx.URL, body: bytes, sent: int, headers: str = "") -> asyncio.StreamWriter:
    """A POST declaring all of `body` that sends only its first `sent` bytes."""
    _, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n{DISCONNECT_DISABLED}{headers}\r\n".encode() + body[:sent])
    await writer.drain()
    return writer


async def pool_stats(http: httpx.AsyncClient) -> dict:
    return (await http.get("/stats")).json()["pools"][POOL]


async def wait_for(condition, timeout_s: float, poll_s: float = 0.05):
    async with asyncio.timeout(timeout_s):
        while not (value := await condition()):
            await asyncio.sleep(poll_s)
    return value


def ingress_log_lines(request_id: str) -> list[str]:
    """The ingress replica's log lines for one request (Serve uses the client's `x-request-id`)."""
    logs = Path(get_default_ray_temp_dir()) / "session_latest" / "logs" / "serve"
    return [line for path in logs.glob("replica_*OpenAIIngress*.log")
            for line in path.read_text(errors="replace").splitlines() if request_id in line]


async def test_a_client_that_closes_mid_body_is_a_499_and_the_app_keeps_serving(live_app):
    url = httpx.URL(live_app)
    request_id = f"leaves-mid-body-{uuid.uuid4().hex}"
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}).encode()
    writer = await post_raw(url, body, sent=10, headers=f"x-request-id: {request_id}\r\n")
    await asyncio.sleep(0)
    writer.close()
    lines = await wait_for(lambda: asyncio.to_thread(ingress_log_lines, request_id), timeout_s=30, poll_s=0.2)
    assert any(" 499 " in line for line in lines) and not any(" 500 " in line for line in lines), lines
    async with httpx.AsyncClient(base_url=str(url).removesuffix("/v1")) as http:
        answer = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
        assert answer.status_code == 200
        stats = await pool_stats(http)
        assert stats["in_flight"] == 0 and stats["waiting"] == 0


async def test_a_stream_whose_client_leaves_before_its_first_chunk_leaves_the_queue_at_once(live_app):
    url = httpx.URL(live_app)
    # Fillers that cannot end while the test runs, whatever the CPU (they are cancelled at its end).
    long = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": FILLER_TOKENS, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=str(url).removesuffix("/v1"), timeout=300) as http:
        slots = (await pool_stats(http))["slots"]
        fillers = [asyncio.create_task(http.post("/v1/completions", json=long)) for _ in range(slots)]
        try:
            await wait_for(lambda: _all_taken(http, slots, fillers), timeout_s=120)
            waiting = (await pool_stats(http))["waiting"]
            body = json.dumps({**long, "stream": True}).encode()
            writer = await post_raw(url, body, sent=len(body))
            await wait_for(lambda: _waiting_is(http, waiting + 1), timeout_s=10)
            writer.close()
            left = time.monotonic()
            await wait_for(lambda: _waiting_is(http, waiting), timeout_s=10)
            # At once, give or take /stats round trips on a busy machine; unwatched, it waited for a free
            # slot: until a filler ends.
            assert time.monotonic() - left < 3.0
            assert not any(filler.done() for filler in fillers)  # the slots were still taken meanwhile
        finally:
            for filler in fillers:
                filler.cancel()
            await asyncio.gather(*fillers, return_exceptions=True)
        await wait_for(lambda: _idle(http), timeout_s=60, poll_s=0.2)


async def _all_taken(http: httpx.AsyncClient, slots: int, fillers: list[asyncio.Task]) -> bool:
    ended = [filler.exception() or filler.result() for filler in fillers if filler.done()]
    assert not ended, (f"{len(ended)} fillers ended early, the first with {ended[0]!r}"
                       f"{_after(ended[0])}: {getattr(ended[0], 'text', '')[-300:]}")
    stats = await pool_stats(http)
    return stats["in_flight"] + stats["waiting"] >= slots and stats["in_flight"] > 0


def _after(response: httpx.Response | BaseException) -> str:
    return f" after {response.elapsed.total_seconds():.1f}s" if isinstance(response, httpx.Response) else ""


async def _waiting_is(http: httpx.AsyncClient, count: int) -> bool:
    return (await pool_stats(http))["waiting"] == count


async def _idle(http: httpx.AsyncClient) -> bool:
    stats = await pool_stats(http)
    return stats["in_flight"] == 0 and stats["waiting"] == 0
