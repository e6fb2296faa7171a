"""The off-peak app for this package: `serve run configs/local-offpeak.yaml`."""

from __future__ import annotations

import pytest

from tests.conftest import serve_run_app

BIG, TINY = "smollm2-135m-instruct", "smollm2-tiny"


@pytest.fixture(scope="package")
def base_url():
    """Base URL (…/v1); probed through the tiny tier, so start-up is no demand for the big pool."""
    with serve_run_app("local-offpeak.yaml", probe_model=TINY) as url:
        yield url
