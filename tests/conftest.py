"""Shared fixtures: the repo's config files and a small in-code app config."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.config import AppConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def small_config() -> AppConfig:
    return AppConfig.model_validate(
        {
            "models": [
                {"name": "fake-a", "engine": {"model": "unused", "max_model_len": 64}},
                {"name": "fake-b", "engine": {"model": "unused", "max_model_len": 64}},
            ],
            "templates": {
                "capital": {"prompt": "What is the capital of {country}?"},
                "summarize": {"system": "Be brief about {topic}.", "prompt": "Summarize: {text}"},
            },
            "ingress": {"max_body_bytes": 4096, "gzip_min_bytes": 300, "request_timeout_s": 5},
        }
    )
