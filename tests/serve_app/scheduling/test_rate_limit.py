from serve_app.config import ApiKeyConfig
from serve_app.scheduling.rate_limit import RateLimiter
from tests.fakes import ManualClock

KEYS = [
    ApiKeyConfig(name="alpha", sha256="a" * 64, requests_per_s=2, tokens_per_min=600),
    ApiKeyConfig(name="beta", sha256="b" * 64),
]


def test_request_rate_bucket_allows_a_burst_then_says_when_to_retry():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    assert limiter.admit("alpha", 1).allowed and limiter.admit("alpha", 1).allowed
    refused = limiter.admit("alpha", 1)
    assert not refused.allowed and refused.retry_after_s == 1 and "requests/s" in refused.reason
    clock.now = 0.5
    assert limiter.admit("alpha", 1).allowed
    assert limiter.admit("beta", 10**6).allowed  # no limits configured


def test_token_bucket_charges_estimates_and_settles_actuals():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    assert limiter.admit("alpha", 500).allowed
    refused = limiter.admit("alpha", 200)
    assert not refused.allowed and "tokens/min" in refused.reason
    assert refused.retry_after_s == 10  # 100 tokens missing at 10 tokens/s
    limiter.settle("alpha", 500, 50)  # it used far less than estimated
    assert limiter.admit("alpha", 200).allowed


def test_a_share_of_the_limits_for_each_of_several_ingress_replicas():
    clock = ManualClock()
    limiter = RateLimiter(KEYS, clock)
    limiter.set_share(0.5)
    assert limiter.admit("alpha", 1).allowed  # 1 of 2 requests/s (a whole request always fits)
    assert not limiter.admit("alpha", 1).allowed
    clock.now = 1.0  # refilled at 1 request/s
    assert limiter.admit("alpha", 1).allowed
    assert limiter.admit("beta", 1).allowed  # no limits to share
    clock.now = 100.0
    assert limiter.admit("alpha", 250).allowed
    assert not limiter.admit("alpha", 100).allowed  # 300 tokens/min each: 50 left
    limiter.set_share(1.0)
    clock.now = 200.0
    assert limiter.admit("alpha", 600).allowed
