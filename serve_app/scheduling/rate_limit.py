"""Per-API-key rate limits: token buckets for requests/s and tokens/min.

Requests per second allow bursts of one second's worth; prompt + output tokens
per minute are charged an estimate at admission and corrected when the request
ends. A refusal says when to come back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.config import ApiKeyConfig


class TokenBucket:
    def __init__(self, capacity: float, refill_per_s: float, now: float) -> None:
        self.capacity = capacity
        self.refill_per_s = refill_per_s
        self.level = capacity
        self._updated = now

    def scale(self, factor: float, min_capacity: float = 0.0) -> None:
        """Multiply refill rate, capacity (at least `min_capacity`) and level by `factor`."""
        self.refill_per_s *= factor
        self.capacity = max(min_capacity, self.capacity * factor)
        self.level = min(self.capacity, self.level * factor)

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self._updated) * self.refill_per_s)
        self._updated = now

    def seconds_until(self, amount: float) -> float:
        """Seconds until `amount` is available (0 if it is now)."""
        missing = min(amount, self.capacity) - self.level
        return max(0.0, missing / self.refill_per_s)


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_s: int = 0
    reason: str = ""


class RateLimiter:
    """Per-client request and token buckets, from the clients' `ApiKeyConfig`.

    Each ingress replica holds its own buckets, so with n replicas each enforces
    1/n of every limit (`set_share`): a client spread over them gets its limit
    in total, not n times it."""

    def __init__(self, keys: list[ApiKeyConfig], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._share = 1.0
        now = clock()
        self._requests = {
            key.name: TokenBucket(max(1.0, key.requests_per_s), key.requests_per_s, now)
            for key in keys
            if key.requests_per_s is not None
        }
        self._tokens = {
            key.name: TokenBucket(key.tokens_per_min, key.tokens_per_min / 60, now)
            for key in keys
            if key.tokens_per_min is not None
        }

    def set_share(self, share: float) -> None:
        """This replica's share of every limit (1 / ingress replicas)."""
        if share <= 0 or share == self._share:
            return
        factor, self._share = share / self._share, share
        for bucket in self._requests.values():
            bucket.scale(factor, min_capacity=1.0)  # a whole request must fit
        for bucket in self._tokens.values():
            bucket.scale(factor)

    def admit(self, client: str | None, estimated_tokens: int) -> RateDecision:
        """Charge one request and its estimated tokens, or say when to retry."""
        if client is None:
            return RateDecision(True)
        now = self._clock()
        requests, tokens = self._requests.get(client), self._tokens.get(client)
        for bucket in (requests, tokens):
            if bucket is not None:
                bucket.refill(now)
        if requests is not None and requests.level < 1:
            wait = requests.seconds_until(1)
            return RateDecision(False, math.ceil(wait), f"over {requests.refill_per_s:g} requests/s")
        if tokens is not None and tokens.level < min(estimated_tokens, tokens.capacity):
            wait = tokens.seconds_until(estimated_tokens)
            return RateDecision(False, math.ceil(wait), f"over {tokens.capacity:g} tokens/min")
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= estimated_tokens
        return RateDecision(True)

    def settle(self, client: str | None, estimated_tokens: int, actual_tokens: int) -> None:
        """Replace a request's estimate by the tokens it really used."""
        bucket = self._tokens.get(client) if client is not None else None
        if bucket is not None:
            bucket.refill(self._clock())
            bucket.level = min(bucket.capacity, bucket.level + estimated_tokens - actual_tokens)
