"""API-key authentication at the ingress.

Keys are compared by SHA-256 digest in constant time; the config holds digests
or the names of environment variables or files, never keys. A missing or wrong
key is a 401 before the body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from serve_app.config import ApiKeyConfig
from serve_app.openai.errors import APIError


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _read_key_file(name: str, path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"api key {name!r}: cannot read {path}: {exc.strerror}") from None
    if not text:
        raise ValueError(f"api key {name!r}: {path} is empty")
    return text


class Authenticator:
    """Maps a request's `Authorization` header to a client name, or refuses it."""

    def __init__(self, keys: list[ApiKeyConfig], environ: Mapping[str, str] = os.environ) -> None:
        self._digests: list[tuple[str, str]] = []
        for key in keys:
            if key.sha256 is not None:
                self._digests.append((key.sha256, key.name))
            elif key.file is not None:
                self._digests.append((key_digest(_read_key_file(key.name, key.file)), key.name))
            elif environ.get(key.env or ""):
                self._digests.append((key_digest(environ[key.env]), key.name))
            else:
                raise ValueError(f"api key {key.name!r}: environment variable {key.env} is not set")

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def client(self, authorization: str | None) -> str | None:
        """The client name for a valid key; None when authentication is off."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        digest = key_digest(token.strip())
        matches = [name for known, name in self._digests if hmac.compare_digest(known, digest)]
        if not matches:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")
        return matches[0]
