"""The shared sender against a fake SSE server on loopback, the drivers and the lag monitor."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from benchmarks.client import LoopLag, Progress, StreamSender, closed_loop, open_loop, realtime_client
from benchmarks.metrics import RequestRecord, summarize
from benchmarks.servers import free_port
from tests.benchmarks.fake_openai import make_app


@pytest.fixture(scope="module")
async def base_url():
    runner = web.AppRunner(make_app(token_delay_s=0.002))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


def chat(content, max_tokens=4, ignore_eos=True):
    return {"model": "fake", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": ignore_eos}


async def send(base_url, content, timeout_s=30.0, **kwargs):
    sender = StreamSender(base_url, timeout_s)
    try:
        return await sender.send(chat(content, **kwargs), keep_text=True)
    finally:
        await sender.close()


async def test_a_stream_is_timed_chunk_by_chunk(base_url):
    record = await send(base_url, "Write about France", max_tokens=4)
    assert record.ok and record.output_tokens == 4 and record.prompt_tokens == 3
    assert len(record.itl_s) == 4  # role chunk + 4 token chunks: 4 gaps; the usage chunk adds none
    assert 0 < record.ttft_s < record.e2el_s and record.e2el_s == pytest.approx(record.ttft_s + sum(record.itl_s))
    assert record.tpot_s == pytest.approx((record.e2el_s - record.ttft_s) / 3)
    assert record.text == "Paris. " * 4


async def test_multi_token_chunks_count_tokens_from_usage(base_url):
    record = await send(base_url, "multi", max_tokens=6)
    assert record.ok and record.output_tokens == 6 and len(record.itl_s) == 2  # two 3-token chunks


async def test_the_model_ends_requests_without_ignore_eos(base_url):
    record = await send(base_url, "hello", max_tokens=50, ignore_eos=False)
    assert record.ok and record.output_tokens == 5


@pytest.mark.parametrize(("content", "status", "retry_after"), [
    ("fail-429", "http_429", "1"), ("fail-503", "http_503", "1"), ("fail-503-bare", "http_503", None),
    ("stream-error", "stream_error", None), ("drop", "connection_error", None), ("no-usage", "no_usage", None),
])
async def test_every_failure_is_a_record_with_its_status(base_url, content, status, retry_after):
    record = await send(base_url, content, max_tokens=6)
    assert (record.status, record.retry_after) == (status, retry_after)
    assert not record.ok and record.tpot_s is None


async def test_connection_refused_and_timeout(base_url):
    refused = await send(f"http://127.0.0.1:{free_port()}/v1", "hello")
    assert refused.status == "connection_error"
    slow = await send(base_url, "hello", timeout_s=0.05, max_tokens=500)
    assert slow.status == "timeout"


async def test_failures_are_counted_not_dropped(base_url):
    sender = StreamSender(base_url, 30.0)
    try:
        records = await asyncio.gather(*(sender.send(chat(c)) for c in ("a", "fail-429", "b", "fail-503-bare")))
    finally:
        await sender.close()
    s = summarize(records, 1.0)
    assert (s["requests"], s["completed"], s["failures"]) == (4, 2, {"http_429": 1, "http_503": 1})
    assert s["refused_without_retry_after"] == 1


async def test_closed_loop_keeps_the_concurrency():
    in_flight, peak = 0, 0

    async def fake_send(index, origin):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return RequestRecord(start_s=time.perf_counter() - origin, ttft_s=0.01, e2el_s=0.01, output_tokens=index)

    progress = Progress("t", 10, every_s=60)
    duration, records = await closed_loop(fake_send, 10, 3, progress)
    assert peak == 3 and [r.output_tokens for r in records] == list(range(10))
    assert (progress.sent, progress.done, progress.ok) == (10, 10, 10) and 0.03 < duration < 1.0
    assert "sent 10/10, done 10 (ok 10, failed 0), in flight 0" in progress.line()


async def test_open_loop_sends_at_the_planned_times_whatever_is_in_flight():
    async def fake_send(index, origin):
        started = time.perf_counter() - origin
        await asyncio.sleep(0.2)  # longer than the gaps: the next ones go out anyway
        return RequestRecord(start_s=started, ttft_s=0.1, e2el_s=0.2, output_tokens=1)

    arrivals = [0.0, 0.05, 0.1, 0.15]
    duration, records, lags = await open_loop(fake_send, arrivals, Progress("t", 4, every_s=60))
    assert all(0 <= lag < 0.05 for lag in lags)
    assert [r.start_s for r in records] == pytest.approx(arrivals, abs=0.05)
    assert 0.35 < duration < 1.0


async def test_loop_lag_sees_a_blocked_event_loop():
    lag = LoopLag(interval_s=0.01)
    lag.start()
    await asyncio.sleep(0.1)
    time.sleep(0.08)  # the loop is blocked: the timer fires late
    await asyncio.sleep(0.05)
    stats = lag.stop()
    assert stats["samples"] >= 8 and stats["max"] >= 0.06 and stats["p50"] < 0.01


def test_realtime_client_off_does_nothing():
    with realtime_client(False) as enabled:
        assert enabled is False
