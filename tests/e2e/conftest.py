"""One live app for all tests in this package: `serve run` on the shipped
configs/local.yaml, real model."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import serve_run_app

STEADY_S = 1.5
"""A one-token completion answering within this, twice in a row, means the app is past its start."""


def wait_until_steady(base_url: str, timeout_s: float = 120) -> float:
    """Returns (seconds waited) once the app answers promptly. Right after `serve run` first
    answers, the replica is still moving Ray's threads off the engine's cores and Ray's own
    agents are starting; a CI run saw Serve's proxy hold finished responses for 5 s then."""
    started = time.monotonic()
    prompt = {"prompt": "Hi", "max_tokens": 1}
    in_a_row = 0
    with httpx.Client(base_url=base_url, timeout=60) as http:
        while in_a_row < 2:
            assert time.monotonic() - started < timeout_s, f"no prompt answer within {timeout_s}s"
            sent = time.monotonic()
            answered = http.post("/completions", json=prompt).status_code == 200
            in_a_row = in_a_row + 1 if answered and time.monotonic() - sent < STEADY_S else 0
    return time.monotonic() - started


@pytest.fixture(scope="package")
def live_app():
    """Base URL (…/v1) of the running app, once it answers promptly."""
    with serve_run_app("local.yaml") as base_url:
        print(f"[e2e] steady after {wait_until_steady(base_url):.1f}s more")
        yield base_url
