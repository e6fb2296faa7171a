"""The saturation run of tests/e2e/test_batching_e2e.py on the same app with length
awareness off: short requests wait behind the long ones, so the check the
length-aware app passes fails here."""

from __future__ import annotations

import pytest

from tests.e2e.saturation import SLOTS, run_saturated, shorts_skip_the_queue

pytestmark = pytest.mark.e2e


def test_without_length_awareness_short_answers_wait_behind_long_ones(nobuckets_app):
    run = run_saturated(nobuckets_app, reserve=False)
    print(f"\n[e2e] length awareness off: {run.describe()}")
    states = run.pool_states
    assert max(pool["waiting"] for pool in states) > 0  # the same saturation as the length-aware run
    assert all(pool["long_cap"] == SLOTS for pool in states)  # no reserve: long requests may take every slot
    assert not shorts_skip_the_queue(run)
