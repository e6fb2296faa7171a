"""Overload through the real Serve proxy: a flood of authorised slow bodies, past
the ingress's `max_body_reads`, leaves a new request a fast answer (a 503 with
`Retry-After`, or a 200), never a wait in Serve's queue; once the flood leaves,
the app serves again with nothing left running."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from serve_app.config import app_configs, load_serve_config
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
LEGIT = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
ANSWER_WITHIN_S = 1.0


async def slow_body(url: httpx.URL) -> asyncio.StreamWriter:
    """A connection that sends headers promising 1000 bytes, sends a few, then stalls."""
    _, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}\r\ncontent-type: application/json\r\n"
                 "content-length: 1000\r\n\r\n{\"prompt\": ".encode())
    await writer.drain()
    return writer


async def legit(http: httpx.AsyncClient) -> httpx.Response:
    """One ordinary request, which must be answered within `ANSWER_WITHIN_S`."""
    started = time.monotonic()
    response = await http.post("/completions", json=LEGIT, timeout=ANSWER_WITHIN_S + 5)
    elapsed = time.monotonic() - started
    assert elapsed < ANSWER_WITHIN_S, f"answered {response.status_code} after {elapsed:.2f} s"
    return response


async def test_a_slow_body_flood_leaves_a_new_request_a_fast_503_then_the_app_serves_again(live_app):
    url = httpx.URL(live_app)
    bound = app_configs(load_serve_config(REPO / "configs/local.yaml"))["llm"].ingress.max_body_reads
    async with httpx.AsyncClient(base_url=live_app) as http:
        assert (await legit(http)).status_code == 200  # warm
        flood = [await slow_body(url) for _ in range(bound + 16)]
        try:
            async with asyncio.timeout(30):  # until the flood has reached the ingress
                while (response := await legit(http)).status_code != 503:
                    assert response.status_code == 200
            assert response.json()["error"]["code"] == "overloaded" and int(response.headers["retry-after"]) >= 1
        finally:
            for writer in flood:
                writer.close()
        async with asyncio.timeout(30):  # the proxy cancels the flood's requests
            while (response := await legit(http)).status_code != 200:
                assert response.status_code == 503
        stats = (await http.get(live_app.removesuffix("/v1") + "/stats")).json()
        assert stats["pools"][f"{MODEL}/default"]["in_flight"] == 0
