"""The shipped app with length awareness off for this package: `serve run configs/local-nobuckets.yaml`."""

from __future__ import annotations

import pytest

from tests.conftest import serve_run_app, wait_until_steady


@pytest.fixture(scope="package")
def nobuckets_app():
    """Base URL (…/v1) of the app without length awareness, once it answers promptly."""
    with serve_run_app("local-nobuckets.yaml") as base_url:
        print(f"[e2e] steady after {wait_until_steady(base_url):.1f}s more")
        yield base_url
