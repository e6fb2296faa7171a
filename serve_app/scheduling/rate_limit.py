"""Per-API-key rate limits: token buckets for requests/s and tokens/min.

Requests per second allow bursts of one second's worth and are charged as a
request arrives, before its body is read (`admit_request`). Prompt + output tokens
per minute are reserved at admission at the most the request can use (its
prompt plus `max_tokens`, or the context left: `request_token_bound`),
never at a predicted length, and settled to what it really used when it ends.
A refusal says when to come back. Each ingress replica holds its own buckets,
sized by `replica_share`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.config import ApiKeyConfig


def request_token_bound(prompt_tokens: int, max_tokens: int | None, context: int | None) -> int | None:
    """Most prompt + output tokens a request can use: its prompt plus
    `max_tokens`, else plus the context left after the prompt; None when the
    context is unknown too (the limiter then reserves a whole bucket)."""
    if max_tokens is not None:
        return prompt_tokens + max_tokens
    return None if context is None else max(prompt_tokens, context)


def replica_share(key: ApiKeyConfig, replicas: int) -> float:
    """The share of `key`'s limits one of `replicas` ingress replicas enforces:
    `ingress_skew / replicas`, at most the whole limit."""
    return min(1.0, key.ingress_skew / max(1, replicas))


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
    reserved_tokens: float = 0.0
    """Tokens charged up front, for `settle` to replace by the real use."""


class RateLimiter:
    """Per-client request and token buckets, from the clients' `ApiKeyConfig`.

    With n ingress replicas, each enforces `replica_share` of every limit
    (`set_replicas`), so a client gets `min(ingress_skew, n)` times its limits
    in all at most, and no 429 below them while no replica receives more than
    `ingress_skew / n` of its traffic (there is no shared store to do better)."""

    def __init__(self, keys: list[ApiKeyConfig], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys = {key.name: key for key in keys}
        self._shares = dict.fromkeys(self._keys, 1.0)
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

    def set_replicas(self, count: int) -> None:
        """Scale every key's buckets to this replica's share among `count` ingress replicas."""
        for name, key in self._keys.items():
            share = replica_share(key, count)
            factor, self._shares[name] = share / self._shares[name], share
            if name in self._requests:
                self._requests[name].scale(factor, min_capacity=1.0)  # a whole request must fit
            if name in self._tokens:
                self._tokens[name].scale(factor)

    def admit_request(self, client: str | None) -> RateDecision:
        """Charge one request to the client's requests/s, or say when to retry.
        Called as the request arrives, before its body is read; `admit` then
        reserves its tokens."""
        requests = self._requests.get(client) if client is not None else None
        if requests is None:
            return RateDecision(True)
        requests.refill(self._clock())
        if requests.level < 1:
            wait = requests.seconds_until(1)
            return RateDecision(False, math.ceil(wait), f"over {self._keys[client].requests_per_s:g} requests/s")
        requests.level -= 1
        return RateDecision(True)

    def admit(self, client: str | None, token_bound: int | None) -> RateDecision:
        """Reserve `token_bound` tokens of a request `admit_request` let in, or say when to retry.

        The reservation is at most the token bucket's capacity (all of it when
        `token_bound` is None), so a request that may use more than the whole
        bucket is still admitted once the bucket is full; if it really uses
        more, settling takes the level below zero and the client waits for it."""
        if client is None:
            return RateDecision(True)
        tokens = self._tokens.get(client)
        reserve = 0.0
        if tokens is not None:
            tokens.refill(self._clock())
            reserve = tokens.capacity if token_bound is None else min(token_bound, tokens.capacity)
            if tokens.level < reserve:
                wait = tokens.seconds_until(reserve)
                return RateDecision(False, math.ceil(wait), f"over {self._keys[client].tokens_per_min} tokens/min")
            tokens.level -= reserve
        return RateDecision(True, reserved_tokens=reserve)

    def settle(self, client: str | None, reserved_tokens: float, actual_tokens: int) -> None:
        """Replace a request's reservation by the tokens it really used."""
        bucket = self._tokens.get(client) if client is not None else None
        if bucket is not None:
            bucket.refill(self._clock())
            bucket.level = min(bucket.capacity, bucket.level + reserved_tokens - actual_tokens)
