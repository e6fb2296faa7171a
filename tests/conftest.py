"""Shared fixtures: the repo's config files, a small in-code app config, and a live
`serve run` app for a package of end-to-end tests."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from serve_app.config import AppConfig

REPO = Path(__file__).resolve().parent.parent
LOCAL_MODEL = REPO / "models" / "SmolLM2-135M-Instruct"
"""The real tiny model `make setup` prepares: the in-process tests' frontends use its
tokenizer and chat template, their fake engines its token ids."""

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
                {"name": "fake-a", "engine": {"model": str(LOCAL_MODEL), "max_model_len": 128}},
                {"name": "fake-b", "engine": {"model": str(LOCAL_MODEL), "max_model_len": 128}},
            ],
            "templates": {
                "capital": {"prompt": "What is the capital of {country}?"},
                "summarize": {"system": "Be brief about {topic}.", "prompt": "Summarize: {text}"},
            },
            "ingress": {"max_body_bytes": 4096, "gzip_min_bytes": 900, "request_timeout_s": 5},
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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


@contextmanager
def serve_run_app(config: str, probe_model: str | None = None) -> Iterator[str]:
    """`serve run` on a shipped config (only the HTTP port moved to a free one) until
    the block ends; yields the base URL (.../v1). Once it is stopped no vLLM process
    may be left, so the next package starts on a quiet machine. Enter it from a
    package-scoped fixture in that package's conftest.py: pytest tears one down at the
    package's end only there (one defined in a test module lives to the session's end)."""
    from benchmarks.provenance import measured_on
    from benchmarks.servers import ServeRunServer

    server = ServeRunServer(REPO / "configs" / config, cwd=REPO,
                            startup_timeout_s=float(os.environ.get("E2E_STARTUP_TIMEOUT_S", "420")))
    if probe_model is not None:
        server.model_name = probe_model
    print(f"\n[{config}] on {measured_on()}; load average {os.getloadavg()[0]:.1f} before it starts")
    print(f"[{config}] serve run answering after {server.start():.0f}s on :{server.port} (log: {server.log_path})")
    try:
        yield server.base_url
    finally:
        server.stop()
        assert wait_until(lambda: not engine_processes(), 60), f"vLLM processes left behind: {engine_processes()}"


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
