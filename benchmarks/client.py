"""The load generator both benchmarks share: one async streaming sender (httpx,
raw SSE lines), closed- and open-loop drivers with progress lines, the client's
own event-loop lag, and the SCHED_FIFO sending thread.

The SSE lines are parsed here rather than by the `openai` client: its parser
costs ~260 us of CPU per chunk (`json.loads` ~4 us), and on 2 busy cores that
stalled the event loop for seconds, sending later requests late.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.metrics import RequestRecord, StreamTimer, distribution, failed

Body = dict[str, Any]


class StreamSender:
    """Sends streamed chat completions to one OpenAI-compatible server."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.client = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            trust_env=False,  # loopback servers: never through a proxy from the environment
        )

    async def send(self, body: Body, origin: float = 0.0, headers: dict[str, str] | None = None,
                   keep_text: bool = False) -> RequestRecord:
        """POST `body` (made streaming, with usage) and time its chunks; every
        failure becomes a record with its status, none is raised."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        sent_at = time.perf_counter()
        timer = StreamTimer(sent_at, origin, keep_text)
        start_s = sent_at - origin
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.client.stream("POST", "/chat/completions", json=body, headers=headers) as response:
                    if response.status_code != 200:
                        text = (await response.aread()).decode(errors="replace")
                        return failed(f"http_{response.status_code}", start_s, response.headers.get("retry-after"),
                                      text[:300])
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue  # blank separators, comments (pings), `event:` lines
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            continue
                        at = time.perf_counter()
                        if not timer.feed(json.loads(payload), at):
                            break
        except TimeoutError:  # asyncio.timeout's
            return failed("timeout", start_s)
        except httpx.TimeoutException as exc:
            return failed("timeout", start_s, error=repr(exc))
        except httpx.TransportError as exc:  # refused, reset, or lost mid-stream
            return failed("connection_error", start_s, error=repr(exc)[:300])
        except json.JSONDecodeError as exc:
            return failed("bad_stream", start_s, error=repr(exc)[:300])
        return timer.finish()

    async def close(self) -> None:
        await self.client.aclose()


class LoopLag:
    """How late a periodic 10 ms asyncio timer fires: the client's own delay.
    Large values mean the client was starved and its timings are not the server's."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, loop.time() - expected))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> dict[str, float | None]:
        if self._task is not None:
            self._task.cancel()
        return {**distribution(self.samples), "max": max(self.samples, default=None), "samples": len(self.samples)}


@dataclass
class Progress:
    """Counts of a run, printed every `every_s` seconds."""

    label: str
    total: int
    every_s: float = 10.0
    sent: int = 0
    done: int = 0
    ok: int = 0
    started: float = field(default_factory=time.perf_counter)

    def line(self) -> str:
        return (f"  [{self.label}] {time.perf_counter() - self.started:5.0f}s: sent {self.sent}/{self.total}, "
                f"done {self.done} (ok {self.ok}, failed {self.done - self.ok}), in flight {self.sent - self.done}")

    def finished(self, record: RequestRecord) -> None:
        self.done += 1
        self.ok += record.ok

    async def report(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            print(self.line(), flush=True)


@contextlib.asynccontextmanager
async def reporting(progress: Progress):
    task = asyncio.get_running_loop().create_task(progress.report())
    try:
        yield
    finally:
        task.cancel()


async def closed_loop(send: Callable[[int, float], Awaitable[RequestRecord]], count: int, concurrency: int,
                      progress: Progress) -> tuple[float, list[RequestRecord]]:
    """Requests 0..count-1, `concurrency` in flight at any time; `send(i, origin)`
    sends request i. Returns the duration (first send to last end) and the records."""
    records: list[RequestRecord | None] = [None] * count
    next_index = 0
    origin = time.perf_counter()

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            index, next_index = next_index, next_index + 1
            progress.sent += 1
            records[index] = record = await send(index, origin)
            progress.finished(record)

    async with reporting(progress):
        await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return time.perf_counter() - origin, list(records)


async def open_loop(send: Callable[[int, float], Awaitable[RequestRecord]], arrivals_s: Sequence[float],
                    progress: Progress) -> tuple[float, list[RequestRecord], list[float]]:
    """Send request i at `arrivals_s[i]` seconds after the start, whatever is in
    flight. Returns the duration (start to last end), the records and each
    request's send lag (actual send time minus planned arrival)."""
    records: list[RequestRecord | None] = [None] * len(arrivals_s)
    origin = time.perf_counter()

    async def one(index: int) -> None:
        records[index] = record = await send(index, origin)
        progress.finished(record)

    tasks = []
    async with reporting(progress):
        for index, arrival in enumerate(arrivals_s):
            delay = origin + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            progress.sent += 1
            tasks.append(asyncio.get_running_loop().create_task(one(index)))
        await asyncio.gather(*tasks)
    lags = [record.start_s - arrival for record, arrival in zip(records, arrivals_s, strict=True)]
    return time.perf_counter() - origin, list(records), lags


@contextlib.contextmanager
def realtime_client(enabled: bool) -> Iterator[bool]:
    """Run the calling thread (the client's event loop) as SCHED_FIFO meanwhile;
    yields whether it does.

    On 2 cores the servers' busy threads kept this thread waiting runnable for
    seconds (schedstat), even at nice -5: requests went out up to 15 s late and
    TTFTs read 16 s where they were 0.1 s. The client needs ~2% of a core, so a
    real-time policy costs the servers nothing measurable (and the kernel's RT
    throttling bounds it). It is set per thread with SCHED_RESET_ON_FORK, so no
    process started meanwhile inherits it; servers are started outside anyway."""
    if enabled:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        except (PermissionError, OSError):
            print("note: no permission for SCHED_FIFO; the client may be starved of CPU", flush=True)
            enabled = False
    try:
        yield enabled
    finally:
        if enabled:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def add_client_options(parser: argparse.ArgumentParser, progress_s: float) -> None:
    """The load generator's command-line options, the same in both benchmarks."""
    parser.add_argument("--realtime-client", action=argparse.BooleanOptionalAction, default=True,
                        help="run the sending thread as SCHED_FIFO so busy servers cannot starve its clock "
                             "(servers keep the default policy)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    parser.add_argument("--progress-s", type=float, default=progress_s)
