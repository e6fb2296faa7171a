"""Merge engine output steps into fewer, larger stream chunks.

Every chunk a replica yields costs a Ray round trip to the ingress and an SSE
event to the proxy; at decode speed that overhead competes with the engine for
the same cores. The first chunk goes out at once (time to first token); later
ones are gathered for up to `interval_s` and sent as one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from serve_app.engine.base import GenerationChunk

_END = object()


def merge(chunks: list[GenerationChunk]) -> GenerationChunk:
    return GenerationChunk(
        text="".join(chunk.text for chunk in chunks),
        num_tokens=sum(chunk.num_tokens for chunk in chunks),
        prompt_tokens=chunks[-1].prompt_tokens,
        finish_reason=chunks[-1].finish_reason,
        token_ids=tuple(token for chunk in chunks for token in chunk.token_ids),
    )


async def coalesce(chunks: AsyncIterator[GenerationChunk], interval_s: float) -> AsyncIterator[GenerationChunk]:
    """Yield `chunks` merged per `interval_s`; errors from the source re-raise here."""
    if interval_s <= 0:
        async for chunk in chunks:
            yield chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for chunk in chunks:
                queue.put_nowait(chunk)
            queue.put_nowait(_END)
        except Exception as exc:  # handed to the consumer, raised there
            queue.put_nowait(exc)

    producer = asyncio.create_task(pump())
    first = True
    try:
        while True:
            items = [await queue.get()]
            if not first:
                await asyncio.sleep(interval_s)
            first = False
            while not queue.empty():
                items.append(queue.get_nowait())
            batch = [item for item in items if isinstance(item, GenerationChunk)]
            if batch:
                yield merge(batch)
            if isinstance(items[-1], Exception):
                raise items[-1]
            if items[-1] is _END:
                return
    finally:
        producer.cancel()
