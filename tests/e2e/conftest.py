"""One live app for all tests in this package: `serve run` on the shipped
configs/local.yaml, real model."""

from __future__ import annotations

import pytest

from tests.conftest import serve_run_app, wait_until_steady


@pytest.fixture(scope="package")
def live_app():
    """Base URL (…/v1) of the running app, once it answers promptly."""
    with serve_run_app("local.yaml") as base_url:
        print(f"[e2e] steady after {wait_until_steady(base_url):.1f}s more")
        yield base_url
