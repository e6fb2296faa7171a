"""Which capacity type a request tries first: by priority, room, and the Spot notice window."""

from __future__ import annotations

from serve_app.capacity import ON_DEMAND, SPOT
from serve_app.capacity.chooser import CapacityChooser, CapacityState


def state(healthy: int, free: int) -> CapacityState:
    return CapacityState(healthy=healthy, free_slots=free)


def choose(snapshot: dict[str, CapacityState], priority: str, budget: int | None = 16, spot_cap: int = 1000):
    return CapacityChooser().choose(snapshot, priority, budget, spot_cap)


def test_batch_prefers_spot_while_it_has_room():
    snapshot = {ON_DEMAND: state(2, 50), SPOT: state(3, 5)}
    assert choose(snapshot, "batch") == [SPOT, ON_DEMAND]


def test_batch_moves_to_on_demand_when_spot_is_full():
    snapshot = {ON_DEMAND: state(2, 1), SPOT: state(3, 0)}
    assert choose(snapshot, "batch") == [ON_DEMAND, SPOT]


def test_realtime_prefers_headroom_and_on_demand_on_a_tie():
    assert choose({ON_DEMAND: state(2, 4), SPOT: state(3, 9)}, "realtime") == [SPOT, ON_DEMAND]
    assert choose({ON_DEMAND: state(2, 9), SPOT: state(3, 4)}, "realtime") == [ON_DEMAND, SPOT]
    assert choose({SPOT: state(3, 6), ON_DEMAND: state(2, 6)}, "realtime") == [ON_DEMAND, SPOT]


def test_empty_capacity_comes_last_even_for_batch():
    snapshot = {SPOT: state(0, 0), ON_DEMAND: state(1, 0)}
    assert choose(snapshot, "batch") == [ON_DEMAND, SPOT]
    assert choose({SPOT: state(0, 0)}, "realtime") == [SPOT]


def test_a_request_longer_than_the_spot_cap_stays_on_demand():
    snapshot = {ON_DEMAND: state(1, 0), SPOT: state(3, 40)}
    assert choose(snapshot, "batch", budget=500, spot_cap=400) == [ON_DEMAND]
    assert choose(snapshot, "batch", budget=None, spot_cap=400) == [ON_DEMAND]  # unbounded never fits
    assert choose(snapshot, "batch", budget=400, spot_cap=400) == [SPOT, ON_DEMAND]


def test_a_spot_only_pool_takes_long_requests_too():
    assert choose({SPOT: state(1, 4)}, "realtime", budget=None, spot_cap=10) == [SPOT]
