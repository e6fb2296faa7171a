"""The IMDS notice poller against a real HTTP fake on loopback, and SIGTERM."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import aiohttp
import pytest

from serve_app.capacity.preemption import (
    TOKEN_HEADER,
    ImdsSource,
    PreemptionNotice,
    PreemptionWatcher,
    parse_instance_action,
)
from serve_app.config import PreemptionConfig
from tests.fakes import FakeImds


@pytest.fixture
def imds():
    fake = FakeImds()
    yield fake
    fake.close()


def watcher_for(url: str, notices: list, interval_s: float = 0.05) -> PreemptionWatcher:
    config = PreemptionConfig(imds_url=url, poll_interval_s=interval_s, imds_timeout_s=0.5)
    return PreemptionWatcher(config, notices.append)


def test_parse_instance_action_reads_the_utc_deadline():
    notice = parse_instance_action('{"action": "stop", "time": "2026-12-02T19:00:00Z"}')
    assert notice.action == "stop" and notice.source == "imds"
    assert notice.deadline == datetime(2026, 12, 2, 19, 0, tzinfo=UTC).timestamp()


async def test_no_notice_is_a_404_asked_with_an_imdsv2_token(imds):
    notices: list[PreemptionNotice] = []
    watcher = watcher_for(imds.url, notices)
    assert await watcher.poll_once() is None
    assert await watcher.poll_once() is None
    watcher.stop()
    assert notices == [] and watcher.notice is None
    assert imds.tokens == ["token-0"], "one token serves both polls"
    assert [get.get(TOKEN_HEADER) for get in imds.gets] == ["token-0", "token-0"]


async def test_a_notice_calls_back_once_with_its_deadline(imds):
    notices: list[PreemptionNotice] = []
    watcher = watcher_for(imds.url, notices)
    deadline = imds.announce(in_s=120, action="hibernate")
    first = await watcher.poll_once()
    await watcher.poll_once()
    watcher.stop()
    assert notices == [first] and first == PreemptionNotice("hibernate", deadline, "imds")


async def test_running_watcher_stops_polling_after_the_notice(imds):
    notices: list[PreemptionNotice] = []
    watcher = watcher_for(imds.url, notices)
    watcher.start()
    await asyncio.sleep(0.3)
    assert notices == [] and len(imds.gets) >= 3
    imds.announce(in_s=60)
    for _ in range(100):
        if notices:
            break
        await asyncio.sleep(0.02)
    polls = len(imds.gets)
    await asyncio.sleep(0.3)
    watcher.stop()
    assert len(notices) == 1 and notices[0].source == "imds"
    assert len(imds.gets) == polls, "no polling after the notice"


async def test_failing_endpoint_is_logged_once_and_polling_continues(imds, caplog):
    notices: list[PreemptionNotice] = []
    watcher = watcher_for(imds.url, notices)
    imds.broken = True
    with caplog.at_level(logging.WARNING, logger="serve_app.preemption"):
        for _ in range(4):
            assert await watcher.poll_once() is None
        imds.broken = False
        imds.announce(in_s=100)
        assert await watcher.poll_once() is not None
    watcher.stop()
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1 and len(notices) == 1


async def test_absent_endpoint_is_no_notice_and_no_crash(caplog):
    closed = FakeImds()
    closed.close()  # nothing listens on that port any more
    notices: list[PreemptionNotice] = []
    watcher = watcher_for(closed.url, notices)
    with caplog.at_level(logging.WARNING, logger="serve_app.preemption"):
        assert await watcher.poll_once() is None
        assert await watcher.poll_once() is None
    watcher.stop()
    assert notices == [] and sum("unavailable" in r.getMessage() for r in caplog.records) == 1


async def test_imdsv1_only_endpoint_is_asked_without_a_token():
    imds = FakeImds(imdsv2=False)
    try:
        source = ImdsSource(imds.url, timeout_s=0.5)
        imds.announce(in_s=30)
        notice = await source.check()
    finally:
        imds.close()
    assert notice is not None and TOKEN_HEADER not in imds.gets[0]


async def test_rejected_token_is_replaced(imds):
    source = ImdsSource(imds.url, timeout_s=0.5)
    assert await source.check() is None
    imds.tokens.append("rotated")  # the fake now only accepts a token it never handed out
    with pytest.raises(aiohttp.ClientResponseError, match="401"):
        await source.check()
    assert await source.check() is None
    assert imds.gets[-1][TOKEN_HEADER] == imds.tokens[-1] == "token-2"
