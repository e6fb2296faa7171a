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


def test_a_key_from_a_file_ignores_surrounding_whitespace_and_a_missing_or_empty_file_fails_at_start(tmp_path):
    path = tmp_path / "GAMMA_KEY"
    path.write_text("sk-gamma\n")
    auth = Authenticator([ApiKeyConfig(name="gamma", file=str(path))], environ={})
    assert auth.client("Bearer sk-gamma") == "gamma"
    with pytest.raises(APIError):
        auth.client("Bearer sk-gamm")
    path.write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        Authenticator([ApiKeyConfig(name="gamma", file=str(path))])
    with pytest.raises(ValueError, match="cannot read"):
        Authenticator([ApiKeyConfig(name="gamma", file=str(tmp_path / "absent"))])


def test_a_key_file_path_is_absolute_and_excludes_the_other_sources():
    with pytest.raises(ValueError, match="pattern"):
        ApiKeyConfig(name="x", file="relative/key")
    with pytest.raises(ValueError, match="exactly one"):
        ApiKeyConfig(name="x", env="X_KEY", file="/etc/x")
