"""Work raced against its client leaving, watched by the ingress itself.

Serve's proxy stops watching for a disconnect when a client sends
`x-request-disconnect-disabled`, so the ingress watches on its own: a client
that leaves before its answer (a whole one, or a stream's first chunk) gets
its work cancelled at once, and the request is logged as 499.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")

GONE: Any = object()
"""What the functions below return when the client left first."""


async def client_gone(http: Request) -> None:
    """Returns once the client disconnects (the body has been read already)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(http: Request, work: Awaitable[T], timeout_s: float) -> T:
    """`work`'s result, or `GONE` (the work cancelled) if the client leaves first;
    `TimeoutError` (the work cancelled) past `timeout_s`."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(client_gone(http))
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left = gone.done()
        gone.cancel()
        if left or not task.done():
            task.cancel()
    if left or task.cancelled():
        await asyncio.wait({task})  # its cancellation runs the work's cleanup
        if not task.cancelled():
            task.exception()  # retrieved: the client is gone, nothing to report to
        return GONE
    return task.result()


async def first_unless_gone(http: Request, chunks: AsyncIterator[T]) -> T | None:
    """The stream's first item (None if it is empty), or `GONE` if the client
    leaves first (the stream is then closed, which cancels its work)."""
    first = await unless_gone(http, anext(chunks, None), timeout_s=float("inf"))
    if first is GONE:
        await chunks.aclose()
    return first
