"""One live app for all tests in this package: `serve run` on the shipped
configs/local.yaml (only the HTTP port moved to a free one), real model. It
stops when the package's tests are done, and its engine processes must be gone
before other live apps start."""

from __future__ import annotations

import os

import pytest

from benchmarks.servers import ServeRunServer
from tests.conftest import REPO, engine_processes, wait_until


@pytest.fixture(scope="package")
def live_app():
    """Base URL (…/v1) of the running app."""
    server = ServeRunServer(
        REPO / "configs" / "local.yaml",
        cwd=REPO,
        startup_timeout_s=float(os.environ.get("E2E_STARTUP_TIMEOUT_S", "420")),
    )
    seconds = server.start()
    print(f"\n[e2e] serve run answering after {seconds:.0f}s on :{server.port} (log: {server.log_path})")
    try:
        yield server.base_url
    finally:
        server.stop()
        assert wait_until(lambda: not engine_processes(), 60), f"vLLM processes left behind: {engine_processes()}"
