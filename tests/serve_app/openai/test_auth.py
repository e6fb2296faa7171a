import pytest

from serve_app.config import ApiKeyConfig
from serve_app.openai.auth import Authenticator, key_digest
from serve_app.openai.errors import APIError
from serve_app.scheduling.rate_limit import RateLimiter

KEYS = [
    ApiKeyConfig(name="alpha", sha256=key_digest("sk-alpha"), requests_per_s=2, tokens_per_min=600),
    ApiKeyConfig(name="beta", env="BETA_KEY"),
]


def test_keys_by_digest_or_environment_and_401_otherwise():
    auth = Authenticator(KEYS, environ={"BETA_KEY": "sk-beta"})
    assert auth.client("Bearer sk-alpha") == "alpha" and auth.client("bearer  sk-beta") == "beta"
    for header in (None, "sk-alpha", "Bearer ", "Bearer sk-wrong", "Basic sk-alpha"):
        with pytest.raises(APIError) as refused:
            auth.client(header)
        assert refused.value.status == 401 and refused.value.code == "invalid_api_key"


def test_no_keys_means_no_authentication_and_a_missing_env_key_fails_at_start():
    assert Authenticator([]).client(None) is None
    with pytest.raises(ValueError, match="BETA_KEY"):
        Authenticator(KEYS, environ={})


def test_a_key_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        ApiKeyConfig(name="x")


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_request_rate_bucket_allows_a_burst_then_says_when_to_retry():
    clock = Clock()
    limiter = RateLimiter(KEYS, clock)
    assert limiter.admit("alpha", 1).allowed and limiter.admit("alpha", 1).allowed
    refused = limiter.admit("alpha", 1)
    assert not refused.allowed and refused.retry_after_s == 1 and "requests/s" in refused.reason
    clock.now = 0.5
    assert limiter.admit("alpha", 1).allowed
    assert limiter.admit("beta", 10**6).allowed  # no limits configured


def test_token_bucket_charges_estimates_and_settles_actuals():
    clock = Clock()
    limiter = RateLimiter(KEYS, clock)
    assert limiter.admit("alpha", 500).allowed
    refused = limiter.admit("alpha", 200)
    assert not refused.allowed and "tokens/min" in refused.reason
    assert refused.retry_after_s == 10  # 100 tokens missing at 10 tokens/s
    limiter.settle("alpha", 500, 50)  # it used far less than estimated
    assert limiter.admit("alpha", 200).allowed
