import math

from serve_app.config import ApiKeyConfig, ModelConfig
from serve_app.scheduling.rate_limit import RateLimiter, request_token_bound
from tests.fakes import ManualClock

KEYS = [
    ApiKeyConfig(name="alpha", sha256="a" * 64, requests_per_s=2, tokens_per_min=600),
    ApiKeyConfig(name="beta", sha256="b" * 64),
]


def test_request_rate_bucket_allows_a_burst_then_says_when_to_retry():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    assert limiter.admit_request("alpha").allowed and limiter.admit_request("alpha").allowed
    refused = limiter.admit_request("alpha")
    assert not refused.allowed and refused.retry_after_s == 1 and "requests/s" in refused.reason
    assert limiter.admit("alpha", 1).allowed  # tokens only: the request was charged on arrival
    clock.now = 0.5
    assert limiter.admit_request("alpha").allowed
    assert limiter.admit_request("beta").allowed and limiter.admit_request(None).allowed  # no limits


def test_token_bucket_reserves_the_bound_up_front_and_settles_actuals():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    first = limiter.admit("alpha", 500)
    assert first.allowed and first.reserved_tokens == 500
    refused = limiter.admit("alpha", 200)
    assert not refused.allowed and "600 tokens/min" in refused.reason
    assert refused.retry_after_s == 10  # 100 tokens missing at 10 tokens/s
    limiter.settle("alpha", first.reserved_tokens, 50)  # it used far less than it might have
    assert limiter.admit("alpha", 200).allowed


def test_a_request_bound_past_the_whole_bucket_is_admitted_once_the_bucket_is_full():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    huge = limiter.admit("alpha", 10_000)
    assert huge.allowed and huge.reserved_tokens == 600  # the whole bucket, no more
    assert not limiter.admit("alpha", 1).allowed
    limiter.settle("alpha", huge.reserved_tokens, 900)  # it really used more: 300 below zero
    clock.now = 60.0  # a minute refills 600: 300 left
    assert not limiter.admit("alpha", 400).allowed
    unbounded = limiter.admit("alpha", None)  # no bound known: a whole bucket, once it is full
    assert not unbounded.allowed and unbounded.retry_after_s == 30
    clock.now = 90.0
    assert limiter.admit("alpha", None).reserved_tokens == 600


def test_the_bound_is_the_prompt_plus_max_tokens_else_the_context():
    assert request_token_bound(prompt_tokens=100, max_tokens=50, context=2048) == 100 + 50
    assert request_token_bound(prompt_tokens=100, max_tokens=None, context=2048) == 2048
    assert request_token_bound(prompt_tokens=100, max_tokens=None, context=None) is None
    model = ModelConfig.model_validate({
        "name": "m", "engine": {"model": "unused", "max_model_len": 2048},
        "pools": [{"name": "short", "max_output_tokens": 8}, {"name": "long", "engine": {"max_model_len": 4096}}],
    })
    assert model.max_context_tokens() == 4096  # a request may move on to the longest pool
    unset = model.model_copy(update={"engine": model.engine.model_copy(update={"max_model_len": None})})
    assert unset.max_context_tokens() is None


def test_each_ingress_replica_enforces_its_share_with_room_for_skew():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)  # alpha: 600 tokens/min, ingress_skew 1.5
    limiter.set_replicas(2)  # 3/4 of each limit here: 450 tokens/min
    assert limiter.admit("alpha", 400).allowed
    assert not limiter.admit("alpha", 100).allowed  # 50 left
    assert limiter.admit("beta", 10**6).allowed  # no limits to share
    limiter.set_replicas(1)
    clock.now = 100.0
    assert limiter.admit("alpha", 600).allowed


REQUEST_TOKENS = 10
"""Tokens each request of `send` reserves and uses."""


def send(limiters: list[RateLimiter], clock: ManualClock, per_s: float, seconds: int, first_share: float) -> int:
    """A client sending `per_s` requests/s for `seconds`, `first_share` of them to the
    first of two replicas, interleaved evenly; returns how many were refused."""
    refused, count = 0, int(per_s * seconds)
    for i in range(count):
        clock.now = i / per_s
        limiter = limiters[0 if math.floor((i + 1) * first_share) > math.floor(i * first_share) else 1]
        decision = limiter.admit("team", REQUEST_TOKENS)
        if decision.allowed:
            limiter.settle("team", decision.reserved_tokens, REQUEST_TOKENS)
        refused += not decision.allowed
    return refused


def two_replicas(clock: ManualClock, **key) -> list[RateLimiter]:
    """Two ingress replicas' limiters for one key of 600 tokens/min: 1 request/s of `send`'s."""
    limiters = [RateLimiter([ApiKeyConfig(name="team", sha256="0" * 64, tokens_per_min=600, **key)], clock)
                for _ in range(2)]
    for limiter in limiters:
        limiter.set_replicas(2)
    return limiters


def test_the_replica_split_bound_no_429_below_the_limit_at_a_70_30_skew_and_at_most_1_5x_in_all():
    clock = ManualClock()  # 90% of the limit for 10 minutes, 70% of it to one replica
    assert send(two_replicas(clock), clock, per_s=0.9, seconds=600, first_share=0.7) == 0
    clock = ManualClock()  # 3x the limit, evenly spread: each replica holds 3/4 of it
    admitted = 3 * 600 - send(two_replicas(clock), clock, per_s=3, seconds=600, first_share=0.5)
    assert 600 < admitted <= 1.5 * 600 + 2 * 45  # 1.5x the limit, plus each replica's full bucket
    clock = ManualClock()  # ingress_skew 1 holds the limit exactly, and refuses below it at that skew
    assert send(two_replicas(clock, ingress_skew=1), clock, per_s=0.9, seconds=600, first_share=0.7) == 50
