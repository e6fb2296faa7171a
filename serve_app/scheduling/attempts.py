"""One request, several attempts: what each attempt asks of a pool, and when to retry.

A request continues elsewhere, from its prompt plus the tokens already sent
(`GenerationRequest.continuation`), in two cases: it reaches its pool's edge
unfinished (`overrun: rebucket`: the attempt was told to stop there, and the
request moves on to the next pool), or its replica is lost (`RetryPolicy`).
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serve_app.config import PoolConfig
from serve_app.engine.base import GenerationChunk, GenerationRequest


@dataclass(frozen=True)
class Attempt:
    request: GenerationRequest
    """What the pool is asked: the output still allowed, the tokens so far."""
    edge_tokens: int | None
    """Output tokens (of the whole request) at which this attempt stops for the
    next pool; None when it runs to the request's own end."""

    def moves_on(self, chunk: GenerationChunk, produced: int) -> bool:
        """Whether `chunk`, bringing the request to `produced` tokens, ends this
        attempt at the pool's edge rather than ending the request."""
        return self.edge_tokens is not None and chunk.finish_reason == "length" and produced >= self.edge_tokens


def plan_attempt(request: GenerationRequest, pool: PoolConfig, rebucket: bool, number: int,
                 sent: tuple[int, ...], sent_chars: int) -> Attempt:
    """Attempt `number` (0 first) of `request` on `pool`, after `sent` output
    tokens of which the client has `sent_chars` characters of text."""
    produced = len(sent)
    limit = request.max_tokens
    remaining = None if limit is None else limit - produced
    edge = pool.max_output_tokens - produced if rebucket and pool.max_output_tokens is not None else None
    at_edge = edge is not None and (remaining is None or edge < remaining)
    attempt = replace(
        request,
        request_id=request.request_id if number == 0 else f"{request.request_id}-{number}",
        max_tokens=remaining,
        stop_after=edge if at_edge else None,
        continuation=sent,
        continuation_chars=sent_chars,
    )
    return Attempt(attempt, pool.max_output_tokens if at_edge else None)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded tries with exponential backoff after a lost replica."""

    max_attempts: int
    backoff_s: float
    """Wait before the second try; doubles per further try."""

    def wait_s(self, failures: int) -> float | None:
        """Seconds to wait after `failures` failed tries; None: give up."""
        if failures >= self.max_attempts:
            return None
        return self.backoff_s * 2 ** (failures - 1)
