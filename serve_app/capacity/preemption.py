"""Spot interruption notices: the AWS IMDS `spot/instance-action` poller.

A `PreemptionWatcher` polls one or more `NoticeSource`s (the IMDS one here,
unless `PreemptionConfig.imds` is off; the Ray-side guard adds "this node is
draining", which is how a SIGTERM reaches a replica: Ray drains the node on it)
and calls `on_notice` once with the first `PreemptionNotice`. Nothing here needs a Ray cluster.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

import aiohttp

from serve_app.config import PreemptionConfig
from serve_app.logs import logger_for

logger = logger_for(__name__)

INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_S = 21600


@dataclass(frozen=True)
class PreemptionNotice:
    """The node will be interrupted at `deadline` (Unix seconds)."""

    action: str
    """IMDS `action` (`terminate`, `stop`, `hibernate`), or `terminate` for a drain."""
    deadline: float
    """When the node goes away, Unix seconds."""
    source: Literal["imds", "drain"]
    """Who told us: the metadata service, or Ray (the node is draining)."""

    def remaining_s(self, now: float) -> float:
        return self.deadline - now


def parse_instance_action(body: str) -> PreemptionNotice:
    """The IMDS answer `{"action": "terminate", "time": "2026-12-02T19:00:00Z"}`."""
    data = json.loads(body)
    deadline = datetime.fromisoformat(data["time"].replace("Z", "+00:00")).timestamp()
    return PreemptionNotice(action=data["action"], deadline=deadline, source="imds")


class NoticeSource(Protocol):
    """Something the watcher polls: returns a notice, None, or raises when unreachable."""

    name: str

    async def check(self) -> PreemptionNotice | None: ...


class ImdsSource:
    """AWS IMDS with the IMDSv2 session token (refreshed before it expires).

    404 on `spot/instance-action` means no interruption is scheduled. When the
    token request is refused with an HTTP status (IMDSv2 not offered), the GET
    goes without a token, as the AWS SDKs fall back to IMDSv1. Each poll opens
    its own HTTP session (one every few seconds, to a link-local endpoint), so
    nothing is left open when polling stops.
    """

    name = "imds"

    def __init__(self, base_url: str, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._token: str | None = None
        self._token_expiry = 0.0

    async def check(self) -> PreemptionNotice | None:
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            headers = {}
            token = await self._fresh_token(session)
            if token is not None:
                headers[TOKEN_HEADER] = token
            async with session.get(self._base_url + INSTANCE_ACTION_PATH, headers=headers) as reply:
                if reply.status == 404:
                    return None
                if reply.status == 401:
                    self._token_expiry = 0.0  # rejected token: fetch a new one next time
                reply.raise_for_status()
                return parse_instance_action(await reply.text())

    async def _fresh_token(self, session: aiohttp.ClientSession) -> str | None:
        if self._clock() < self._token_expiry:
            return self._token
        headers = {TOKEN_TTL_HEADER: str(TOKEN_TTL_S)}
        async with session.put(self._base_url + TOKEN_PATH, headers=headers) as reply:
            self._token = await reply.text() if reply.status == 200 else None
        self._token_expiry = self._clock() + TOKEN_TTL_S / 2
        return self._token


def imds_sources(config: PreemptionConfig) -> list[NoticeSource]:
    """The IMDS source, or none where `config.imds` is off."""
    return [ImdsSource(config.imds_url, config.imds_timeout_s)] if config.imds else []


class PreemptionWatcher:
    """Polls its sources every `poll_interval_s`; calls `on_notice` once.

    A source that fails (endpoint absent, timeout, bad answer) is logged once,
    when it starts failing, and polling goes on. Only the first notice counts.
    """

    def __init__(
        self,
        config: PreemptionConfig,
        on_notice: Callable[[PreemptionNotice], None],
        sources: list[NoticeSource] | None = None,
    ) -> None:
        self._interval_s = config.poll_interval_s
        self._on_notice = on_notice
        self._sources = sources if sources is not None else imds_sources(config)
        self._failing: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.notice: PreemptionNotice | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop polling (a poll under way is cancelled)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _announce(self, notice: PreemptionNotice) -> None:
        if self.notice is not None:
            return
        self.notice = notice
        logger.warning("preemption notice from %s: %s in %.0f s", notice.source, notice.action,
                       notice.remaining_s(time.time()))
        self._on_notice(notice)

    async def poll_once(self) -> PreemptionNotice | None:
        for source in self._sources:
            try:
                notice = await source.check()
            except Exception as exc:  # noqa: BLE001 - any failure means "no answer this round"
                if source.name not in self._failing:
                    self._failing.add(source.name)
                    logger.warning("preemption source %s unavailable (%s: %s); still polling",
                                   source.name, type(exc).__name__, exc)
                continue
            self._failing.discard(source.name)
            if notice is not None:
                self._announce(notice)
                return notice
        return None

    async def _run(self) -> None:
        while self.notice is None and await self.poll_once() is None:
            await asyncio.sleep(self._interval_s)
