"""Shared fixtures: the repo's config files and a small in-code app config."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.config import AppConfig

REPO = Path(__file__).resolve().parent.parent

CAPITAL_QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
"""A question the real model answers "Paris" greedily in float32 and bfloat16 alike. For the
bare "What is the capital of France?" its top two first tokens ("The", "L") are 0.10 nats
apart in float32, and vLLM's bfloat16 (native AMX or emulated) answers "L'Étoile, la
Marseillaise, ..."; with "Answer in one sentence." the margin is 1.5 nats."""


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


def engine_processes() -> list[str]:
    """Command lines of vLLM engine processes running on this machine."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "name"]):
        line = " ".join(process.info["cmdline"] or []) or (process.info["name"] or "")
        if "EngineCore" in line or "VLLM::Worker" in line:
            found.append(line[:120])
    return found


def wait_until(condition, timeout_s: float, poll_s: float = 0.5) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())
