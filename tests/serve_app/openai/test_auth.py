import pytest

from serve_app.config import ApiKeyConfig
from serve_app.openai.auth import Authenticator, key_digest
from serve_app.openai.errors import APIError

KEYS = [
    ApiKeyConfig(name="alpha", sha256=key_digest("sk-alpha")),
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
