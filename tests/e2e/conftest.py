"""One live app for all tests in this package: `serve run` on the shipped
configs/local.yaml, real model."""

from __future__ import annotations

import pytest

from tests.conftest import serve_run_app


@pytest.fixture(scope="package")
def live_app():
    """Base URL (…/v1) of the running app."""
    with serve_run_app("local.yaml") as base_url:
        yield base_url
